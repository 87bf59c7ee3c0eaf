"""`atom_triton::mla_decode`: MLA's absorbed decode over the paged latent cache, split-K.

One query token per sequence (the decode phase: token row b is sequence b). The query arrives
absorbed, q = [q_nope @ W_UK | roped q_pe]: [B, H, r + rope], so each head attends over the
latents themselves and the op returns the latent output o_lat [B, H, r] (the caller applies W_UV).
Layout of the cache: atom_aot/ops/mla.py.

Work decomposition (grid = (B, cdiv(H, BLOCK_H), num_splits)): a program takes BLOCK_H heads of
one sequence, so every latent tile loaded from the cache serves all of them (MLA is MQA over the
latent), and split s of num_splits an equal share of the sequence's key blocks. As in paged
attention (attention_kernels.py), `num_splits` adapts to the batch at run time and the merge
kernel combines the partials; with one split the tile kernel writes o_lat itself.

`atom_triton::mla_cache_write` writes the step's latents into the cache beside it: a program per
token, a padded token's slot (-1) skipped on the device. The reference write selects the valid rows
with a boolean mask, a host sync that a CUDA graph cannot capture.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import bucket_rows, check_last_dim_contiguous, in_bucket, next_pow2
from atom_aot.ops.triton.attention_kernels import LOG2E, _store_tile
from atom_aot.ops.triton.paged_attention import launch_merge_splits, split_count, split_partials
from atom_aot.ops.triton.rope_cache import _to_cache


@dataclass(frozen=True)
class MLADecodeConfig:
    block_h: int = 16           # heads per program (>= 16 for tl.dot)
    block_n: int = 32           # latents per inner step
    num_warps: int = 4
    num_stages: int = 2
    target_programs: int = 512  # key splits aim for this many programs (see paged_attention.split_count)
    max_splits: int = 32        # at most this many; 1: never split

    def as_args(self) -> tuple[int, int, int, int, int, int]:
        return (self.block_h, self.block_n, self.num_warps, self.num_stages, self.target_programs, self.max_splits)


# What the build measures on the target (batches 1 to 256 at a long context): the latent tile is
# r = 512 wide, so key tiles stay small; candidates differ in heads per program, key tile, pipeline stages and
# the split policy. More heads per program read each latent tile fewer times (DeepSeek-V3's 128 heads: 8 reads
# at 16, 2 at 64) and give the MMA a taller tile; 128 heads per program do not compile (ptxas runs out of
# registers at 8 and 16 warps). The last four came from a wider grid (scripts/gpu/bench_mla_decode.py on an
# H200, docs/benchmarks/h200-deepseek-v3-mla-decode-2026-12-03.json): at batch 256 over 1,280 tokens 64 heads
# with 64-key tiles in 3 stages took 0.449 ms against 0.764 for the best of the first eight; at batch 1, 32
# heads with 64-key tiles 0.0184 against 0.0196 ms. A config the GPU cannot launch (shared memory, registers)
# is skipped by the build.
CANDIDATE_CONFIGS = (
    MLADecodeConfig(16, 32, 4, 2, 512, 32),
    MLADecodeConfig(16, 32, 4, 2, 1024, 64),
    MLADecodeConfig(16, 64, 8, 2, 512, 32),
    MLADecodeConfig(32, 32, 8, 2, 512, 32),
    MLADecodeConfig(16, 16, 4, 3, 256, 16),
    MLADecodeConfig(32, 16, 4, 2, 512, 32),
    MLADecodeConfig(64, 16, 8, 2, 512, 32),
    MLADecodeConfig(64, 32, 8, 1, 512, 32),
    MLADecodeConfig(64, 64, 8, 3, 512, 32),
    MLADecodeConfig(64, 64, 8, 2, 512, 32),
    MLADecodeConfig(64, 32, 8, 3, 512, 32),
    MLADecodeConfig(32, 64, 8, 2, 512, 32),
)


@triton.jit
def mla_decode_kernel(
    q_ptr, kv_ptr, out_ptr, part_ptr, lse_ptr, block_tables_ptr, seq_lens_ptr,
    qk_scale_log2, num_heads, num_splits, layer_offset,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    stride_cblk, stride_crow, stride_bt,
    RANK: tl.constexpr, RANK_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, IEEE: tl.constexpr,
    MAY_SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)       # [BLOCK_H]
    split = tl.program_id(2)
    head_ok = head < num_heads
    ranks, ropes = tl.arange(0, RANK_PAD), tl.arange(0, ROPE_PAD)
    rank_ok, rope_ok = ranks < RANK, ropes < ROPE
    tok64 = tl.zeros([BLOCK_H], tl.int64) + b
    q_rows = q_ptr + tok64[:, None] * stride_qt + head[:, None] * stride_qh
    q_lat = tl.load(q_rows + ranks[None, :], mask=head_ok[:, None] & rank_ok[None, :], other=0.0)   # [BLOCK_H, r]
    q_pe = tl.load(q_rows + RANK + ropes[None, :], mask=head_ok[:, None] & rope_ok[None, :], other=0.0)

    kv_len = tl.load(seq_lens_ptr + b)          # the query is the sequence's last token: it sees every key
    per_split = tl.cdiv(tl.cdiv(kv_len, BLOCK_N), num_splits)
    kb_lo = split * per_split
    kb_hi = tl.minimum(kb_lo + per_split, tl.cdiv(kv_len, BLOCK_N))
    cache, table = kv_ptr + layer_offset, block_tables_ptr + b * stride_bt
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, RANK_PAD], tl.float32)
    for kb in range(kb_lo, kb_hi):
        keys = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = keys < kv_len
        page = tl.load(table + keys // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
        slot = page * stride_cblk + (keys % PAGE_SIZE) * stride_crow                # [BLOCK_N]
        c_kv = tl.load(cache + slot[:, None] + ranks[None, :], mask=key_ok[:, None] & rank_ok[None, :],
                       other=0.0).to(q_lat.dtype)                                     # [BLOCK_N, r]
        k_pe = tl.load(cache + slot[None, :] + RANK + ropes[:, None], mask=key_ok[None, :] & rope_ok[:, None],
                       other=0.0).to(q_pe.dtype)                                      # [rope, BLOCK_N]
        if IEEE:
            s = tl.dot(q_lat, tl.trans(c_kv), input_precision="ieee") + tl.dot(q_pe, k_pe, input_precision="ieee")
        else:
            s = tl.dot(q_lat, tl.trans(c_kv)) + tl.dot(q_pe, k_pe)
        s = tl.where(key_ok[None, :], s * tl.cast(qk_scale_log2, tl.float32), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = tl.dot(p.to(c_kv.dtype), c_kv, acc * alpha[:, None], input_precision="ieee")
        else:
            acc = tl.dot(p.to(c_kv.dtype), c_kv, acc * alpha[:, None])
        m_i = m_new
    _store_tile(out_ptr, part_ptr, lse_ptr, acc, l_i, m_i, tok64, head, ranks, head_ok, rank_ok, split, num_splits,
                stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAY_SPLIT)


def check_latent_cache(kv_cache: torch.Tensor, width: int) -> None:
    # kv_cache: [L, 1, num_blocks, block_size, 1, r + rope]
    if kv_cache.dim() != 6 or kv_cache.shape[4] != 1 or kv_cache.shape[5] != width:
        raise ValueError(f"kv_cache must be [L, 1, num_blocks, block_size, 1, {width}] (the latent cache), "
                         f"got {tuple(kv_cache.shape)}")
    check_last_dim_contiguous("kv_cache", kv_cache)


TABLE_ROW = 1 + len(MLADecodeConfig().as_args())     # first batch size, then the config's ints


def config_table(config: MLADecodeConfig) -> list[int]:
    """One config for every batch size, as the op's table."""
    return [1, *config.as_args()]


def launch_mla_decode(
    q: torch.Tensor,                # [B, H, r + rope]: absorbed q_nope | roped q_pe, one token per sequence
    kv_cache: torch.Tensor,         # [L, 1, num_blocks, block_size, 1, r + rope]
    layer: int,
    block_tables: torch.Tensor,     # [B, max_blocks] int32
    seq_lens: torch.Tensor,         # [B] int32: context length, this step's token included
    scale: float,
    kv_lora_rank: int,
    table: list[int],               # per batch-size bucket: first batch size, then MLADecodeConfig's 6 ints
) -> torch.Tensor:                  # o_lat [B, H, r]
    """Each bucket's kernels are launched with a grid of 0 unless B falls in it (in_bucket): the build measures
    which config is fastest at each batch (16 heads per program at batch 1, 64 at batch 256 on an H200)."""
    check_latent_cache(kv_cache, q.shape[2])
    check_last_dim_contiguous("q", q)
    num_seqs, num_heads = q.shape[:2]
    out = torch.empty((num_seqs, num_heads, kv_lora_rank), dtype=q.dtype, device=q.device)
    for first, next_first, ints in bucket_rows(table, TABLE_ROW, "mla_decode"):
        _launch_one(q, kv_cache, layer, block_tables, seq_lens, scale, kv_lora_rank, MLADecodeConfig(*ints), out,
                    in_bucket(num_seqs, first, next_first))
    return out


def _launch_one(q, kv_cache, layer, block_tables, seq_lens, scale, kv_lora_rank, c: MLADecodeConfig, out, active):
    if c.block_h < 16 or c.block_n < 16 or c.target_programs < 1 or c.max_splits < 1:
        raise ValueError(f"block_h and block_n must be >= 16 (tl.dot), target_programs and max_splits >= 1; "
                         f"got {c}")
    num_seqs, num_heads, width = q.shape
    rope = width - kv_lora_rank
    head_blocks = triton.cdiv(num_heads, c.block_h)
    num_splits = split_count(num_seqs, head_blocks, c.target_programs, c.max_splits)
    # sized without `active` (export cannot prove num_seqs * active >= 0 for a symbolic batch): an inactive
    # bucket's partials are left unwritten
    part, lse = split_partials(out, num_splits, c.max_splits)
    wrap_triton(mla_decode_kernel)[(num_seqs * active, head_blocks, num_splits)](
        q, kv_cache, out, part, lse, block_tables, seq_lens, scale * LOG2E, num_heads, num_splits,
        layer * kv_cache.stride(0), q.stride(0), q.stride(1), out.stride(0), out.stride(1), *part.stride()[:3],
        *lse.stride()[:2], kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        RANK=kv_lora_rank, RANK_PAD=next_pow2(kv_lora_rank), ROPE=rope, ROPE_PAD=max(next_pow2(rope), 16),
        BLOCK_H=c.block_h, BLOCK_N=c.block_n, PAGE_SIZE=kv_cache.shape[3], IEEE=q.dtype == torch.float32,
        MAY_SPLIT=c.max_splits > 1, num_warps=c.num_warps, num_stages=c.num_stages,
    )
    if c.max_splits > 1:
        launch_merge_splits(part, lse, out, num_splits, c.max_splits, active)


@triton_op("atom_triton::mla_decode", mutates_args=())
def mla_decode(
    q: torch.Tensor, kv_cache: torch.Tensor, layer: int, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    scale: float, kv_lora_rank: int, table: list[int],
) -> torch.Tensor:
    return launch_mla_decode(q, kv_cache, layer, block_tables, seq_lens, scale, kv_lora_rank, table)


@triton.jit
def mla_cache_write_kernel(
    c_kv_ptr, k_pe_ptr, kv_ptr, slot_ptr,
    kv_scale_ptr,                   # [2] float32 (c_kv, k_pe) when SCALED
    layer_offset, stride_ct, stride_pt, stride_cblk, stride_crow,
    RANK: tl.constexpr, RANK_PAD: tl.constexpr, ROPE: tl.constexpr, ROPE_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr, SCALED: tl.constexpr, FP8_MAX: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        cache_dtype = kv_ptr.dtype.element_ty
        dest = kv_ptr + layer_offset + (slot // PAGE_SIZE) * stride_cblk + (slot % PAGE_SIZE) * stride_crow
        ranks, ropes = tl.arange(0, RANK_PAD), tl.arange(0, ROPE_PAD)
        c_kv = tl.load(c_kv_ptr + t * stride_ct + ranks, mask=ranks < RANK)
        tl.store(dest + ranks, _to_cache(c_kv, kv_scale_ptr, cache_dtype, SCALED, FP8_MAX), mask=ranks < RANK)
        k_pe = tl.load(k_pe_ptr + t * stride_pt + ropes, mask=ropes < ROPE)
        tl.store(dest + RANK + ropes, _to_cache(k_pe, kv_scale_ptr + 1, cache_dtype, SCALED, FP8_MAX),
                 mask=ropes < ROPE)


def launch_mla_cache_write(
    c_kv: torch.Tensor,             # [T, r] (normalized)
    k_pe: torch.Tensor,             # [T, rope] (roped)
    kv_cache: torch.Tensor,         # [L, 1, num_blocks, block_size, 1, r + rope], written in place
    layer: int,
    slot_mapping: torch.Tensor,     # [T] int64, -1 = padding (not written)
    kv_scale: torch.Tensor | None = None,   # [2] float32 (c_kv, k_pe): an fp8 cache's scales
) -> None:
    rank, rope = c_kv.shape[1], k_pe.shape[1]
    check_latent_cache(kv_cache, rank + rope)
    check_last_dim_contiguous("c_kv", c_kv)
    check_last_dim_contiguous("k_pe", k_pe)
    wrap_triton(mla_cache_write_kernel)[(c_kv.shape[0],)](
        c_kv, k_pe, kv_cache, slot_mapping, c_kv if kv_scale is None else kv_scale,
        layer * kv_cache.stride(0), c_kv.stride(0), k_pe.stride(0), kv_cache.stride(2), kv_cache.stride(3),
        RANK=rank, RANK_PAD=next_pow2(rank), ROPE=rope, ROPE_PAD=next_pow2(rope), PAGE_SIZE=kv_cache.shape[3],
        SCALED=kv_scale is not None, FP8_MAX=torch.finfo(kv_cache.dtype).max, num_warps=1,
    )


@triton_op("atom_triton::mla_cache_write", mutates_args={"kv_cache"})
def mla_cache_write(
    c_kv: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, layer: int, slot_mapping: torch.Tensor,
    kv_scale: torch.Tensor | None = None,
) -> None:
    launch_mla_cache_write(c_kv, k_pe, kv_cache, layer, slot_mapping, kv_scale)
