"""The prefix workspace of MLA's mixed step: the cached prefixes of the naive-form query runs, up-projected into
per-head keys and values of a fixed capacity, so `atom_triton::mla_prefill`'s chunk kernel attends them in the
naive form (ops/triton/mla_prefill.py).

Layout: the naive runs' prefixes (runs of more than `absorbed_max` tokens; sequence b has P_b = seq_len - n_q
cached latents) are laid end to end in batch order, each from its first position: workspace row
starts[b] + p holds position p of sequence b, where starts [B + 1] is the exclusive running sum of the naive runs'
prefix lengths (`prefix_starts`, torch on the device, no host read). The workspace holds `capacity` rows:

    ws_k_nope [capacity, H, nope] = c_kv W_UK^T     ws_v [capacity, H, v] = c_kv W_UV     ws_k_pe [capacity, rope]

so sequence b finds its first `covered_b = clamp(capacity - starts[b], 0, P_b)` prefix keys there and the rest
(positions covered_b .. P_b - 1) overflow.

Why overflow goes to the absorbed prefix kernel (which reads any prefix straight from the paged cache) rather than
to a loop over workspace-sized chunks of the prefix: a step's prefix tokens are bounded only by B x max_model_len
(prefix caching hands many sequences long cached prefixes at once), not by max_model_len, so a loop of launches
fixed at export would need B x max_model_len / capacity iterations (each an up-projection and an attention pass,
exiting early but each a launch) or a host read to size it. One workspace plus the absorbed kernel for the rest
keeps one launch of each kernel and is correct for any batch; the build measures the capacity that pays
(build/tune_mla_mixed.py); the overflow costs the absorbed form's ~3.4x FLOPs per query-key pair.

`mla_prefix_workspace_kernel` gathers the latents through the block tables (an fp8 cache through its scales, as
the reference reads them), then up-projects them: grid (H, cdiv(capacity, BLOCK_M)), a program per head and
BLOCK_M workspace rows, fixed by the capacity, never by the step; a program past the step's filled rows
(min(capacity, starts[B])) returns at once, so a step without cached prefixes pays only the empty grid, where a
GEMM library call of the fixed capacity would run in full every step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from atom_aot.ops.triton._common import dot_acc, next_pow2


@dataclass(frozen=True)
class PrefixWorkspace:
    """The workspace's capacity in prefix tokens (0: none, every cached prefix taken absorbed) and its
    up-projection kernel's launch config (workspace rows per program, latent columns per step, warps, stages)."""
    capacity: int = 0
    block_m: int = 64
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 2

    def as_args(self) -> tuple[int, int, int, int, int]:
        return (self.capacity, self.block_m, self.block_k, self.num_warps, self.num_stages)


# What a row without `mla_prefix_workspace` runs (an artifact built before the workspace): no workspace
ABSORBED_PREFIXES = PrefixWorkspace()

# What the build measures (build/tune_mla_mixed.py): the up-projection's tiles (two fp32 accumulators, nope and v
# wide, per program; capacity 0 here, the build times each at its largest capacity) and the capacities (the build
# keeps those whose workspace fits its byte limit)
WORKSPACE_CANDIDATES = (
    PrefixWorkspace(0, 64, 64, 8, 2),
    PrefixWorkspace(0, 64, 32, 4, 2),
    PrefixWorkspace(0, 128, 64, 8, 2),
    PrefixWorkspace(0, 32, 64, 4, 2),
    PrefixWorkspace(0, 64, 64, 8, 3),
)
CAPACITY_CANDIDATES = (0, 2048, 4096, 8192, 16384)


def check_workspace(w: PrefixWorkspace) -> None:
    if w.capacity < 0 or w.block_m < 16 or w.block_k < 16 or w.num_warps < 1 or w.num_stages < 1:
        raise ValueError(f"the prefix workspace's capacity must be >= 0, block_m and block_k >= 16 (tl.dot), warps "
                         f"and stages >= 1; got {w}")


def workspace_bytes(capacity: int, heads: int, nope: int, v: int, rope: int, element_size: int) -> int:
    """Bytes of one layer call's workspace (k_nope, v per head, k_pe shared)."""
    return capacity * (heads * (nope + v) + rope) * element_size


def prefix_starts(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, absorbed_max: int) -> torch.Tensor:
    """[B + 1] int32: the workspace row where each naive run's cached prefix starts, batch order (the last entry:
    every naive run's prefix tokens together). Runs of at most absorbed_max tokens take none."""
    counts = query_start_loc[1:] - query_start_loc[:-1]                                        # [B]
    naive = torch.where(counts > absorbed_max, seq_lens - counts, 0)
    return torch.cat([naive.new_zeros(1), naive.cumsum(0)]).to(torch.int32)


@triton.jit
def workspace_share(starts_ptr, b, prefix, capacity):
    """(first row, covered): where sequence b's prefix starts in the workspace and how many of its `prefix` keys
    the workspace holds; the rest, positions covered .. prefix - 1, overflow."""
    first = tl.load(starts_ptr + b)
    return first, tl.maximum(tl.minimum(prefix, capacity - first), 0)


@triton.jit
def _run_of_rows(starts_ptr, rows, num_seqs):
    """Per workspace row, the sequence whose prefix holds it: the largest b < num_seqs with starts[b] <= row
    (a sequence with no naive prefix repeats the next one's start and is skipped), by a branchless binary search."""
    b = tl.zeros_like(rows)
    step = 1
    while step * 2 <= num_seqs:
        step *= 2
    while step > 0:
        cand = b + step
        ok = cand < num_seqs
        start = tl.load(starts_ptr + cand, mask=ok, other=0)
        b = tl.where(ok & (start <= rows), cand, b)
        step = step // 2
    return b


@triton.jit
def _dequantized(x, scale_ptr, part, dtype: tl.constexpr, KV_SCALED: tl.constexpr):
    """Cache values widened to `dtype` as the reference reads them: an fp8 cache's times its scale (float32)."""
    if KV_SCALED:
        return (x.to(tl.float32) * tl.load(scale_ptr + part)).to(dtype)
    return x.to(dtype)


@triton.jit
def mla_prefix_workspace_kernel(
    kv_ptr, kv_scale_ptr, w_uk_ptr, w_uv_ptr, ws_k_nope_ptr, ws_v_ptr, ws_k_pe_ptr, starts_ptr, block_tables_ptr,
    num_seqs, capacity, layer_offset,
    stride_wkh, stride_wkn, stride_wvh, stride_wvr, stride_knt, stride_knh, stride_vt, stride_vh, stride_kpt,
    stride_cblk, stride_crow, stride_bt,
    NOPE: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr, RANK: tl.constexpr,
    V: tl.constexpr, V_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PAGE_SIZE: tl.constexpr,
    KV_SCALED: tl.constexpr, IEEE: tl.constexpr,
):
    h = tl.program_id(0)
    first = tl.program_id(1) * BLOCK_M
    filled = tl.minimum(tl.load(starts_ptr + num_seqs), capacity)
    if first < filled:
        rows = first + tl.arange(0, BLOCK_M)                                           # [BLOCK_M] workspace rows
        row_ok = rows < filled
        b = _run_of_rows(starts_ptr, rows, num_seqs)
        pos = rows - tl.load(starts_ptr + b, mask=row_ok, other=0)                     # position in its sequence
        page = tl.load(block_tables_ptr + b.to(tl.int64) * stride_bt + pos // PAGE_SIZE, mask=row_ok,
                       other=0).to(tl.int64)
        slot = layer_offset + page * stride_cblk + (pos % PAGE_SIZE) * stride_crow    # [BLOCK_M]
        dn, dv = tl.arange(0, NOPE_PAD), tl.arange(0, V_PAD)
        dn_ok, dv_ok = dn < NOPE, dv < V
        dtype = w_uk_ptr.dtype.element_ty
        acc_k = tl.zeros([BLOCK_M, NOPE_PAD], tl.float32)
        acc_v = tl.zeros([BLOCK_M, V_PAD], tl.float32)
        for k0 in range(0, RANK, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            rk_ok = rk < RANK
            c = tl.load(kv_ptr + slot[:, None] + rk[None, :], mask=row_ok[:, None] & rk_ok[None, :], other=0.0)
            c = _dequantized(c, kv_scale_ptr, 0, dtype, KV_SCALED)                      # [BLOCK_M, BLOCK_K]
            w_k = tl.load(w_uk_ptr + h * stride_wkh + dn[None, :] * stride_wkn + rk[:, None],
                          mask=rk_ok[:, None] & dn_ok[None, :], other=0.0)             # [BLOCK_K, nope] = W_UK[h]^T
            w_v = tl.load(w_uv_ptr + h * stride_wvh + rk[:, None] * stride_wvr + dv[None, :],
                          mask=rk_ok[:, None] & dv_ok[None, :], other=0.0)             # [BLOCK_K, v]
            acc_k = dot_acc(c, w_k, acc_k, IEEE)
            acc_v = dot_acc(c, w_v, acc_v, IEEE)
        rows64 = rows.to(tl.int64)
        tl.store(ws_k_nope_ptr + rows64[:, None] * stride_knt + h * stride_knh + dn[None, :], acc_k.to(dtype),
                 mask=row_ok[:, None] & dn_ok[None, :])
        tl.store(ws_v_ptr + rows64[:, None] * stride_vt + h * stride_vh + dv[None, :], acc_v.to(dtype),
                 mask=row_ok[:, None] & dv_ok[None, :])
        if h == 0:                                      # k_pe is shared by the heads: one program per row writes it
            dr = tl.arange(0, ROPE_PAD)
            pe_mask = row_ok[:, None] & (dr < ROPE)[None, :]
            k_pe = tl.load(kv_ptr + slot[:, None] + RANK + dr[None, :], mask=pe_mask, other=0.0)
            tl.store(ws_k_pe_ptr + rows64[:, None] * stride_kpt + dr[None, :],
                     _dequantized(k_pe, kv_scale_ptr, 1, ws_k_pe_ptr.dtype.element_ty, KV_SCALED), mask=pe_mask)


def launch_prefix_workspace(
    kv_cache: torch.Tensor,         # [L, 1, num_blocks, block_size, 1, r + rope]
    layer: int,
    block_tables: torch.Tensor,     # [B, max_blocks] int32
    starts: torch.Tensor,           # [B + 1] int32: prefix_starts
    w_uk: torch.Tensor,             # [H, nope, r]
    w_uv: torch.Tensor,             # [H, r, v]
    rope: int,
    config: PrefixWorkspace,
    kv_scale: Optional[torch.Tensor] = None,   # [2] float32 (c_kv, k_pe): an fp8 cache's scales
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:   # ws_k_nope [C, H, nope], ws_v [C, H, v], ws_k_pe [C, rope]
    heads, nope, rank = w_uk.shape
    v_dim, cap, dev = w_uv.shape[2], config.capacity, w_uk.device
    ws_k_nope = torch.empty((cap, heads, nope), dtype=w_uk.dtype, device=dev)
    ws_v = torch.empty((cap, heads, v_dim), dtype=w_uk.dtype, device=dev)
    ws_k_pe = torch.empty((cap, rope), dtype=w_uk.dtype, device=dev)
    if cap == 0:
        return ws_k_nope, ws_v, ws_k_pe
    wrap_triton(mla_prefix_workspace_kernel)[(heads, triton.cdiv(cap, config.block_m))](
        kv_cache, starts if kv_scale is None else kv_scale, w_uk, w_uv, ws_k_nope, ws_v, ws_k_pe, starts,
        block_tables, starts.shape[0] - 1, cap, layer * kv_cache.stride(0),
        w_uk.stride(0), w_uk.stride(1), w_uv.stride(0), w_uv.stride(1), ws_k_nope.stride(0), ws_k_nope.stride(1),
        ws_v.stride(0), ws_v.stride(1), ws_k_pe.stride(0), kv_cache.stride(2), kv_cache.stride(3),
        block_tables.stride(0),
        NOPE=nope, NOPE_PAD=max(next_pow2(nope), 16), ROPE=rope, ROPE_PAD=max(next_pow2(rope), 16), RANK=rank,
        V=v_dim, V_PAD=max(next_pow2(v_dim), 16), BLOCK_M=config.block_m, BLOCK_K=config.block_k,
        PAGE_SIZE=kv_cache.shape[3], KV_SCALED=kv_scale is not None, IEEE=w_uk.dtype == torch.float32,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return ws_k_nope, ws_v, ws_k_pe
