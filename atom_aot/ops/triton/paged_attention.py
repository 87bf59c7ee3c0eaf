"""`atom_triton::paged_attention`: causal varlen GQA attention over the paged KV cache.

Same contract as `atom::paged_attention` (atom_aot/ops/attention.py, its sinks and sliding window
included) minus the cache write: this step's keys and values are already in the cache
(`atom_triton::qk_norm_rope_cache_write` put them there), so prefill, chunked prefill, decode and any
mix of them are one call. Rows of q past query_start_loc[-1] (padding of a captured batch) come back
as zeros.

The launch config arrives as plain ints so that an exported graph carries the tuned values; the
grid and the key-split count depend only on shapes and those ints (see attention_kernels.py),
never on tensor values, so an exported graph recomputes them from each batch's sizes on the host
and the call replays inside a CUDA graph.
"""
from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_kv_cache, check_last_dim_contiguous, next_pow2
from atom_aot.ops.triton.attention_kernels import LOG2E, merge_splits_kernel, paged_attention_kernel


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int = 64           # rows per program: (query tokens per tile) x (q heads per kv head, padded)
    block_n: int = 64           # keys per inner step
    num_warps: int = 4
    num_stages: int = 2
    target_programs: int = 1    # key splits (flash-decoding) aim for this many programs: see split_count
    max_splits: int = 1         # at most this many; 1: never split (and no merge kernel)

    def as_args(self) -> tuple[int, int, int, int, int, int]:
        return (self.block_m, self.block_n, self.num_warps, self.num_stages, self.target_programs, self.max_splits)

    def as_dict(self) -> dict:
        return asdict(self)


# What the build measures per shape bucket on the target (winner -> tuning.json). Prefill favours
# big query tiles and no splits. Decode has one query per sequence: the split count adapts to the
# batch (many splits at batch 1, none at batch 256), and the candidates differ in how many
# programs they aim for (a few per SM on a 132-SM H100) and the cap on splits.
CANDIDATE_CONFIGS = {
    "prefill": (
        AttentionConfig(64, 64, 4, 2),
        AttentionConfig(128, 64, 8, 2),
        AttentionConfig(128, 32, 8, 3),
        AttentionConfig(64, 32, 4, 3),
        AttentionConfig(128, 64, 8, 3),
        AttentionConfig(128, 128, 8, 2),    # FlashAttention's Hopper tile; may not fit: tuning skips what does not
    ),
    "decode": (
        AttentionConfig(16, 64, 4, 2, 256, 16),
        AttentionConfig(16, 64, 4, 2, 512, 16),
        AttentionConfig(16, 64, 4, 2, 512, 32),
        AttentionConfig(16, 64, 4, 2, 1024, 32),
        AttentionConfig(16, 64, 4, 2, 1024, 64),
        AttentionConfig(16, 128, 4, 2, 512, 16),
        AttentionConfig(16, 128, 4, 4, 512, 16),    # long contexts in bf16 (docs/benchmarks/h100-fp8-kv-decode-attention-2026-11-25.json)
        AttentionConfig(16, 32, 2, 3, 512, 32),
        AttentionConfig(16, 128, 4, 3, 512, 16),    # fp8: two key blocks in flight (docs/benchmarks/h100-*attention*-2026-11-26.json)
        AttentionConfig(16, 32, 4, 4, 512, 16),     # fp8: three small ones
    ),
}
DEFAULT_CONFIGS = {"prefill": AttentionConfig(64, 64, 4, 2),
                   "decode": AttentionConfig(16, 64, 4, 2, 512, 32)}


def split_count(num_seqs, num_kv_heads: int, target_programs: int, max_splits: int):
    """Key splits per tile: ceil(target_programs / (num_seqs * Hkv)), at most max_splits.

    num_seqs * Hkv is about the number of programs that do work in a decode batch (one tile per
    sequence and kv head), so small batches split their keys until the GPU is full and large ones
    do not split. Works on ints and on SymInts: an exported graph computes it from the batch size.
    """
    programs = torch.sym_max(num_seqs, 1) * num_kv_heads
    return torch.sym_min((target_programs + programs - 1) // programs, max_splits)


def tile_shape(num_heads: int, num_kv_heads: int, block_m: int) -> tuple[int, int, int]:
    """(GROUP, GROUP_PAD, BLOCK_Q): q heads per kv head, padded to 2^k, and query tokens per tile."""
    group = num_heads // num_kv_heads
    group_pad = next_pow2(group)
    return group, group_pad, max(block_m // group_pad, 1)


def check_config(group_pad: int, block_q: int, block_n: int, target_programs: int, max_splits: int) -> None:
    if group_pad * block_q < 16 or block_n < 16:
        raise ValueError(f"tiles must have >= 16 rows and keys for tl.dot: block_m={group_pad * block_q} "
                         f"(for this GQA group), block_n={block_n}")
    if target_programs < 1 or max_splits < 1:
        raise ValueError(f"target_programs and max_splits must be >= 1, got {target_programs}, {max_splits}")


def launch_paged_attention(
    q: torch.Tensor,                # [T, H, D]
    kv_cache: torch.Tensor,         # [L, 2, num_blocks, block_size, Hkv, D]
    layer: int,
    block_tables: torch.Tensor,     # [B, max_blocks] int32
    seq_lens: torch.Tensor,         # [B] int32: context length once this step's tokens are in
    query_start_loc: torch.Tensor,  # [B + 1] int32
    scale: float,
    block_m: int, block_n: int, num_warps: int, num_stages: int, target_programs: int, max_splits: int,
    kv_scale: Optional[torch.Tensor] = None,   # [2] float32 (k, v): an fp8 cache's scales
    fp8_as_fp16: Optional[bool] = None,        # None: as fp8_dots_in_fp16 says (benchmarks pass both)
    maxnreg: Optional[int] = None,             # eager launches only (benchmarks): ptxas' register cap
    prefetch_pages: Optional[bool] = None,     # None: as reads_page_ids_ahead says (benchmarks pass both)
    sinks: Optional[torch.Tensor] = None,      # [H]: per-head sink logits (ops/attention.py)
    sliding_window: Optional[int] = None,      # a query sees the last this many keys, itself included
) -> torch.Tensor:
    """Launches the tile kernel and, when this batch splits its keys, the merge kernel; returns out [T, H, D]."""
    check_kv_cache(kv_cache)
    check_last_dim_contiguous("q", q)
    num_tokens, num_heads, head_dim = q.shape
    _, _, _, page_size, num_kv_heads, _ = kv_cache.shape
    num_seqs = query_start_loc.shape[0] - 1
    group, group_pad, block_q = tile_shape(num_heads, num_kv_heads, block_m)
    check_config(group_pad, block_q, block_n, target_programs, max_splits)
    num_splits = split_count(num_seqs, num_kv_heads, target_programs, max_splits)
    out, part, lse = split_outputs(q, head_dim, num_splits, max_splits)
    grid = (num_tokens // block_q + num_seqs + 1, num_kv_heads, num_splits)
    check_attention_options(sinks, sliding_window, num_heads)
    wrap_triton(paged_attention_kernel)[grid](
        q, kv_cache, out, part, lse, block_tables, seq_lens, query_start_loc,
        seq_lens if kv_scale is None else kv_scale, seq_lens if sinks is None else sinks, scale * LOG2E,
        num_tokens, num_seqs, num_splits, sliding_window or 0, layer * kv_cache.stride(0),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), *part.stride()[:3], *lse.stride()[:2],
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), kv_cache.stride(4),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_N=block_n,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), PAGE_SIZE=page_size, IEEE=q.dtype == torch.float32,
        MAY_SPLIT=max_splits > 1, KV_SCALED=kv_scale is not None,
        FP8_AS_FP16=fp8_dots_in_fp16(q.dtype, kv_cache.dtype) if fp8_as_fp16 is None else fp8_as_fp16,
        PREFETCH_PAGES=reads_page_ids_ahead(num_stages) if prefetch_pages is None else prefetch_pages,
        HAS_SINKS=sinks is not None, SLIDING=sliding_window is not None,
        num_warps=num_warps, num_stages=num_stages, **({} if maxnreg is None else {"maxnreg": maxnreg}),
    )
    if max_splits > 1:
        launch_merge_splits(part, lse, out, num_splits, max_splits)
    return out


def check_attention_options(sinks: Optional[torch.Tensor], sliding_window: Optional[int], num_heads: int) -> None:
    if sinks is not None and (sinks.shape != (num_heads,) or not sinks.is_contiguous()):
        raise ValueError(f"paged_attention: sinks must be one contiguous logit per query head ({num_heads}), got "
                         f"shape {tuple(sinks.shape)}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"paged_attention: sliding_window must be >= 1 (or None), got {sliding_window}")


def reads_page_ids_ahead(num_stages: int) -> bool:
    """Whether the kernel reads the next key block's page ids one iteration ahead (PREFETCH_PAGES): with 3+ stages.

    The read-ahead is what lets a third stage pipeline (without it Triton spends the stages on the table-then-cache
    indirection and keeps one key block in flight), and it slowed fp8 prefill tiles at 2 stages by 1-3% (H100,
    docs/benchmarks/h100-attention-prefetch-2026-11-26.json); tying it to the stages lets the build's measurement choose
    per phase, with the launch configs' fields unchanged."""
    return num_stages >= 3


def fp8_dots_in_fp16(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """Whether an fp8 cache's dots run in fp16 (for bf16 queries; fp16 queries do anyway)."""
    return kv_dtype.itemsize == 1 and q_dtype == torch.bfloat16


def split_outputs(q: torch.Tensor, dim: int, num_splits, max_splits: int):
    """(out [T, H, dim] in q's dtype, then split_partials of it)."""
    num_tokens, num_heads = q.shape[:2]
    out = torch.empty((num_tokens, num_heads, dim), dtype=q.dtype, device=q.device)
    return (out, *split_partials(out, num_splits, max_splits))


def split_partials(out: torch.Tensor, num_splits, max_splits: int):
    """(partials [T, H, S, dim] and their log2-sum-exp [T, H, S] in fp32, sized by this batch's split count) for
    `out` [T, H, dim]; without splits both are `out` itself, never touched."""
    if max_splits == 1:
        return out, out
    num_tokens, num_heads, dim = out.shape
    part = torch.empty((num_tokens, num_heads, num_splits, dim), dtype=torch.float32, device=out.device)
    lse = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=out.device)
    return part, lse


def launch_merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, num_splits, max_splits: int,
                        active=1) -> None:
    """Combine partials [T, H, S, D] by their log2-sum-exp [T, H, S] into out [T, H, D].

    No merge programs when this batch has one split (the tile kernel wrote out itself) or `active` is 0 (a
    batch-size bucket that is not this batch's): the grid's first axis is then 0, which Triton's launcher and
    AOTInductor's skip.
    """
    num_tokens, num_heads, head_dim = out.shape
    merging = torch.sym_min(num_splits - 1, 1)
    wrap_triton(merge_splits_kernel)[(num_tokens * merging * active, num_heads)](
        part, lse, out, num_splits, *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
        SPLITS_PAD=next_pow2(max_splits), HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), num_warps=4,
    )


@triton_op("atom_triton::paged_attention", mutates_args=())
def paged_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, layer: int, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor, scale: float,
    block_m: int, block_n: int, num_warps: int, num_stages: int, target_programs: int, max_splits: int,
    kv_scale: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
    sliding_window: Optional[int] = None,
) -> torch.Tensor:
    return launch_paged_attention(q, kv_cache, layer, block_tables, seq_lens, query_start_loc, scale,
                                  block_m, block_n, num_warps, num_stages, target_programs, max_splits, kv_scale,
                                  sinks=sinks, sliding_window=sliding_window)
