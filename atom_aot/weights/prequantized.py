"""A pre-quantized checkpoint's tensors -> its scheme's runtime layout (quant_layers.py), as stored.

The FP8 and int8 weights are kept bit for bit; only the scales change shape:
- `weight_scale_inv` (fp8, DeepSeek-V3 style; multiplied like any scale) is renamed `weight_scale`;
- a per-tensor weight scale becomes per-channel (its value on every row of the weight: exact), so the
  parts of a fused qkv / gate_up keep their own scales after concatenation;
- [N, 1] scales become [N]; 128x128 block scales stay [ceil(N/128), ceil(K/128)] and concatenate
  along N (each fused part must then fill whole blocks, which the shape check after fusion enforces);
- static input scales of fused parts (one input feeds them all) become their maximum: the coarsest
  of them, so no part's activations clip. Dynamic schemes do not read input scales;
- fbgemm_fp8's `activation_scale_ub` (config.json) becomes every quantized linear's `activation_scale_ub`;
- compressed-tensors' zero points of symmetric int8 (`weight_zero_point`, `input_zero_point`, all 0
  where a checkpoint stores them) are dropped; a nonzero one is refused by name.
GPTQ / AWQ int4 checkpoints are repacked nibble for nibble by int4_checkpoint.py.
lm_head stays in the model dtype (it decides the argmax): a checkpoint that quantized it anyway has it
dequantized (weight x scale). So does MLA's kv_b_proj, which the build splits into the per-head W_UK / W_UV
that the absorbed decode multiplies in the model dtype (models/mla.py).
"""
from __future__ import annotations

import torch

from atom_aot.errors import BuildError
from atom_aot.models.quant_layers import INT4_SCHEMES, INT8_SCHEMES
from atom_aot.ops.fp8 import dequantize_weight
from atom_aot.weights.int4_checkpoint import normalize_int4_checkpoint
from atom_aot.weights.quant_config import CheckpointQuant

WEIGHT_SCALE_NAMES = ("weight_scale", "weight_scale_inv")
ZERO_POINT_NAMES = ("weight_zero_point", "input_zero_point")
STATIC_SCHEMES = ("fp8-static", "int8-static")     # the ones that read a checkpoint's input_scale
UNQUANTIZED_MODULES = ("lm_head", "kv_b_proj")    # run in the model dtype whatever the checkpoint did
FP8_DTYPE = torch.float8_e4m3fn
QUANTIZED_DTYPES = (FP8_DTYPE, torch.int8)


def weight_dtype(quant: CheckpointQuant) -> torch.dtype:
    return torch.int8 if quant.scheme in INT8_SCHEMES else FP8_DTYPE


def normalize_checkpoint(tensors: dict[str, torch.Tensor], quant: CheckpointQuant) -> dict[str, torch.Tensor]:
    """Checkpoint names and scale shapes -> the runtime's, before the fusion of q/k/v and gate/up."""
    if quant.scheme in INT4_SCHEMES:
        return normalize_int4_checkpoint(tensors, quant)
    out = {}
    for name, tensor in tensors.items():
        module, _, leaf = name.rpartition(".")
        if module.rpartition(".")[2] in UNQUANTIZED_MODULES:
            if leaf == "weight":
                out[name] = _unquantized_weight(module, tensors, quant)
        elif leaf in WEIGHT_SCALE_NAMES:
            out[f"{module}.weight_scale"] = _weight_scale(name, tensor, tensors[f"{module}.weight"], quant)
        elif leaf == "input_scale":
            if quant.scheme in STATIC_SCHEMES:
                out[name] = tensor.float().reshape(1)
        elif leaf in ZERO_POINT_NAMES:
            if tensor.count_nonzero():
                raise BuildError(f"{name} is nonzero: asymmetric quantization (zero points) is not supported "
                                 f"by atom-aot's {quant.scheme}, which is symmetric")
        else:
            out[name] = tensor
    return out


def _unquantized_weight(module: str, tensors: dict[str, torch.Tensor], quant: CheckpointQuant) -> torch.Tensor:
    weight = tensors[f"{module}.weight"]
    scale_name = next((f"{module}.{n}" for n in WEIGHT_SCALE_NAMES if f"{module}.{n}" in tensors), None)
    if weight.dtype not in QUANTIZED_DTYPES or scale_name is None:
        return weight
    return dequantize_weight(weight, _weight_scale(scale_name, tensors[scale_name], weight, quant))


def _weight_scale(name: str, scale: torch.Tensor, weight: torch.Tensor, quant: CheckpointQuant) -> torch.Tensor:
    if weight.dtype != weight_dtype(quant):
        raise BuildError(f"{name} scales a {weight.dtype} weight; the {quant.method} {quant.scheme} loader reads "
                         f"{weight_dtype(quant)} weights only")
    scale = scale.float()
    if quant.scheme == "fp8-block":
        return scale
    if scale.numel() == 1:
        return scale.reshape(1).expand(weight.shape[0]).contiguous()      # per-tensor -> [N]
    return scale.reshape(weight.shape[0])                                 # [N, 1] or [N] -> [N]


def finish_fused(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                 quant: CheckpointQuant) -> dict[str, torch.Tensor]:
    """After fusion: one static input scale per fused linear, and every linear the model quantizes
    has its scale (a layer on the checkpoint's ignore list arrives unquantized: refused by name)."""
    unquantized = sorted(n.removesuffix(".weight_scale") for n in expected
                         if n.endswith(".weight_scale") and n not in state)
    if unquantized:
        raise BuildError(f"the checkpoint leaves {len(unquantized)} decoder linears unquantized "
                         f"({', '.join(unquantized[:3])}{'...' if len(unquantized) > 3 else ''}; its ignore list: "
                         f"{list(quant.ignored)}). atom-aot runs every decoder linear in one scheme; only lm_head "
                         f"and embeddings (never quantized here) may be ignored.")
    out = {name: tensor.amax().reshape(1) if name.endswith(".input_scale") else tensor
           for name, tensor in state.items()}
    if quant.activation_scale_ub is not None:        # fbgemm_fp8: the config's bound, on every quantized linear
        bound = torch.tensor([quant.activation_scale_ub], dtype=torch.float32)
        out.update({name: bound.clone() for name in expected if name.endswith(".activation_scale_ub")})
    return out
