"""What every MLA backend takes, and the backends: `reference` (interleaved rope in torch, then the
`atom::mla_attention` op: latent-cache write + attention, any batch; what the CPU arch runs) and `triton`:
in a decode row the absorbed decode kernel (atom_aot/ops/triton/mla_decode.py), in a mixed row the mixed
path of ops/backends/mla_mixed.py (its params say which: mla_mixed.triton_mla)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import AttentionInputs, bucket_params, launch_configs
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
    kv_scale: torch.Tensor | None = None   # [2] float32 (c_kv, k_pe) when the cache is fp8 (ops/mla.py)


class MLABackend(Protocol):
    """Rope, latent-cache write and attention of one layer: returns out [T, H, v]."""

    def __call__(self, args: MLAArgs) -> torch.Tensor: ...


def roped(args: MLAArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_pe [T, H, rope], k_pe [T, rope]) rotated at their positions."""
    q_pe = apply_rope_interleaved(args.positions, args.q_pe, args.cos_sin_cache)
    k_pe = apply_rope_interleaved(args.positions, args.k_pe.unsqueeze(1), args.cos_sin_cache).squeeze(1)
    return q_pe, k_pe


class ReferenceMLA:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune

    def __call__(self, args: MLAArgs) -> torch.Tensor:
        q_pe, k_pe = roped(args)
        step = args.inputs
        return mla_attention(args.q_nope, q_pe, args.c_kv, k_pe, step.kv_cache, args.layer, step.slot_mapping,
                             step.block_tables, step.seq_lens, step.query_start_loc, args.w_uk, args.w_uv,
                             args.scale, args.kv_scale)


class TritonMLA:
    """The decode phase only (one new token per sequence, token row b = sequence b; the build names it in the
    decode row): rope in torch, the latent-cache write kernel, then `absorbed_decode`.

    The kernel's config comes per batch-size bucket, `mla_decode@<first batch>` (the build measures each);
    an artifact built before buckets has one `mla_decode` config for every batch."""

    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        self.table = decode_table(choice)

    def __call__(self, args: MLAArgs) -> torch.Tensor:
        q_pe, k_pe = roped(args)
        step = args.inputs
        torch.ops.atom_triton.mla_cache_write(args.c_kv, k_pe, step.kv_cache, args.layer, step.slot_mapping,
                                              args.kv_scale)
        return absorbed_decode(args, args.q_nope, q_pe, step.block_tables, step.seq_lens, self.table)


def decode_table(choice: BackendChoice) -> list[int]:
    """The decode kernel's per-bucket config table from a row's `mla_decode@<first batch>` params (or one
    `mla_decode` config for every batch); the row's other params are left to the caller."""
    from atom_aot.ops.triton.mla_decode import MLADecodeConfig, config_table
    decode = BackendChoice(choice.backend, {k: v for k, v in choice.params.items() if k.startswith("mla_decode")})
    if set(decode.params) == {"mla_decode"}:
        return config_table(launch_configs(decode, {"mla_decode": MLADecodeConfig})["mla_decode"])
    return list(bucket_params(decode, "mla_decode", ", ".join(f.name for f in fields(MLADecodeConfig))))


def absorbed_decode(args: MLAArgs, q_nope: torch.Tensor, q_pe: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, table: list[int]) -> torch.Tensor:
    """Rows of one query token each, q_nope [N, H, nope] and roped q_pe [N, H, rope], row i over the first
    seq_lens[i] latents of block_tables[i] (0: none, the row comes back as zeros): W_UK folded into the query,
    the decode kernel over the latent cache, then W_UV on the latent output; returns [N, H, v]. An fp8 cache's
    scales are folded outside the kernel, which widens the stored bytes: q_lat times the c_kv scale and q_pe
    times the k_pe scale give the scores of the scaled latents, and the latent output is times the c_kv scale."""
    q_lat = torch.bmm(q_nope.transpose(0, 1), args.w_uk).transpose(0, 1)               # [N, H, r]
    if args.kv_scale is not None:
        q_lat = (q_lat.float() * args.kv_scale[0]).to(q_lat.dtype)
        q_pe = (q_pe.float() * args.kv_scale[1]).to(q_pe.dtype)
    q = torch.cat([q_lat, q_pe], dim=-1)                                                 # [N, H, r + rope]
    o_lat = torch.ops.atom_triton.mla_decode(q, args.inputs.kv_cache, args.layer, block_tables, seq_lens,
                                             args.scale, args.w_uk.shape[2], table)
    if args.kv_scale is not None:
        o_lat = (o_lat.float() * args.kv_scale[0]).to(o_lat.dtype)
    return torch.bmm(o_lat.transpose(0, 1), args.w_uv).transpose(0, 1)                # [N, H, v]

