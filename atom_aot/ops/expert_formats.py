"""How one MoE layer's stacked experts are stored: the typed formats the `fused_moe` op (ops/moe.py) dispatches on.

A format fixes the stacks' dtypes and shapes, so a model declares its experts' parameters from it and hands them
to the op without knowing which it is; the op tells them apart by their dtypes (`format_of`). For E experts of
width I (per rank) and hidden size H:

    format       w13                w2                w13_scale              w2_scale
    model-dtype  [E, 2I, H] dtype   [E, H, I] dtype   -                      -
    fp8-row      [E, 2I, H] e4m3    [E, H, I] e4m3    [E, 2I] float32        [E, H] float32
    fp8-block    [E, 2I, H] e4m3    [E, H, I] e4m3    [E, 2I/128, H/128] f32 [E, H/128, I/128] float32
    mxfp4        [E, 2I, H/2] uint8 [E, H, I/2] uint8 [E, 2I, H/32] uint8    [E, H, I/32] uint8   (ops/mxfp4.py)

Any format may carry biases, `w13_bias [E, 2I]` and `w2_bias [E, H]` in float32 (GPT-OSS's experts have them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_aot.errors import BuildError
from atom_aot.ops.fp8 import BLOCK as FP8_BLOCK, FP8_DTYPE
from atom_aot.ops.mxfp4 import BLOCK as MXFP4_BLOCK

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ExpertFormat:
    name: str                          # artifact/manifest.py EXPERT_FORMAT_TEXT's key
    weight_dtype: torch.dtype | None   # None: the model dtype
    values_per_byte: int               # along K (the last dimension): 2 for packed e2m1
    scale: str                         # none | row | block (fp8's 128x128) | mxfp4 (one uint8 per 32 along K)

    def stack_shapes(self, experts: int, width: int, hidden: int) -> dict[str, Shape]:
        """Parameter name -> shape, for `experts` experts of width `width` (this rank's) and hidden size `hidden`."""
        self.check_widths(width, hidden)
        shapes = {"w13": (experts, 2 * width, hidden // self.values_per_byte),
                  "w2": (experts, hidden, width // self.values_per_byte)}
        if self.scale == "row":
            shapes |= {"w13_scale": (experts, 2 * width), "w2_scale": (experts, hidden)}
        elif self.scale == "block":
            shapes |= {"w13_scale": (experts, 2 * width // FP8_BLOCK, -(-hidden // FP8_BLOCK)),
                       "w2_scale": (experts, -(-hidden // FP8_BLOCK), width // FP8_BLOCK)}
        elif self.scale == "mxfp4":
            shapes |= {"w13_scale": (experts, 2 * width, hidden // MXFP4_BLOCK),
                       "w2_scale": (experts, hidden, width // MXFP4_BLOCK)}
        return shapes

    def stack_dtype(self, name: str, model_dtype: torch.dtype) -> torch.dtype:
        if name.endswith("_bias"):
            return torch.float32
        if name.endswith("_scale"):
            return torch.uint8 if self.scale == "mxfp4" else torch.float32
        return self.weight_dtype or model_dtype

    def check_widths(self, width: int, hidden: int) -> None:
        """A BuildError where the expert width (this rank's) or the hidden size does not fill whole scale blocks."""
        if self.scale == "block" and width % FP8_BLOCK:
            raise BuildError(f"block-scaled fp8 experts need an expert width that fills whole 128-row blocks (gate "
                             f"and up are stacked), and this rank's is {width}")
        if self.scale == "mxfp4" and (width % MXFP4_BLOCK or hidden % MXFP4_BLOCK):
            raise BuildError(f"mxfp4 experts scale each {MXFP4_BLOCK} values along K, so the hidden size ({hidden}) "
                             f"and this rank's expert width ({width}) must be multiples of {MXFP4_BLOCK}; under -tp, "
                             f"--ep keeps every expert whole")


FORMATS = {f.name: f for f in (
    ExpertFormat("model-dtype", None, 1, "none"),
    ExpertFormat("fp8-row", FP8_DTYPE, 1, "row"),
    ExpertFormat("fp8-block", FP8_DTYPE, 1, "block"),
    ExpertFormat("mxfp4", torch.uint8, 2, "mxfp4"),
)}


def format_of(w13: torch.Tensor, w13_scale: torch.Tensor | None) -> ExpertFormat:
    """The format of stacks as the op receives them (their dtypes and the scales' rank say it)."""
    if w13_scale is None:
        if w13.element_size() == 1:
            raise ValueError(f"fused_moe: {w13.dtype} experts need their scales (w13_scale, w2_scale)")
        return FORMATS["model-dtype"]
    if w13.dtype == torch.uint8:
        if w13_scale.dtype != torch.uint8:
            raise ValueError(f"fused_moe: mxfp4 experts (uint8 w13) take uint8 e8m0 scales, got {w13_scale.dtype}")
        return FORMATS["mxfp4"]
    if w13.dtype != FP8_DTYPE:
        raise ValueError(f"fused_moe: scales come with e4m3 or mxfp4 (uint8) experts, got {w13.dtype}")
    return FORMATS["fp8-block" if w13_scale.dim() == 3 else "fp8-row"]
