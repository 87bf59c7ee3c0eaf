"""GPTQ and AWQ 4-bit checkpoints -> the int4 runtime layout (atom_aot/ops/int4.py), losslessly.

What the checkpoints store per linear (K inputs, N outputs, G = K / group_size groups):

    GPTQ  qweight int32 [K/8, N]: word [i, n] holds q[8i + p, n] in bits 4p..4p+3 (8 nibbles along K)
          qzeros  int32 [G, N/8]: word [g, i] holds z[g, 8i + p] in nibble p; format "gptq" (v1, AutoGPTQ)
                  stores z - 1 (every reader adds 1 back), "gptq_v2" (GPTQModel) stores z
          scales  fp16 [G, N]; g_idx int32 [K] = k // group_size unless act-order (refused)
    AWQ   qweight int32 [K, N/8]: word [k, i] holds the 8 columns 8i + ORDER[p] in nibble p, with AWQ's
          interleaved ORDER = [0, 2, 4, 6, 1, 3, 5, 7] (column c sits in nibble REVERSE[c])
          qzeros  int32 [G, N/8] interleaved the same way, z as is; scales fp16 [G, N]

Both become weight [N, K/2] uint8 (pack_nibbles), weight_scale [N, G] float32 (fp16/bf16 -> float32 is
exact) and weight_zero [N, G] uint8; fused qkv / gate_up then concatenate along N (dim 0) like any
weight. Nothing is dequantized: every nibble and every scale is kept.
"""
from __future__ import annotations

import torch

from atom_aot.errors import BuildError
from atom_aot.models.config import ModelConfig
from atom_aot.ops.int4 import pack_nibbles
from atom_aot.weights.quant_config import CheckpointQuant

INT4_LEAVES = ("qweight", "qzeros", "scales", "g_idx")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)       # nibble p of a word holds column 8i + AWQ_ORDER[p]
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)     # column 8i + c sits in nibble AWQ_REVERSE[c]
SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def int32_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> [R, C, 8] int32 in 0..15, nibble p = bits 4p..4p+3 (the sign bit is nibble 7's)."""
    return (packed.to(torch.int32)[..., None] >> SHIFTS) & 0xF


def gptq_to_runtime(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                    zero_offset: int) -> dict[str, torch.Tensor]:
    """qweight [K/8, N], qzeros [G, N/8], scales [G, N] -> the runtime tensors (module docstring)."""
    words, n = qweight.shape
    q = int32_nibbles(qweight).permute(0, 2, 1).reshape(8 * words, n)             # [K, N]
    zero = int32_nibbles(qzeros).reshape(qzeros.shape[0], -1) + zero_offset       # [G, N]
    return _runtime(q.T, zero.T, scales.T)


def awq_to_runtime(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """qweight [K, N/8], qzeros [G, N/8], scales [G, N] -> the runtime tensors (module docstring)."""
    reverse = list(AWQ_REVERSE)
    q = int32_nibbles(qweight)[..., reverse].reshape(qweight.shape[0], -1)        # [K, N]
    zero = int32_nibbles(qzeros)[..., reverse].reshape(qzeros.shape[0], -1)       # [G, N]
    return _runtime(q.T, zero.T, scales.T)


def _runtime(q: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    # q [N, K], zero [N, G], scale [N, G]
    if scale.shape != zero.shape or q.shape[0] != scale.shape[0] or q.shape[1] % scale.shape[1]:
        raise ValueError(f"weight [N, K] {tuple(q.shape)}, scales {tuple(scale.shape)} and zeros "
                         f"{tuple(zero.shape)} [N, G] do not fit together")
    return {"weight": pack_nibbles(q.contiguous()), "weight_scale": scale.float().contiguous(),
            "weight_zero": zero.to(torch.uint8).contiguous()}


def check_int4_model(cfg: ModelConfig, tensor_parallel_size: int) -> None:
    """What the int4 path does not cover yet, refused by name before any weight is read."""
    if cfg.num_experts:
        raise BuildError(f"{cfg.architecture}: int4 (gptq / awq) experts are not loaded yet (the fused MoE op "
                         f"has no int4 path); int4 runs on dense decoders")
    if tensor_parallel_size > 1:
        raise BuildError("int4 (gptq / awq) weights are not sharded over tensor-parallel ranks yet: build this "
                         "checkpoint with -tp 1")


def normalize_int4_checkpoint(tensors: dict[str, torch.Tensor], quant: CheckpointQuant) -> dict[str, torch.Tensor]:
    """Every quantized linear's (qweight, qzeros, scales, g_idx) -> its runtime tensors; the rest as is."""
    out = {}
    for name, tensor in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "qweight":
            out.update({f"{module}.{k}": v for k, v in _linear(module, tensors, quant).items()})
        elif leaf not in INT4_LEAVES:
            out[name] = tensor
    return out


def _linear(module: str, tensors: dict[str, torch.Tensor], quant: CheckpointQuant) -> dict[str, torch.Tensor]:
    if module.split(".")[-1] == "lm_head":
        raise BuildError(f"{module} is quantized: atom-aot runs lm_head in the model dtype (it decides the argmax)")
    try:
        qweight, qzeros, scales = (tensors[f"{module}.{leaf}"] for leaf in ("qweight", "qzeros", "scales"))
    except KeyError as e:
        raise BuildError(f"{module}: the {quant.method} checkpoint has its qweight but not {e.args[0]}") from None
    try:
        if quant.int4_packing == "awq":
            out = awq_to_runtime(qweight, qzeros, scales)
        else:
            out = gptq_to_runtime(qweight, qzeros, scales, 1 if quant.int4_packing == "gptq" else 0)
    except (ValueError, RuntimeError) as e:
        raise BuildError(f"{module}: the {quant.method} tensors' shapes do not fit: {e}") from None
    _check_groups(module, out["weight_scale"].shape[1], 2 * out["weight"].shape[1], quant,
                  tensors.get(f"{module}.g_idx"))
    return out


def _check_groups(module: str, groups: int, k: int, quant: CheckpointQuant, g_idx: torch.Tensor | None) -> None:
    """The scales' group count is the config's group size, and g_idx (if stored) is the trivial k // g."""
    size = k if quant.group_size == -1 else quant.group_size
    if groups * size != k:
        raise BuildError(f"{module}: {groups} scale groups over K={k} inputs, but the config's group_size is "
                         f"{quant.group_size}")
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(k) // size):
        raise BuildError(f"{module}.g_idx is not k // {size}: act-order (desc_act) weights, whose groups are "
                         f"permuted along K, are not supported by atom-aot")
