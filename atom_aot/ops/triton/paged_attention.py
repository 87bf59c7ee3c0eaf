"""`atom_triton::paged_attention`: causal varlen GQA attention over the paged KV cache.

Same contract as `atom::paged_attention` (atom_aot/ops/attention.py) minus the cache write: this
step's keys and values are already in the cache (`atom_triton::qk_norm_rope_cache_write` put them
there), so prefill, chunked prefill, decode and any mix of them are one call. Rows of q past
query_start_loc[-1] (padding of a captured batch) come back as zeros.

The launch config arrives as plain ints so that an exported graph carries the tuned values; the
grid depends only on shapes and those ints (see attention_kernels.py), never on tensor values,
so the call replays inside a CUDA graph.
"""
from dataclasses import asdict, dataclass

import torch
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_kv_cache, check_last_dim_contiguous, next_pow2
from atom_aot.ops.triton.attention_kernels import LOG2E, merge_splits_kernel, paged_attention_kernel


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int = 64       # rows per program: (query tokens per tile) x (q heads per kv head, padded)
    block_n: int = 64       # keys per inner step
    num_splits: int = 1     # key-range splits (flash-decoding); > 1 adds a merge kernel
    num_warps: int = 4
    num_stages: int = 2

    def as_args(self) -> tuple[int, int, int, int, int]:
        return (self.block_m, self.block_n, self.num_splits, self.num_warps, self.num_stages)

    def as_dict(self) -> dict:
        return asdict(self)


# What the build measures per shape bucket on the target (winner -> tuning.json). Prefill favours
# big query tiles and no splits; decode has one query per sequence, so the splits fill the GPU.
CANDIDATE_CONFIGS = {
    "prefill": (
        AttentionConfig(64, 64, 1, 4, 2),
        AttentionConfig(128, 64, 1, 8, 2),
        AttentionConfig(128, 32, 1, 8, 3),
        AttentionConfig(64, 32, 1, 4, 3),
    ),
    "decode": (
        AttentionConfig(16, 64, 1, 4, 2),
        AttentionConfig(16, 64, 4, 4, 2),
        AttentionConfig(16, 64, 8, 4, 2),
        AttentionConfig(16, 64, 16, 4, 2),
        AttentionConfig(16, 128, 16, 4, 2),
        AttentionConfig(16, 64, 32, 4, 2),
        AttentionConfig(16, 32, 8, 2, 3),
    ),
}
DEFAULT_CONFIGS = {"prefill": AttentionConfig(64, 64, 1, 4, 2), "decode": AttentionConfig(16, 64, 8, 4, 2)}


def tile_shape(num_heads: int, num_kv_heads: int, block_m: int) -> tuple[int, int, int]:
    """(GROUP, GROUP_PAD, BLOCK_Q): q heads per kv head, padded to 2^k, and query tokens per tile."""
    group = num_heads // num_kv_heads
    group_pad = next_pow2(group)
    return group, group_pad, max(block_m // group_pad, 1)


def launch_paged_attention(
    q: torch.Tensor,                # [T, H, D]
    kv_cache: torch.Tensor,         # [L, 2, num_blocks, block_size, Hkv, D]
    layer: int,
    block_tables: torch.Tensor,     # [B, max_blocks] int32
    seq_lens: torch.Tensor,         # [B] int32: context length once this step's tokens are in
    query_start_loc: torch.Tensor,  # [B + 1] int32
    scale: float,
    block_m: int, block_n: int, num_splits: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    """Launches the tile kernel (and the merge kernel when num_splits > 1); returns out [T, H, D]."""
    check_kv_cache(kv_cache)
    check_last_dim_contiguous("q", q)
    num_tokens, num_heads, head_dim = q.shape
    _, _, _, page_size, num_kv_heads, _ = kv_cache.shape
    num_seqs = query_start_loc.shape[0] - 1
    group, group_pad, block_q = tile_shape(num_heads, num_kv_heads, block_m)
    if group_pad * block_q < 16 or block_n < 16:
        raise ValueError(f"tiles must have >= 16 rows and keys for tl.dot: block_m={block_m}, block_n={block_n}")
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_splits > 1:
        # partial outputs and their log2-sum-exp, merged below
        part = torch.empty((num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device)
        dest, part_strides, lse_strides = part, part.stride()[:3], lse.stride()[:2]
    else:
        dest, lse = out, out   # lse is never touched with one split
        part_strides, lse_strides = (out.stride(0), out.stride(1), 0), (0, 0)
    grid = (num_tokens // block_q + num_seqs + 1, num_kv_heads, num_splits)
    wrap_triton(paged_attention_kernel)[grid](
        q, kv_cache, dest, lse, block_tables, seq_lens, query_start_loc,
        scale * LOG2E, num_tokens, num_seqs, layer * kv_cache.stride(0),
        q.stride(0), q.stride(1), *part_strides, *lse_strides,
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), kv_cache.stride(4),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_N=block_n,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), PAGE_SIZE=page_size,
        NUM_SPLITS=num_splits, IEEE=q.dtype == torch.float32,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        wrap_triton(merge_splits_kernel)[(num_tokens, num_heads)](
            part, lse, out, *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, SPLITS_PAD=next_pow2(num_splits),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), num_warps=4,
        )
    return out


@triton_op("atom_triton::paged_attention", mutates_args=())
def paged_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, layer: int, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor, scale: float,
    block_m: int, block_n: int, num_splits: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    return launch_paged_attention(q, kv_cache, layer, block_tables, seq_lens, query_start_loc, scale,
                                  block_m, block_n, num_splits, num_warps, num_stages)
