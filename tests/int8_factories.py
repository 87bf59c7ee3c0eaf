"""compressed-tensors W8A8 int8 copies of a tiny HF checkpoint, written the way llm-compressor stores
them (int8 `weight`, `weight_scale` [N, 1] or [1], static `input_scale` [1], zero points of 0 where
the older writers kept them), for the loader's tests."""
from __future__ import annotations

from pathlib import Path

import torch

from atom_aot.ops.int8 import quantize_weight_int8
from prequantized_factories import rewrite_linears

# static input scales differ per linear, so a fused qkv / gate_up must take their maximum
STATIC_INPUT_SCALE = {"q_proj": 0.05, "k_proj": 0.07, "v_proj": 0.03, "o_proj": 0.04,
                      "gate_proj": 0.02, "up_proj": 0.06, "down_proj": 0.08}
FORMATS = {"ct-int8-channel-dynamic": ("channel", False), "ct-int8-tensor-static": ("tensor", True)}
SCHEMES = {"ct-int8-channel-dynamic": "int8", "ct-int8-tensor-static": "int8-static"}


def int8_config(weights: str = "channel", static: bool = False, weight_fields: dict | None = None,
                activation_fields: dict | None = None, weight_only: bool = False, **top) -> dict:
    """quantization_config of a compressed-tensors W8A8 int8 checkpoint, with fields patched for the
    refusal tests (`weight_only` drops the activations)."""
    w = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False, "strategy": weights,
         **(weight_fields or {})}
    a = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": not static,
         "strategy": "tensor" if static else "token", **(activation_fields or {})}
    group = {"targets": ["Linear"], "weights": w, "input_activations": None if weight_only else a}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": group}, **top}


def quantize_int8_per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] int8, scale [1]): one symmetric scale for the whole tensor."""
    scale = (w.float().abs().amax() / 127).reshape(1)
    return torch.round(w.float() / scale).clamp(-128, 127).to(torch.int8), scale


def write_int8(src: Path, dst: Path, fmt: str) -> Path:
    layout, static = FORMATS[fmt]

    def quantize(linear: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        if layout == "channel":
            q, scale = quantize_weight_int8(w)
            return {"weight": q, "weight_scale": scale[:, None]}                   # [N, 1]
        q, scale = quantize_int8_per_tensor(w)
        zero = torch.zeros(1, dtype=torch.int8)
        return {"weight": q, "weight_scale": scale, "weight_zero_point": zero,
                "input_scale": torch.tensor([STATIC_INPUT_SCALE[linear]]), "input_zero_point": zero.clone()}
    return rewrite_linears(src, dst, int8_config(layout, static), quantize)
