"""Which kernels the model calls: one row of choices per arch and phase, read from tuning.json.

The model code is the same everywhere; an arch differs only by its row (adding an arch is adding
a row). `reference` is plain torch around the `atom::paged_attention` op, for the CPU and for
checking. `triton` fuses QK-norm + RoPE + the KV-cache write into one kernel and runs paged
attention in another (atom_aot/ops/triton), with the launch configs the build measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from atom_aot.models.layers import apply_rope, rms_norm
from atom_aot.ops.attention import paged_attention

PHASES = ("mixed", "decode")   # mixed: any batch; decode: one new token per sequence


class AttentionInputs(NamedTuple):
    """What every attention layer reads for one step (see atom_aot/ops/attention.py)."""
    kv_cache: torch.Tensor         # [L, 2, num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor     # [T] int64
    block_tables: torch.Tensor     # [B, max_blocks] int32
    seq_lens: torch.Tensor         # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32


@dataclass(frozen=True)
class KernelChoices:
    attention: str = "reference"                   # "reference" | "triton"
    attention_config: tuple[int, ...] = ()         # triton: block_m, block_n, num_splits, num_warps, num_stages
    rope_cache_config: tuple[int, ...] = ()        # triton: block_h, num_warps

    @classmethod
    def from_tuning(cls, tuning: dict, phase: str) -> "KernelChoices":
        row = tuning.get("phases", {}).get(phase) or tuning.get("phases", {}).get("mixed")
        if not row:
            return cls()
        return cls(row["attention"], tuple(row.get("attention_config", ())), tuple(row.get("rope_cache_config", ())))

    def as_dict(self) -> dict:
        return {"attention": self.attention, "attention_config": list(self.attention_config),
                "rope_cache_config": list(self.rope_cache_config)}


def attention_block(kernels: KernelChoices, layer: int, positions, q, k, v, cos_sin_cache, q_norm_weight,
                    k_norm_weight, eps: float, scale: float, attn: AttentionInputs) -> torch.Tensor:
    """QK-norm (if weights are given), RoPE, KV-cache write and paged attention: out [T, H, D]."""
    if kernels.attention == "triton":
        ops = torch.ops.atom_triton
        q = ops.qk_norm_rope_cache_write(q, k, v, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps,
                                         attn.kv_cache, layer, attn.slot_mapping, *kernels.rope_cache_config)
        return ops.paged_attention(q, attn.kv_cache, layer, attn.block_tables, attn.seq_lens,
                                   attn.query_start_loc, scale, *kernels.attention_config)
    if q_norm_weight is not None:
        q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
    q, k = apply_rope(positions, q, k, cos_sin_cache)
    return paged_attention(q, k, v, attn.kv_cache, layer, attn.slot_mapping, attn.block_tables, attn.seq_lens,
                           attn.query_start_loc, scale)


def load_kernel_modules(choices: KernelChoices) -> None:
    """Register the ops a row needs (the Triton ones need triton, which the CPU path never imports)."""
    if choices.attention == "triton":
        import atom_aot.ops.triton  # noqa: F401
