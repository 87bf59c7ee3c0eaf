"""`atom_triton::mla_prefill`: MLA attention of a mixed step's query runs, over their sequence's cached prefix
and their own chunk, from the step's flat tensors alone (no host reads, grids from shapes and ints).

A sequence with n_q new tokens and length L has a cached prefix of P = L - n_q latents and a chunk of n_q
tokens whose latents this step wrote. Per query run, by its length (`absorbed_max`, measured at build):

  n_q <= absorbed_max  absorbed: the caller ran them through the decode kernel (ops/triton/mla_decode.py), one
                      row per query token, and hands their outputs in as `absorbed_out` [B * absorbed_max, H, v]
                      (row b * absorbed_max + j: token j of sequence b); the chunk kernel copies them into place.
  n_q > absorbed_max  naive (MHA) form, in up to three kernels that share one softmax:
    workspace kernel  the naive runs' cached prefixes up-projected into a fixed-capacity workspace of per-head keys
                      and values, laid end to end in batch order (ops/triton/mla_workspace.py): sequence b's first
                      `covered` prefix keys are there, the rest overflow.
    chunk kernel      the run over its workspace keys (all before the run: no mask but the last block's length),
                      then causal over its own chunk, whose per-head keys and values the caller up-projected for
                      every token of the step (k_nope [T, H, nope] = c_kv W_UK^T, v [T, H, v] = c_kv W_UV:
                      fixed-size GEMMs); k_pe [T, rope] is shared by the heads. One online softmax over both, so
                      they need no merge; writes out and each row's log2-sum-exp.
    prefix kernel     the run over its overflowing prefix keys (positions covered .. P - 1; all of P without a
                      workspace), absorbed inside the kernel (q_lat = q_nope W_UK per tile, scores against the
                      paged 576-wide latents, o = o_lat W_UV in the epilogue), merged into out by the two
                      log2-sum-exps. The latents are read from the paged cache as they are: no size that depends on
                      the prefix lengths. A tile with nothing overflowing returns at once.

Work decomposition: a tile is BLOCK_Q consecutive query tokens of one sequence x one head (the paged attention
kernel's tile numbering: T // BLOCK_Q + B + 1 tiles cover any batch, the last family holds padding rows, which
the chunk kernel writes as zeros). The chunk kernel's grid is (tiles, H); the prefix kernel's (H, tiles), so the
programs of one tile's heads run together and read each latent tile from L2; the workspace kernel's (H,
cdiv(capacity, BLOCK_M)), from the build's capacity.

An fp8 cache (kv_scale [2]: c_kv, k_pe) is widened on load; the workspace kernel multiplies by the scales before
up-projecting (as the reference reads the cache), the prefix kernel folds them into q_lat / q_pe and the latent
output as the decode backend does. The chunk's own keys come in as the cache holds them (the caller rounds them
through the cache's dtype), so every key of a row has the same numerics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_last_dim_contiguous, dot_acc, next_pow2
from atom_aot.ops.triton.attention_kernels import LOG2E, _locate_tile
from atom_aot.ops.triton.mla_decode import check_latent_cache
from atom_aot.ops.triton.mla_workspace import (PrefixWorkspace, check_workspace, launch_prefix_workspace,
                                               prefix_starts, workspace_share)


@dataclass(frozen=True)
class MLATileConfig:
    """Launch config of either kernel: query tokens per tile, keys per inner step, warps, stages."""
    block_q: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def as_args(self) -> tuple[int, int, int, int]:
        return (self.block_q, self.block_n, self.num_warps, self.num_stages)


@dataclass(frozen=True)
class AbsorbedRuns:
    """Query runs of at most `max_tokens` tokens take the absorbed form (the decode kernel, a row per token); longer
    ones the naive form. At least 1: a decoding sequence's one token is always absorbed."""
    max_tokens: int = 1

    def as_args(self) -> tuple[int]:
        return (self.max_tokens,)


# What the build measures (build/tune_mla_mixed.py). The chunk kernel's tile is FlashAttention's (q 192 wide,
# v 128 at DeepSeek-V3's shapes); the prefix kernel holds q_lat and its accumulator 512 wide, so its tiles are
# as small as the decode kernel's head blocks. A config the GPU cannot launch is skipped by the build.
CHUNK_CANDIDATES = (
    MLATileConfig(64, 64, 4, 2),
    MLATileConfig(64, 32, 4, 3),
    MLATileConfig(128, 64, 8, 2),
    MLATileConfig(128, 32, 8, 3),
    MLATileConfig(64, 64, 8, 3),
)
PREFIX_CANDIDATES = (
    MLATileConfig(16, 32, 4, 2),
    MLATileConfig(32, 32, 8, 2),
    MLATileConfig(32, 16, 4, 2),
    MLATileConfig(16, 16, 4, 2),
    MLATileConfig(16, 32, 8, 2),
    MLATileConfig(32, 32, 8, 3),
)


@triton.jit
def _online_softmax(s, m_i, l_i):
    """One key block's scores s [BLOCK_Q, BLOCK_N] (base 2, -inf where hidden) into the running (m, l, acc):
    returns (p, alpha, m_new, l_new) with acc to be scaled by alpha before p's product is added."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _chunk_blocks(q_n, q_p, k_nope_ptr, v_ptr, k_pe_ptr, k_lo, k_hi, kb_lo, kb_hi, rows, dn, dr, dv, dn_ok, dr_ok,
                  dv_ok, qk_scale, m_i, l_i, acc, stride_knt, stride_vt, stride_kpt,
                  BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                  IEEE: tl.constexpr):
    """Online softmax over key blocks [kb_lo, kb_hi) (key rows k_lo + kb * BLOCK_N + ..., below k_hi) of the
    chunk's keys (CAUSAL: a key row after a query's row is hidden from it) or the workspace's (every key precedes
    every query). MASKED false: every key of these blocks is visible to every row, none past k_hi."""
    offsets = tl.arange(0, BLOCK_N)
    for kb in range(kb_lo, kb_hi):
        keys = k_lo + kb * BLOCK_N + offsets                                        # [BLOCK_N] token rows
        keys64 = keys.to(tl.int64)
        if MASKED:
            key_ok = keys < k_hi
        else:
            key_ok = offsets < BLOCK_N
        k_n = tl.load(k_nope_ptr + keys64[None, :] * stride_knt + dn[:, None], mask=key_ok[None, :] & dn_ok[:, None],
                      other=0.0)                                                     # [nope, BLOCK_N]
        k_p = tl.load(k_pe_ptr + keys64[None, :] * stride_kpt + dr[:, None], mask=key_ok[None, :] & dr_ok[:, None],
                      other=0.0)                                                     # [rope, BLOCK_N]
        s = dot_acc(q_n, k_n, dot_acc(q_p, k_p, tl.zeros([BLOCK_Q, BLOCK_N], tl.float32), IEEE), IEEE) * qk_scale
        if MASKED:
            if CAUSAL:
                s = tl.where((keys[None, :] <= rows[:, None]) & key_ok[None, :], s, float("-inf"))
            else:
                s = tl.where(key_ok[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i)
        v = tl.load(v_ptr + keys64[:, None] * stride_vt + dv[None, :], mask=key_ok[:, None] & dv_ok[None, :],
                    other=0.0)                                                       # [BLOCK_N, v]
        acc = dot_acc(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
    return m_i, l_i, acc


@triton.jit
def _key_range(q_n, q_p, k_nope_ptr, v_ptr, k_pe_ptr, k_lo, k_hi, full, blocks, rows, dn, dr, dv, dn_ok, dr_ok, dv_ok,
               qk_scale, m_i, l_i, acc, stride_knt, stride_vt, stride_kpt,
               BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr):
    """_chunk_blocks over key rows [k_lo, k_hi) split in `blocks` blocks, the first `full` of which every row sees
    whole (unmasked), the rest masked."""
    m_i, l_i, acc = _chunk_blocks(q_n, q_p, k_nope_ptr, v_ptr, k_pe_ptr, k_lo, k_hi, 0, full, rows, dn, dr, dv, dn_ok,
                                  dr_ok, dv_ok, qk_scale, m_i, l_i, acc, stride_knt, stride_vt, stride_kpt, BLOCK_Q,
                                  BLOCK_N, False, CAUSAL, IEEE)
    return _chunk_blocks(q_n, q_p, k_nope_ptr, v_ptr, k_pe_ptr, k_lo, k_hi, full, blocks, rows, dn, dr, dv, dn_ok,
                         dr_ok, dv_ok, qk_scale, m_i, l_i, acc, stride_knt, stride_vt, stride_kpt, BLOCK_Q, BLOCK_N,
                         True, CAUSAL, IEEE)


@triton.jit
def mla_chunk_kernel(
    q_nope_ptr, q_pe_ptr, k_nope_ptr, v_ptr, k_pe_ptr, ws_k_nope_ptr, ws_v_ptr, ws_k_pe_ptr, absorbed_ptr, out_ptr,
    lse_ptr, query_start_loc_ptr, seq_lens_ptr, ws_starts_ptr,
    qk_scale_log2, num_tokens, num_seqs, absorbed_max, capacity,
    stride_qnt, stride_qnh, stride_qpt, stride_qph, stride_knt, stride_knh, stride_vt, stride_vh, stride_kpt,
    stride_wnt, stride_wnh, stride_wvt, stride_wvh, stride_wpt, stride_at, stride_ah, stride_ot, stride_oh, stride_lt,
    NOPE: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
    V: tl.constexpr, V_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    b, q_start, q_end, q_first = _locate_tile(query_start_loc_ptr, tile, num_seqs, num_tokens, BLOCK_Q)
    if q_first >= q_end:
        return
    rows = q_first + tl.arange(0, BLOCK_Q)                                          # [BLOCK_Q] token rows
    row_ok = rows < q_end
    rows64 = rows.to(tl.int64)
    dv = tl.arange(0, V_PAD)
    dv_ok = dv < V
    io_mask = row_ok[:, None] & dv_ok[None, :]
    out_rows = out_ptr + rows64[:, None] * stride_ot + h * stride_oh + dv[None, :]
    n_q = q_end - q_start
    if b == num_seqs:                                   # padding rows past the last sequence: zeros
        tl.store(out_rows, tl.zeros([BLOCK_Q, V_PAD], tl.float32).to(out_ptr.dtype.element_ty), mask=io_mask)
    elif n_q <= absorbed_max:                         # an absorbed run: its rows from the decode kernel's output
        src = (b * absorbed_max + rows - q_start).to(tl.int64)
        o = tl.load(absorbed_ptr + src[:, None] * stride_at + h * stride_ah + dv[None, :], mask=io_mask)
        tl.store(out_rows, o.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        dn, dr = tl.arange(0, NOPE_PAD), tl.arange(0, ROPE_PAD)
        dn_ok, dr_ok = dn < NOPE, dr < ROPE
        q_n = tl.load(q_nope_ptr + rows64[:, None] * stride_qnt + h * stride_qnh + dn[None, :],
                      mask=row_ok[:, None] & dn_ok[None, :], other=0.0)             # [BLOCK_Q, nope]
        q_p = tl.load(q_pe_ptr + rows64[:, None] * stride_qpt + h * stride_qph + dr[None, :],
                      mask=row_ok[:, None] & dr_ok[None, :], other=0.0)             # [BLOCK_Q, rope]
        qk_scale = tl.cast(qk_scale_log2, tl.float32)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, V_PAD], tl.float32)
        # the cached prefix's keys in the workspace, rows ws_lo .. ws_lo + covered: before every query of the run
        ws_lo, covered = workspace_share(ws_starts_ptr, b, tl.load(seq_lens_ptr + b) - n_q, capacity)
        m_i, l_i, acc = _key_range(q_n, q_p, ws_k_nope_ptr + h * stride_wnh, ws_v_ptr + h * stride_wvh, ws_k_pe_ptr,
                                   ws_lo, ws_lo + covered, covered // BLOCK_N, tl.cdiv(covered, BLOCK_N), rows, dn,
                                   dr, dv, dn_ok, dr_ok, dv_ok, qk_scale, m_i, l_i, acc, stride_wnt, stride_wvt,
                                   stride_wpt, BLOCK_Q, BLOCK_N, False, IEEE)
        # the chunk's key rows q_start .. the tile's last query; the blocks ending at or before its first query are
        # unmasked
        k_hi = tl.minimum(q_first + BLOCK_Q, q_end)
        m_i, l_i, acc = _key_range(q_n, q_p, k_nope_ptr + h * stride_knh, v_ptr + h * stride_vh, k_pe_ptr, q_start,
                                   k_hi, (q_first - q_start + 1) // BLOCK_N, tl.cdiv(k_hi - q_start, BLOCK_N), rows,
                                   dn, dr, dv, dn_ok, dr_ok, dv_ok, qk_scale, m_i, l_i, acc, stride_knt, stride_vt,
                                   stride_kpt, BLOCK_Q, BLOCK_N, True, IEEE)
        l_safe = tl.where(row_ok, l_i, 1.0)             # every real row sees itself: l > 0
        tl.store(out_rows, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)
        tl.store(lse_ptr + rows64 * stride_lt + h, m_i + tl.log2(l_safe), mask=row_ok)


@triton.jit
def _prefix_blocks(q_lat, q_p, cache, table, k_lo, kb_lo, kb_hi, prefix, ranks, dr, rank_ok, dr_ok, qk_scale,
                   m_i, l_i, acc, stride_cblk, stride_crow,
                   RANK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   MASKED: tl.constexpr, IEEE: tl.constexpr):
    """Online softmax of the absorbed queries over the cached prefix's key blocks [kb_lo, kb_hi) from position
    k_lo (the first one the workspace does not hold): every key before `prefix` is visible to every query of the
    run (MASKED: the last, partial block)."""
    offsets = tl.arange(0, BLOCK_N)
    for kb in range(kb_lo, kb_hi):
        keys = k_lo + kb * BLOCK_N + offsets
        if MASKED:
            key_ok = keys < prefix
        else:
            key_ok = offsets < BLOCK_N
        page = tl.load(table + keys // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
        slot = page * stride_cblk + (keys % PAGE_SIZE) * stride_crow                  # [BLOCK_N]
        c = tl.load(cache + slot[:, None] + ranks[None, :], mask=key_ok[:, None] & rank_ok[None, :],
                    other=0.0).to(q_lat.dtype)                                       # [BLOCK_N, r]
        k_p = tl.load(cache + slot[None, :] + RANK + dr[:, None], mask=key_ok[None, :] & dr_ok[:, None],
                      other=0.0).to(q_p.dtype)                                       # [rope, BLOCK_N]
        s = dot_acc(q_lat, tl.trans(c), dot_acc(q_p, k_p, tl.zeros([BLOCK_Q, BLOCK_N], tl.float32), IEEE), IEEE)
        s = s * qk_scale
        if MASKED:
            s = tl.where(key_ok[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i)
        acc = dot_acc(p.to(c.dtype), c, acc * alpha[:, None], IEEE)
    return m_i, l_i, acc


@triton.jit
def _absorbed_queries(q_nope_ptr, q_pe_ptr, w_uk_ptr, kv_scale_ptr, rows64, row_ok, h, ranks, rank_ok, dr, dr_ok,
                      stride_qnt, stride_qnh, stride_qpt, stride_qph, stride_wkh, stride_wkn,
                      NOPE: tl.constexpr, NOPE_STEP: tl.constexpr, BLOCK_Q: tl.constexpr, RANK_PAD: tl.constexpr,
                      KV_SCALED: tl.constexpr, IEEE: tl.constexpr):
    """(q_lat [BLOCK_Q, r] = q_nope W_UK[h], q_pe [BLOCK_Q, rope]) in the queries' dtype, NOPE_STEP columns of
    q_nope at a time; an fp8 cache's scales folded in (scores of the stored latents are then the true ones)."""
    q_p = tl.load(q_pe_ptr + rows64[:, None] * stride_qpt + h * stride_qph + dr[None, :],
                  mask=row_ok[:, None] & dr_ok[None, :], other=0.0)                  # [BLOCK_Q, rope]
    q_lat = tl.zeros([BLOCK_Q, RANK_PAD], tl.float32)
    for n0 in range(0, NOPE, NOPE_STEP):
        dn = n0 + tl.arange(0, NOPE_STEP)
        dn_ok = dn < NOPE
        q_n = tl.load(q_nope_ptr + rows64[:, None] * stride_qnt + h * stride_qnh + dn[None, :],
                      mask=row_ok[:, None] & dn_ok[None, :], other=0.0)              # [BLOCK_Q, NOPE_STEP]
        w = tl.load(w_uk_ptr + h * stride_wkh + dn[:, None] * stride_wkn + ranks[None, :],
                    mask=dn_ok[:, None] & rank_ok[None, :], other=0.0)               # [NOPE_STEP, r]
        q_lat = dot_acc(q_n, w, q_lat, IEEE)
    q_pf = q_p.to(tl.float32)
    if KV_SCALED:
        q_lat = q_lat * tl.load(kv_scale_ptr)
        q_pf = q_pf * tl.load(kv_scale_ptr + 1)
    return q_lat.to(q_p.dtype), q_pf.to(q_p.dtype)


@triton.jit
def _merge_into_out(o_lat, m_i, l_i, w_uv_ptr, out_ptr, lse_ptr, rows64, row_ok, h, ranks, rank_ok,
                    stride_wvh, stride_wvr, stride_ot, stride_oh, stride_lt,
                    V: tl.constexpr, V_PAD: tl.constexpr, V_STEP: tl.constexpr, IEEE: tl.constexpr):
    """out = the chunk's output and the prefix's (o_lat W_UV[h], V_STEP columns at a time) weighed by their
    log2-sum-exps."""
    lse_p = m_i + tl.log2(l_i)
    lse_c = tl.load(lse_ptr + rows64 * stride_lt + h, mask=row_ok, other=0.0)
    top = tl.maximum(lse_c, lse_p)
    w_c, w_p = tl.exp2(lse_c - top), tl.exp2(lse_p - top)
    w_c, w_p = w_c / (w_c + w_p), w_p / (w_c + w_p)
    for v0 in range(0, V_PAD, V_STEP):
        dv = v0 + tl.arange(0, V_STEP)
        dv_ok = dv < V
        w = tl.load(w_uv_ptr + h * stride_wvh + ranks[:, None] * stride_wvr + dv[None, :],
                    mask=rank_ok[:, None] & dv_ok[None, :], other=0.0)               # [r, V_STEP]
        o_p = dot_acc(o_lat, w, tl.zeros([o_lat.shape[0], V_STEP], tl.float32), IEEE)  # [BLOCK_Q, V_STEP]
        io_mask = row_ok[:, None] & dv_ok[None, :]
        rows_out = out_ptr + rows64[:, None] * stride_ot + h * stride_oh + dv[None, :]
        o_c = tl.load(rows_out, mask=io_mask, other=0.0).to(tl.float32)
        tl.store(rows_out, (o_c * w_c[:, None] + o_p * w_p[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def mla_prefix_kernel(
    q_nope_ptr, q_pe_ptr, w_uk_ptr, w_uv_ptr, kv_ptr, kv_scale_ptr, out_ptr, lse_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, ws_starts_ptr,
    qk_scale_log2, num_tokens, num_seqs, absorbed_max, capacity, layer_offset,
    stride_qnt, stride_qnh, stride_qpt, stride_qph, stride_wkh, stride_wkn, stride_wvh, stride_wvr,
    stride_ot, stride_oh, stride_lt, stride_cblk, stride_crow, stride_bt,
    NOPE: tl.constexpr, NOPE_STEP: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
    RANK: tl.constexpr, RANK_PAD: tl.constexpr, V: tl.constexpr, V_PAD: tl.constexpr, V_STEP: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, KV_SCALED: tl.constexpr,
    IEEE: tl.constexpr,
):
    h = tl.program_id(0)
    tile = tl.program_id(1)
    b, q_start, q_end, q_first = _locate_tile(query_start_loc_ptr, tile, num_seqs, num_tokens, BLOCK_Q)
    n_q = q_end - q_start
    prefix = tl.load(seq_lens_ptr + b, mask=b < num_seqs, other=0) - n_q
    _, covered = workspace_share(ws_starts_ptr, b, prefix, capacity)        # b <= num_seqs: B + 1 starts
    if (q_first < q_end) & (b < num_seqs) & (n_q > absorbed_max) & (prefix > covered):
        rows = q_first + tl.arange(0, BLOCK_Q)
        row_ok = rows < q_end
        rows64 = rows.to(tl.int64)
        ranks, dr = tl.arange(0, RANK_PAD), tl.arange(0, ROPE_PAD)
        rank_ok, dr_ok = ranks < RANK, dr < ROPE
        q_lat, q_p = _absorbed_queries(q_nope_ptr, q_pe_ptr, w_uk_ptr, kv_scale_ptr, rows64, row_ok, h, ranks,
                                       rank_ok, dr, dr_ok, stride_qnt, stride_qnh, stride_qpt, stride_qph,
                                       stride_wkh, stride_wkn, NOPE, NOPE_STEP, BLOCK_Q, RANK_PAD, KV_SCALED, IEEE)
        qk_scale = tl.cast(qk_scale_log2, tl.float32)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, RANK_PAD], tl.float32)
        cache, table = kv_ptr + layer_offset, block_tables_ptr + b * stride_bt
        full = (prefix - covered) // BLOCK_N         # the overflowing keys, positions covered .. prefix - 1
        m_i, l_i, acc = _prefix_blocks(q_lat, q_p, cache, table, covered, 0, full, prefix, ranks, dr, rank_ok,
                                       dr_ok, qk_scale, m_i, l_i, acc, stride_cblk, stride_crow, RANK, BLOCK_Q,
                                       BLOCK_N, PAGE_SIZE, False, IEEE)
        m_i, l_i, acc = _prefix_blocks(q_lat, q_p, cache, table, covered, full, tl.cdiv(prefix - covered, BLOCK_N),
                                       prefix, ranks, dr, rank_ok, dr_ok, qk_scale, m_i, l_i, acc, stride_cblk,
                                       stride_crow, RANK, BLOCK_Q, BLOCK_N, PAGE_SIZE, True, IEEE)
        o_lat = acc / l_i[:, None]                     # l > 0: a key overflows, every query sees it
        if KV_SCALED:
            o_lat = o_lat * tl.load(kv_scale_ptr)
        _merge_into_out(o_lat.to(w_uv_ptr.dtype.element_ty), m_i, l_i, w_uv_ptr, out_ptr, lse_ptr, rows64, row_ok, h, ranks,
                        rank_ok, stride_wvh, stride_wvr, stride_ot, stride_oh, stride_lt, V, V_PAD, V_STEP, IEEE)


def check_tile(what: str, c: MLATileConfig) -> None:
    if c.block_q < 16 or c.block_n < 16 or c.num_warps < 1 or c.num_stages < 1:
        raise ValueError(f"the {what} kernel's block_q and block_n must be >= 16 (tl.dot), warps and stages >= 1; "
                         f"got {c}")


def _check_inputs(tensors: dict, chunk: MLATileConfig, prefix: MLATileConfig, workspace: PrefixWorkspace) -> None:
    """Refused before any launch: the kernels index rows by stride but need dense last dimensions, and tiles tl.dot
    can take."""
    for name, t in tensors.items():
        check_last_dim_contiguous(name, t)
    check_tile("chunk", chunk)
    check_tile("prefix", prefix)
    check_workspace(workspace)


def launch_mla_prefill(
    q_nope: torch.Tensor,           # [T, H, nope]
    q_pe: torch.Tensor,             # [T, H, rope] (roped)
    k_nope: torch.Tensor,           # [T, H, nope]: c_kv W_UK^T of every token of the step
    v: torch.Tensor,                # [T, H, v]: c_kv W_UV
    k_pe: torch.Tensor,             # [T, rope] (roped, as the cache holds it)
    absorbed_out: torch.Tensor,     # [B * absorbed_max, H, v]: the absorbed runs' outputs
    kv_cache: torch.Tensor,         # [L, 1, num_blocks, block_size, 1, r + rope], this step's latents written
    layer: int,
    block_tables: torch.Tensor,     # [B, max_blocks] int32
    seq_lens: torch.Tensor,         # [B] int32: context length, this step's tokens included
    query_start_loc: torch.Tensor,  # [B + 1] int32
    w_uk: torch.Tensor,             # [H, nope, r]
    w_uv: torch.Tensor,             # [H, r, v]
    scale: float,
    absorbed_max: int,              # runs of at most this many tokens are absorbed (absorbed_out)
    chunk: MLATileConfig,
    prefix: MLATileConfig,
    workspace: PrefixWorkspace,     # capacity 0: no workspace, every cached prefix absorbed in the prefix kernel
    kv_scale: Optional[torch.Tensor] = None,   # [2] float32 (c_kv, k_pe): an fp8 cache's scales
) -> torch.Tensor:                  # out [T, H, v]
    num_tokens, num_heads, nope = q_nope.shape
    rank, v_dim, rope = w_uk.shape[2], w_uv.shape[2], q_pe.shape[2]
    check_latent_cache(kv_cache, rank + rope)
    _check_inputs(dict(q_nope=q_nope, q_pe=q_pe, k_nope=k_nope, v=v, k_pe=k_pe, absorbed_out=absorbed_out, w_uk=w_uk,
                       w_uv=w_uv), chunk, prefix, workspace)
    num_seqs = query_start_loc.shape[0] - 1
    starts = prefix_starts(query_start_loc, seq_lens, absorbed_max)                        # [B + 1]
    ws_k_nope, ws_v, ws_k_pe = launch_prefix_workspace(kv_cache, layer, block_tables, starts, w_uk, w_uv, rope,
                                                       workspace, kv_scale)
    out = torch.empty((num_tokens, num_heads, v_dim), dtype=q_nope.dtype, device=q_nope.device)
    lse = torch.empty((num_tokens, num_heads), dtype=torch.float32, device=q_nope.device)
    ieee, rope_pad, v_pad = q_nope.dtype == torch.float32, max(next_pow2(rope), 16), max(next_pow2(v_dim), 16)
    wrap_triton(mla_chunk_kernel)[(num_tokens // chunk.block_q + num_seqs + 1, num_heads)](
        q_nope, q_pe, k_nope, v, k_pe, ws_k_nope, ws_v, ws_k_pe, absorbed_out, out, lse, query_start_loc, seq_lens,
        starts, scale * LOG2E, num_tokens, num_seqs, absorbed_max, workspace.capacity,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), k_nope.stride(0), k_nope.stride(1),
        v.stride(0), v.stride(1), k_pe.stride(0), ws_k_nope.stride(0), ws_k_nope.stride(1), ws_v.stride(0),
        ws_v.stride(1), ws_k_pe.stride(0), absorbed_out.stride(0), absorbed_out.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        NOPE=nope, NOPE_PAD=max(next_pow2(nope), 16), ROPE=rope, ROPE_PAD=rope_pad, V=v_dim, V_PAD=v_pad,
        BLOCK_Q=chunk.block_q, BLOCK_N=chunk.block_n, IEEE=ieee, num_warps=chunk.num_warps,
        num_stages=chunk.num_stages,
    )
    wrap_triton(mla_prefix_kernel)[(num_heads, num_tokens // prefix.block_q + num_seqs + 1)](
        q_nope, q_pe, w_uk, w_uv, kv_cache, seq_lens if kv_scale is None else kv_scale, out, lse,
        block_tables, seq_lens, query_start_loc, starts,
        scale * LOG2E, num_tokens, num_seqs, absorbed_max, workspace.capacity, layer * kv_cache.stride(0),
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), w_uk.stride(0), w_uk.stride(1),
        w_uv.stride(0), w_uv.stride(1), out.stride(0), out.stride(1), lse.stride(0),
        kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        NOPE=nope, NOPE_STEP=min(max(next_pow2(nope), 16), 32), ROPE=rope, ROPE_PAD=rope_pad, RANK=rank,
        RANK_PAD=next_pow2(rank), V=v_dim, V_PAD=v_pad, V_STEP=min(v_pad, 32), BLOCK_Q=prefix.block_q,
        BLOCK_N=prefix.block_n, PAGE_SIZE=kv_cache.shape[3], KV_SCALED=kv_scale is not None, IEEE=ieee,
        num_warps=prefix.num_warps, num_stages=prefix.num_stages,
    )
    return out


@triton_op("atom_triton::mla_prefill", mutates_args=())
def mla_prefill(
    q_nope: torch.Tensor, q_pe: torch.Tensor, k_nope: torch.Tensor, v: torch.Tensor, k_pe: torch.Tensor,
    absorbed_out: torch.Tensor, kv_cache: torch.Tensor, layer: int, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float, absorbed_max: int,
    chunk_config: list[int], prefix_config: list[int], workspace_config: list[int],
    kv_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    return launch_mla_prefill(q_nope, q_pe, k_nope, v, k_pe, absorbed_out, kv_cache, layer, block_tables, seq_lens,
                              query_start_loc, w_uk, w_uv, scale, absorbed_max, MLATileConfig(*chunk_config),
                              MLATileConfig(*prefix_config), PrefixWorkspace(*workspace_config), kv_scale)
