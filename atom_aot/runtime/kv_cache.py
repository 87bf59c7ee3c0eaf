"""Sizing and allocating the one KV-cache tensor that every layer's attention shares."""
from __future__ import annotations

import torch

from atom_aot.models import ModelConfig


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return cfg.num_hidden_layers * 2 * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """[num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim].

    Attention reads only slots already written, so the CPU pool is left uninitialized (zeroing
    a GiB there costs seconds of page faults); GPU kernels load whole tiles, so there it is
    zeroed, which is a memset at memory bandwidth.
    """
    make = torch.empty if device.type == "cpu" else torch.zeros
    return make(cfg.num_hidden_layers, 2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                       dtype=dtype, device=device)
