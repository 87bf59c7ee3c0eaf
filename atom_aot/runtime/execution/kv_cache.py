"""Allocating the one KV-cache tensor that every layer's attention shares, from the artifact's KV cache spec
(atom_aot/artifact/kv_cache.py: its dtype, and the layout the model class decided: per-head k/v, or MLA's latent)."""
from __future__ import annotations

import torch

from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.dtypes import torch_dtype


def allocate_kv_cache(spec: KVCacheSpec, num_blocks: int, block_size: int, device: torch.device) -> torch.Tensor:
    """[num_layers, parts, num_blocks, block_size, heads, dim] (the spec's layout).

    Attention reads only slots already written, so the CPU pool is left uninitialized (zeroing
    a GiB there costs seconds of page faults); GPU kernels load whole tiles, so there it is
    zeroed, which is a memset at memory bandwidth.
    """
    make = torch.empty if device.type == "cpu" else torch.zeros
    return make(*spec.shape(num_blocks, block_size), dtype=torch_dtype(spec.dtype), device=device)
