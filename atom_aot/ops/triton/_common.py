"""Small helpers the Triton op modules share."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


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


def in_bucket(count, first: int, next_first: int | None):
    """1 if first <= count < next_first, else 0; on a SymInt an expression of it, never a guard. A kernel
    launched with this factor in its grid runs only for its bucket's counts (a grid of 0 launches nothing), so
    one exported graph carries every bucket's config and a CUDA graph of one batch size captures one."""
    def at_least(n: int):
        return torch.sym_min(torch.sym_max(count - n + 1, 0), 1)
    return at_least(first) - (0 if next_first is None else at_least(next_first))


def bucket_rows(table: list[int], row: int, what: str) -> list[tuple[int, int | None, tuple[int, ...]]]:
    """A flat table of rows [first count, config ints...] as (first, next bucket's first or None, ints),
    adjacent equal configs merged; the first row must start at 1 so every count has a config."""
    rows = [tuple(table[i:i + row]) for i in range(0, len(table), row)]
    if not rows or len(table) % row or rows[0][0] != 1 or any(a[0] >= b[0] for a, b in zip(rows, rows[1:])):
        raise ValueError(f"the {what} config table must be rows of [first count, {row - 1} ints], the first "
                         f"starting at 1, ascending; got {table}")
    merged: list[tuple[int, tuple[int, ...]]] = []
    for first, *ints in rows:
        if not merged or merged[-1][1] != tuple(ints):
            merged.append((first, tuple(ints)))
    nexts = [first for first, _ in merged[1:]] + [None]
    return [(first, nxt, ints) for (first, ints), nxt in zip(merged, nexts)]


@triton.jit
def dot_acc(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b; IEEE: in full fp32 (fp32 operands: no tf32), as the references compute."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


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


@triton.jit
def store_row_quantized(y, q_row_ptr, scale_ptr, cols, ok, FP8_LIMIT: tl.constexpr, SCALE_FLOOR: tl.constexpr):
    """A row y (float32, in registers) quantized per token as ops/fp8.quantize_activations does: q = y / scale
    (IEEE-rounded) clamped to +-FP8_LIMIT at q_row_ptr + cols, scale = amax / FP8_LIMIT (Triton's division by the
    constant: CUDA eager's reciprocal product on an H100; see ops/triton/silu_mul_quant.py) floored at SCALE_FLOOR
    at scale_ptr. The one-pass quantizing kernels (silu_mul_quant, rms_norm_quant) end here."""
    scale = tl.maximum(tl.max(tl.abs(y), axis=0) / FP8_LIMIT, SCALE_FLOOR)
    q = tl.clamp(tl.math.div_rn(y, tl.zeros_like(y) + scale), -FP8_LIMIT, FP8_LIMIT)
    tl.store(q_row_ptr + cols, q.to(q_row_ptr.dtype.element_ty), mask=ok)
    tl.store(scale_ptr, scale)


@dataclass(frozen=True)
class RowConfig:
    """A one-program-per-row kernel's launch config (ops/triton/silu_mul_quant.py, rms_norm_quant.py)."""
    num_warps: int

    def as_args(self) -> tuple[int]:
        return (self.num_warps,)


@dataclass(frozen=True)
class SmallMConfig:
    """A small-M GEMM's launch config (ops/triton/small_m_gemm.py: fp8, int8; int4_small_m.py) and the token
    count it serves up to."""
    max_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int

    def as_args(self) -> tuple[int, int, int, int, int]:
        return (self.block_n, self.block_k, self.split_k, self.num_warps, self.num_stages)
