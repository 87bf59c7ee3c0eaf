"""The shape of the one KV-cache tensor, as the model class decides it.

Every layout has the signature's six named dimensions (atom_aot/artifact/signature.py):

    dense (per-head k and v):       [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
    latent (MLA: c_kv | k_pe):      [num_layers, 1, num_blocks, block_size, 1, kv_lora_rank + rope_dim]

so the runtime sizes, allocates and passes the cache without knowing which one it holds.
"""
from __future__ import annotations

from dataclasses import dataclass


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
