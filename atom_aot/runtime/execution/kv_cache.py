"""Allocating the one KV-cache tensor that every layer's attention shares, from the artifact's KV cache spec
(atom_aot/artifact/kv_cache.py: its dtype, and the layout the model class decided: per-head k/v, or MLA's latent)."""
from __future__ import annotations

import torch

from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.dtypes import torch_dtype


def allocate_kv_cache(spec: KVCacheSpec, num_blocks: int, block_size: int, device: torch.device) -> torch.Tensor:
    """[num_layers, parts, num_blocks, block_size, heads, dim] (the spec's layout).

    No slot outside a sequence's context reaches attention's output (the batched MLA decode rows
    read such slots and zero them, ops/mla.py), so the CPU pool is left uninitialized: it may hold
    NaN or inf, and tests fill it with NaN to prove that (zeroing a GiB there costs seconds of page
    faults). GPU kernels load whole tiles, so there it is zeroed, a memset at memory bandwidth.
    """
    make = torch.empty if device.type == "cpu" else torch.zeros
    return make(*spec.shape(num_blocks, block_size), dtype=torch_dtype(spec.dtype), device=device)
