"""Sizing and allocating the one KV-cache tensor that every layer's attention shares; its shape is
the model class's `kv_cache_layout` (atom_aot/models/kv_layout.py: per-head k/v, or MLA's latent)."""
from __future__ import annotations

import torch

from atom_aot.models import ModelConfig, model_class


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return model_class(cfg.architecture).kv_cache_layout(cfg).elements_per_token() * block_size * elem


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """[num_layers, parts, num_blocks, block_size, heads, dim] (the model's layout).

    No slot outside a sequence's context reaches attention's output (the batched MLA decode rows
    read such slots and zero them, ops/mla.py), so the CPU pool is left uninitialized: it may hold
    NaN or inf, and tests fill it with NaN to prove that (zeroing a GiB there costs seconds of page
    faults). GPU kernels load whole tiles, so there it is zeroed, a memset at memory bandwidth.
    """
    make = torch.empty if device.type == "cpu" else torch.zeros
    shape = model_class(cfg.architecture).kv_cache_layout(cfg).shape(num_blocks, block_size)
    return make(*shape, dtype=dtype, device=device)
