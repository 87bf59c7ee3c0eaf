"""Sizing and allocating the one KV-cache tensor that every layer's attention shares; its shape is
the model class's `kv_cache_layout` (atom_aot/models/kv_layout.py: per-head k/v, or MLA's latent)."""
from __future__ import annotations

import torch

from atom_aot.models import ModelConfig, model_class


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return model_class(cfg.architecture).kv_cache_layout(cfg).elements_per_token() * block_size * elem


def built_page_order(cfg: ModelConfig, dtype: torch.dtype) -> str:
    """The page order atom-build gives a cache of this model and dtype (and records in the manifest): what the
    build's own graph probe allocates, before the manifest exists."""
    return model_class(cfg.architecture).kv_cache_layout(cfg).page_order(dtype)


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device, page_order: str) -> torch.Tensor:
    """[num_layers, parts, num_blocks, block_size, heads, dim] (the model's layout) in `page_order`: the
    artifact's (manifest numerics), which its compiled graphs were traced with (models/kv_layout.py).

    Attention reads only slots already written, so the CPU pool is left uninitialized (zeroing
    a GiB there costs seconds of page faults); GPU kernels load whole tiles, so there it is
    zeroed, which is a memset at memory bandwidth.
    """
    layout = model_class(cfg.architecture).kv_cache_layout(cfg)
    return layout.allocate(num_blocks, block_size, dtype, device, page_order, zeroed=device.type != "cpu")
