"""Per-expert checkpoint tensors -> one stacked parameter per layer and projection, as they stream in.

A checkpoint stores `<block>.experts.<e>.<proj>.weight` per expert; the runtime holds
`<block>.experts.w13 [E, 2I, H]` and `<block>.experts.w2 [E, H, I]` (atom_aot/ops/moe.py). The model
class's EXPERT_MODULES says which projection fills which part of which stacked parameter. Each
stacked tensor is allocated once, in the runtime's dtype, when its first part arrives; every part
is copied into its slice and dropped, so the build never holds a second copy of the experts.
A checkpoint written from transformers 5's modules (scripts/make_random_model.py) already stores the
stacked `<block>.experts.gate_up_proj [E, 2I, H]` and `down_proj [E, H, I]`: the same layout, taken whole.
A pre-quantized checkpoint's per-expert `weight_scale` (per row, after prequantized.py's normalization)
is stacked the same way into `w13_scale [E, 2I]` / `w2_scale [E, H]`, where the model has fp8 experts.
An mxfp4 checkpoint (GPT-OSS) stores the stacks as `<block>.experts.gate_up_proj_blocks [E, 2I, H/32, 16]` and
`_scales [E, 2I, H/32]` (down_proj's likewise), taken whole as `w13 [E, 2I, H/2]` and `w13_scale` (ops/mxfp4.py),
and its experts' biases `gate_up_proj_bias [E, 2I]` / `down_proj_bias [E, H]` as `w13_bias` / `w2_bias`. A family
whose checkpoint orders gate and up rows otherwise (GPT-OSS interleaves them) reorders them in its model class's
adapt_checkpoint: a row permutation, of the blocks, scales and biases alike.
"""
from __future__ import annotations

import re

import torch

from atom_aot.errors import BuildError
from atom_aot.models.config import ModelConfig
from atom_aot.models.moe import expert_format
from atom_aot.models.parallel import Split, rank_shapes

EXPERT_TENSOR = re.compile(r"(?P<block>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>[^.]+)\.(?P<leaf>weight|weight_scale)")
STACK_SUFFIX = {"weight": "", "weight_scale": "_scale"}       # the stacked parameter of each per-expert leaf
STACKED_TENSOR = re.compile(r"(?P<block>.+\.experts)\.(?P<proj>gate_up_proj|down_proj)(?P<leaf>|_blocks|_scales|_bias)")
STACKED_NAMES = {"gate_up_proj": "w13", "down_proj": "w2"}     # transformers 5's stacked names -> ours
STACKED_LEAVES = {"": "", "_blocks": "", "_scales": "_scale", "_bias": "_bias"}   # -> our parameter's suffix


class ExpertStacker:
    def __init__(self, mapping: dict[str, tuple[str, int]], expected: dict[str, torch.Tensor]):
        self.mapping = mapping                  # checkpoint projection -> (stacked parameter, part)
        self.expected = expected                # the meta model's state dict: shapes and dtypes
        self.num_parts = {param: 1 + max(i for p, i in mapping.values() if p == param) for param, _ in mapping.values()}
        self.filling: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}   # name -> (stack, [E, parts] bool: arrived)
        self.complete: dict[str, torch.Tensor] = {}

    def add(self, name: str, tensor: torch.Tensor) -> bool:
        """Copies `tensor` into its stack if it is an expert's projection this model stacks; False if not."""
        stacked = STACKED_TENSOR.fullmatch(name)
        if stacked is not None:
            target = f"{stacked['block']}.{STACKED_NAMES[stacked['proj']]}{STACKED_LEAVES[stacked['leaf']]}"
            if target not in self.expected:
                return False
            self.complete[target] = _stack_as_stored(name, stacked["leaf"], tensor, self.expected[target])
            return True
        match = EXPERT_TENSOR.fullmatch(name)
        if match is None or match["proj"] not in self.mapping:
            return False
        param, part = self.mapping[match["proj"]]
        target = f"{match['block']}.{param}{STACK_SUFFIX[match['leaf']]}"
        if target not in self.expected:
            return False
        if tensor.element_size() == 1 and self.expected[target].element_size() != 1:
            raise ValueError(f"{name} is stored quantized ({str(tensor.dtype).removeprefix('torch.')}), and this "
                             f"model keeps its experts in {str(self.expected[target].dtype).removeprefix('torch.')}: "
                             f"quantized experts are read only from fp8 checkpoints with per-row or per-tensor weight "
                             f"scales and dynamic activations (fp8, fbgemm_fp8, compressed-tensors), not yet from "
                             f"block-scaled (128x128) or static ones; atom-build --quant fp8 quantizes a bf16 "
                             f"checkpoint's experts itself")
        stack, arrived = self.filling.get(target) or self._start(target, param, tensor)
        expert = int(match["expert"])
        rows = stack.shape[1] // self.num_parts[param]
        if expert >= stack.shape[0] or tuple(tensor.shape) != (rows, *stack.shape[2:]) or arrived[expert, part]:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not fit expert {expert} of {target} "
                             f"{tuple(stack.shape)} (expected {[rows, *stack.shape[2:]]} once per expert)")
        stack[expert, part * rows:(part + 1) * rows].copy_(tensor)
        arrived[expert, part] = True
        if bool(arrived.all()):
            self.complete[target] = self.filling.pop(target)[0]
        return True

    def _start(self, target: str, param: str, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The stack goes where its parts come from (the device, when weights are drawn at load), in the
        runtime's dtype; an e4m3 stack filled from unquantized parts stays in theirs until the build
        quantizes it (weights/convert.py), so nothing is rounded twice."""
        meta = self.expected[target]
        dtype = first.dtype if meta.dtype.itemsize == 1 and first.dtype.itemsize != 1 else meta.dtype
        entry = (torch.empty(meta.shape, dtype=dtype, device=first.device),
                 torch.zeros(meta.shape[0], self.num_parts[param], dtype=torch.bool))
        self.filling[target] = entry
        return entry

    def take_complete(self) -> list[tuple[str, torch.Tensor]]:
        """The stacks finished so far, handed over once (the caller streams them on)."""
        done, self.complete = list(self.complete.items()), {}
        return done

    @property
    def incomplete(self) -> list[str]:
        return sorted(self.filling)


def _stack_as_stored(name: str, leaf: str, tensor: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """A whole stacked tensor of the checkpoint as the model stores it: mxfp4 blocks [E, N, K/32, 16] as the
    packed [E, N, K/2]; a ValueError where the checkpoint's storage is not the model's (unquantized experts for an
    mxfp4 model, mxfp4 blocks for one whose config does not say mxfp4)."""
    packed = meta.dtype == torch.uint8 and not name.endswith("_bias")
    if leaf == "_blocks" and not packed:
        raise ValueError(f"{name} stores the experts in mxfp4 blocks, and the checkpoint's config.json does not "
                         f"say so (quantization_config with quant_method mxfp4): this model keeps its experts in "
                         f"{str(meta.dtype).removeprefix('torch.')}")
    if packed and (tensor.dtype != torch.uint8 or leaf == ""):
        raise ValueError(f"{name} is stored unquantized ({str(tensor.dtype).removeprefix('torch.')}), and this "
                         f"model keeps every layer's experts in mxfp4 (the checkpoint's quantization_config): "
                         f"unquantized experts (a checkpoint mixing both; --load-format dummy's random weights) are "
                         f"not read as mxfp4")
    return tensor.flatten(-2) if leaf == "_blocks" else tensor


def check_expert_only_model(cfg: ModelConfig, split: Split, scheme: str, dtype: torch.dtype) -> None:
    """A BuildError unless a checkpoint whose quantization is of its experts alone (mxfp4) fits: it has experts,
    computes in bf16 or float32 (mxfp4 widens to bf16 in the kernels), and each rank's experts fill whole scale
    blocks along K."""
    if not cfg.num_experts:
        raise BuildError(f"the checkpoint's {scheme} quantization is of MoE experts, and {cfg.architecture} has "
                         f"none: nothing of it would be quantized")
    if dtype not in (torch.bfloat16, torch.float32):
        raise BuildError(f"{scheme} experts compute in bfloat16 (or float32), not {str(dtype).removeprefix('torch.')}: "
                         f"build with --dtype bfloat16")
    shard = rank_shapes(cfg, split)
    expert_format(scheme).check_widths(shard.moe_intermediate_size, shard.hidden_size)
