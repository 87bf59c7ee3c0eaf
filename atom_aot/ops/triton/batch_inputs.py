"""Random paged batches: what the build times the kernels on (build/tune.py), and what the kernel
tests and scripts/bench_kernels.py check them on.

Everything is drawn fresh from a generator (never zeros) so that a kernel that skips a row or
reads the wrong slot cannot pass by accident.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    """One step's attention inputs over a random paged cache (see atom_aot/ops/attention.py)."""
    kv_cache: torch.Tensor         # [L, 2, num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor     # [B, max_blocks] int32 (unused entries point at random blocks)
    seq_lens: torch.Tensor         # [B] int32: context + new tokens
    query_start_loc: torch.Tensor  # [B + 1] int32
    slot_mapping: torch.Tensor     # [T] int64: slots of the new tokens, -1 for padding rows
    positions: torch.Tensor        # [T] int64: position of each new token (0 for padding rows)
    num_real_tokens: int           # rows of q that belong to a sequence; the rest is padding


def make_paged_batch(context_lens: list[int], query_lens: list[int], num_kv_heads: int, head_dim: int,
                     block_size: int = 16, num_layers: int = 2, pad_tokens: int = 0,
                     dtype: torch.dtype = torch.float32, device: str = "cpu",
                     generator: torch.Generator | None = None) -> PagedBatch:
    """Sequence b has context_lens[b] cached tokens and query_lens[b] new ones (seq_len = sum).

    Blocks are handed out in a random order so that logical and physical block order differ; the
    cache is filled with random values everywhere, new tokens' slots included.
    """
    g = generator or torch.Generator().manual_seed(0)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_per_seq) + 1
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g)
    block_tables = torch.randint(0, num_blocks, (len(seq_lens), max_blocks), generator=g)
    slots, positions, taken = [], [], 0
    for b, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        block_tables[b, :blocks_per_seq[b]] = perm[taken:taken + blocks_per_seq[b]]
        taken += blocks_per_seq[b]
        for pos in range(ctx, ctx + n):
            slots.append(int(block_tables[b, pos // block_size]) * block_size + pos % block_size)
            positions.append(pos)
    slots += [-1] * pad_tokens
    positions += [0] * pad_tokens
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    if device == "cpu":
        kv_cache = torch.randn(shape, generator=g).to(dtype)
    else:   # big caches: draw on the device (seeded from g, still never zeros)
        dev_g = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
        kv_cache = torch.randn(shape, generator=dev_g, device=device,
                               dtype=torch.float32 if dtype.itemsize == 1 else dtype).to(dtype)
    starts = torch.tensor([0] + query_lens).cumsum(0)
    return PagedBatch(
        kv_cache=kv_cache.to(device),
        block_tables=block_tables.to(torch.int32).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=starts.to(torch.int32).to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        num_real_tokens=sum(query_lens),
    )
