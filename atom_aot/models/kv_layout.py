"""The shape of the one KV-cache tensor, as the model class decides it.

Every layout has the signature's six named dimensions (atom_aot/artifact/signature.py):

    dense (per-head k and v):       [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
    latent (MLA: c_kv | k_pe):      [num_layers, 1, num_blocks, block_size, 1, kv_lora_rank + rope_dim]

so the runtime sizes, allocates and passes the cache without knowing which one it holds.

Those dimensions are the cache's logical order; its page order says how a block's slots lie in memory:

    slot-major: a block is [block_size, heads, dim] (the logical order, a contiguous tensor)
    head-major: a block is [heads, block_size, dim] (one head's slots together), seen through the logical
                order by its strides

Every kernel addresses the cache by strides, so both orders run the same code; but an exported graph is
traced with the strides of its example cache, so the artifact records its order (manifest `numerics`) and
every cache the runtime allocates for it must have it (`allocate`). Dense fp8 caches are head-major: decode
and prefill attention over them 2-3.5% faster on an H100, bf16 unchanged
(docs/benchmarks/h100-s45-attention-head-major*.json); everything else is slot-major.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_aot.artifact.manifest import KV_PAGE_ORDERS


@dataclass(frozen=True)
class KVCacheLayout:
    num_layers: int        # cache layers: the decoder's, plus any MTP layers that attend
    parts: int             # 2: separate k and v; 1: one latent vector per token
    heads: int
    dim: int

    def shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (self.num_layers, self.parts, num_blocks, block_size, self.heads, self.dim)

    def elements_per_token(self) -> int:
        """Cache elements one token takes over all layers."""
        return self.num_layers * self.parts * self.heads * self.dim

    def page_order(self, kv_dtype: torch.dtype) -> str:
        """The page order a cache of this layout and dtype is built with (module docstring)."""
        return "head-major" if self.parts == 2 and kv_dtype.itemsize == 1 else "slot-major"

    def allocate(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str,
                 page_order: str, zeroed: bool = True) -> torch.Tensor:
        """A cache of `shape(num_blocks, block_size)` whose memory is in `page_order` (zeroed, or left as it
        comes: torch.empty)."""
        if page_order not in KV_PAGE_ORDERS:
            raise ValueError(f"unknown KV page order {page_order!r}; known: {', '.join(KV_PAGE_ORDERS)}")
        make = torch.zeros if zeroed else torch.empty
        if page_order == "slot-major":
            return make(*self.shape(num_blocks, block_size), dtype=dtype, device=device)
        pages = make(self.num_layers, self.parts, num_blocks, self.heads, block_size, self.dim, dtype=dtype,
                     device=device)
        return pages.permute(0, 1, 2, 4, 3, 5)


def page_order_of(cache: torch.Tensor) -> str:
    """Which page order `cache` [L, parts, blocks, block_size, heads, dim] has in memory (its strides)."""
    _, _, _, block_size, heads, dim = cache.shape
    if cache.stride(5) == 1 and cache.stride(4) == block_size * dim and cache.stride(3) == dim and heads > 1:
        return "head-major"
    return "slot-major"

