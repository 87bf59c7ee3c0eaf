"""Pre-quantized copies of a tiny HF checkpoint, written the way each format stores them (tensor
names, scale shapes, config.json's quantization_config), for the loader's tests."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from atom_aot.ops.fp8 import FP8_DTYPE, FP8_MAX, quantize_weight_blocks, quantize_weight_per_channel

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INPUT_AMAX = 6.0       # the static activation scale the "calibration" of these checkpoints found

# format -> (quantization_config (None: compressed-tensors'), weight layout, scale tensor name, static input scale)
FORMATS = {
    "fp8-tensor-dynamic": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "tensor", "weight_scale", False),
    "fp8-tensor-static": ({"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]},
                          "tensor", "weight_scale", True),
    "fp8-block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
                  "block", "weight_scale_inv", False),
    "fbgemm_fp8": ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                    "modules_to_not_convert": ["lm_head"]}, "channel", "weight_scale", False),
    "ct-channel-dynamic": (None, "channel", "weight_scale", False),
    "ct-tensor-static": (None, "tensor", "weight_scale", True),
    "ct-block": (None, "block", "weight_scale", False),
}


def compressed_tensors_config(weights: str, static: bool) -> dict:
    w = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": weights}
    if weights == "block":
        w["block_structure"] = [128, 128]
    act_strategy = "tensor" if static else ("group" if weights == "block" else "token")
    a = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static, "strategy": act_strategy}
    if weights == "block":
        a["group_size"] = 128
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": a}}}


def quantize_per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.float().abs().amax() / FP8_MAX                          # 0-d
    return (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def _quantized(w: torch.Tensor, layout: str, scale_name: str, fmt: str) -> dict[str, torch.Tensor]:
    if layout == "tensor":
        q, scale = quantize_per_tensor(w)
        scale = scale.reshape(1) if fmt.startswith("ct-") else scale  # compressed-tensors: [1]; AutoFP8: 0-d
    elif layout == "channel":
        q, scale = quantize_weight_per_channel(w)
        scale = scale[:, None]                                        # both store [N, 1]
    else:
        q, scale = quantize_weight_blocks(w)
    return {"weight": q, scale_name: scale}


def write_prequantized(src: Path, dst: Path, fmt: str) -> Path:
    """`src` (an unquantized HF folder) saved as `fmt`; returns `dst`."""
    qc, layout, scale_name, static = FORMATS[fmt]
    if qc is None:
        qc = compressed_tensors_config(layout, static)

    def quantize(linear: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        out = _quantized(w, layout, scale_name, fmt)
        if static:
            out["input_scale"] = torch.tensor(INPUT_AMAX / FP8_MAX)
        return out
    return rewrite_linears(src, dst, qc, quantize)


def rewrite_linears(src: Path, dst: Path, qc: dict, quantize) -> Path:
    """`src` copied to `dst` with config.json's quantization_config `qc` and each decoder linear's
    weight replaced by `quantize(linear name, weight)`'s tensors (leaf name -> tensor); returns `dst`."""
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        f.unlink()
    out = {}
    for name, tensor in load_file(str(next(src.glob("*.safetensors")))).items():
        module, _, leaf = name.rpartition(".")
        linear = module.split(".")[-1]
        if leaf == "weight" and linear in LINEARS:
            out.update({f"{module}.{k}": v for k, v in quantize(linear, tensor).items()})
        else:
            out[name] = tensor
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    return dst
