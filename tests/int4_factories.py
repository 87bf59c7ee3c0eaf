"""GPTQ and AWQ 4-bit copies of a tiny HF checkpoint, packed here by hand (word by word, nibble by
nibble: independent of atom_aot/weights/int4_checkpoint.py's vectorized unpacking), from known int4
values, fp16 scales and zero points; and the twin checkpoint holding the dequantized weights.

The int4 values come from round-to-nearest asymmetric quantization of the tiny model's weights, so the
quantized model is still a model; what the tests check is exactness, not quantization quality.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from prequantized_factories import rewrite_linears

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)      # nibble p of an AWQ word holds column 8i + AWQ_ORDER[p]


@dataclass(frozen=True)
class Int4Values:
    """What a linear stores, unpacked: w = (q - z) * s per group of `group` inputs."""
    q: torch.Tensor          # [N, K] int64, 0..15
    zero: torch.Tensor       # [N, G] int64, 1..15 (GPTQ v1 stores zero - 1: 0 would wrap)
    scale: torch.Tensor      # [N, G] float16

    @property
    def group(self) -> int:
        return self.q.shape[1] // self.scale.shape[1]

    def dequantized(self) -> torch.Tensor:
        """w [N, K] float32, exact (5-bit integers times fp16 scales)."""
        g = self.group
        return ((self.q - self.zero.repeat_interleave(g, 1)).float()
                * self.scale.float().repeat_interleave(g, 1))


def quantize_rtn(w: torch.Tensor, group: int) -> Int4Values:
    """Round-to-nearest asymmetric int4 of w [N, K] in groups of `group` inputs (-1: the whole row)."""
    n, k = w.shape
    g = k if group == -1 else group
    wg = w.float().reshape(n, k // g, g)
    lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-4).half()                             # [N, G]
    zero = torch.round(-lo / scale.float()).clamp(1, 15).long()                  # [N, G]
    q = torch.round(wg / scale.float()[..., None]) + zero[..., None]
    return Int4Values(q.clamp(0, 15).long().reshape(n, k), zero, scale)


def _pack_words(nibbles: list[list[int]]) -> int:
    """8 nibbles -> one int32 (two's complement), nibble p in bits 4p..4p+3."""
    word = sum(v << (4 * p) for p, v in enumerate(nibbles))
    return word - (1 << 32) if word >= 1 << 31 else word


def pack_gptq(v: Int4Values, zero_offset: int = 1) -> dict[str, torch.Tensor]:
    """qweight [K/8, N] (8 nibbles along K), qzeros [G, N/8] (zero - offset along N), scales [G, N], g_idx [K]."""
    q, z = v.q.T.tolist(), (v.zero.T - zero_offset).tolist()                   # [K][N], [G][N]
    k, n = len(q), len(q[0])
    qweight = [[_pack_words([q[8 * i + p][c] for p in range(8)]) for c in range(n)] for i in range(k // 8)]
    qzeros = [[_pack_words([z[g][8 * i + p] for p in range(8)]) for i in range(n // 8)] for g in range(len(z))]
    return {"qweight": torch.tensor(qweight, dtype=torch.int32), "qzeros": torch.tensor(qzeros, dtype=torch.int32),
            "scales": v.scale.T.contiguous(), "g_idx": (torch.arange(k) // v.group).to(torch.int32)}


def pack_awq(v: Int4Values) -> dict[str, torch.Tensor]:
    """qweight [K, N/8] and qzeros [G, N/8] with AWQ's interleaved nibble order, scales [G, N]."""
    q, z = v.q.T.tolist(), v.zero.T.tolist()                                    # [K][N], [G][N]

    def words(rows):
        return [[_pack_words([row[8 * i + AWQ_ORDER[p]] for p in range(8)]) for i in range(len(row) // 8)]
                for row in rows]
    return {"qweight": torch.tensor(words(q), dtype=torch.int32), "qzeros": torch.tensor(words(z), dtype=torch.int32),
            "scales": v.scale.T.contiguous()}


def gptq_config(group: int = 128, **fields) -> dict:
    return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False,
            "damp_percent": 0.01, "true_sequential": True, "checkpoint_format": "gptq", **fields}


def awq_config(**fields) -> dict:
    return {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None, **fields}


def write_int4(src: Path, dst: Path, fmt: str) -> Path:
    """`src` saved as fmt: gptq (group 128), gptq-channel (group -1), awq, or dequantized / dequantized-channel
    (float32 weights equal to what gptq / gptq-channel encode, no quantization_config)."""
    group = -1 if fmt.endswith("-channel") else 128

    def quantize(linear: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        v = quantize_rtn(w, group)
        if fmt.startswith("dequantized"):
            return {"weight": v.dequantized()}
        return pack_awq(v) if fmt == "awq" else pack_gptq(v)
    qc = {"gptq": gptq_config(), "gptq-channel": gptq_config(-1), "awq": awq_config()}.get(fmt)
    return rewrite_linears(src, dst, qc, quantize)
