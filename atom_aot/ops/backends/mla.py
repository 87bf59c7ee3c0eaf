"""What every MLA backend takes, and the `reference` one: interleaved rope in torch, then the
`atom::mla_attention` op (latent-cache write + attention). What the CPU arch runs, and what the
Triton MLA backend is checked against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import AttentionInputs, launch_configs
from atom_aot.ops.mla import mla_attention
from atom_aot.ops.rope import apply_rope_interleaved


@dataclass(frozen=True)
class MLAArgs:
    """One latent-attention layer's call (layout: atom_aot/ops/mla.py)."""
    layer: int                     # index into kv_cache's first dimension
    q_nope: torch.Tensor           # [T, H, nope]
    q_pe: torch.Tensor             # [T, H, rope] (not yet roped)
    c_kv: torch.Tensor             # [T, r] (normalized)
    k_pe: torch.Tensor             # [T, rope] (not yet roped)
    positions: torch.Tensor        # [T] int64
    cos_sin_cache: torch.Tensor    # [P, rope] float32: cos | sin
    w_uk: torch.Tensor             # [H, nope, r]
    w_uv: torch.Tensor             # [H, r, v]
    scale: float
    inputs: AttentionInputs


class MLABackend(Protocol):
    """Rope, latent-cache write and attention of one layer: returns out [T, H, v]."""

    def __call__(self, args: MLAArgs) -> torch.Tensor: ...


class ReferenceMLA:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune

    def __call__(self, args: MLAArgs) -> torch.Tensor:
        q_pe = apply_rope_interleaved(args.positions, args.q_pe, args.cos_sin_cache)
        k_pe = apply_rope_interleaved(args.positions, args.k_pe.unsqueeze(1), args.cos_sin_cache).squeeze(1)
        step = args.inputs
        return mla_attention(args.q_nope, q_pe, args.c_kv, k_pe, step.kv_cache, args.layer, step.slot_mapping,
                             step.block_tables, step.seq_lens, step.query_start_loc, args.w_uk, args.w_uv,
                             args.scale)
