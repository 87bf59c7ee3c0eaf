"""Small helpers the Triton op modules share."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


def next_pow2(n: int) -> int:
    """Triton tiles are powers of two; shapes that are not get padded and masked."""
    return triton.next_power_of_2(n)


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    """Kernels index rows by stride but assume the last dimension is dense (vector loads)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {tuple(t.stride())}")


def check_kv_cache(kv_cache: torch.Tensor) -> None:
    # kv_cache: [L, 2, num_blocks, block_size, Hkv, D]
    if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
        raise ValueError(f"kv_cache must be [L, 2, num_blocks, block_size, Hkv, D], got {tuple(kv_cache.shape)}")
    check_last_dim_contiguous("kv_cache", kv_cache)


@dataclass(frozen=True)
class GemmConfig:
    """A tiled GEMM kernel's launch config (the FP8 and INT4 linears'): what the build measures and stores."""
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def as_args(self) -> tuple[int, int, int, int, int]:
        return (self.block_m, self.block_n, self.block_k, self.num_warps, self.num_stages)


@dataclass(frozen=True)
class SmallMConfig:
    """The small-M FP8 GEMM's launch config (ops/triton/small_m_gemm.py) and the token count it serves up to."""
    max_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int

    def as_args(self) -> tuple[int, int, int, int, int]:
        return (self.block_n, self.block_k, self.split_k, self.num_warps, self.num_stages)
