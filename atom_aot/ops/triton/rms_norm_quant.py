"""Residual add, RMSNorm and per-token FP8 quantization in one pass: the input of an FP8 qkv or gate_up projection.

    x [M, H], residual [M, H], weight [H] -> q [M, H] e4m3, scale [M, 1] float32, x + residual [M, H]
    with q * scale ~= rms_norm(x + residual) * weight

What Inductor makes of the same torch code (models/layers.RMSNorm, then ops/fp8.quantize_activations) is one
looped reduction kernel that walks the row three times (the sum of squares, the amax of the normalized row, the
quantization), re-reading x and the residual each time. Here one program holds the row in registers (BLOCK_N =
the next power of two of H, num_warps spreading it), so both are read once and the residual, q and the scale
written once. The build measures both per phase (build/tune_fp8.measure_rms_norm_quant) and keeps the faster.

The numerics are the eager model's: the add rounded to the activation dtype, normalized in float32 and cast
back, times the weight (rounded), then quantized as quantize_activations does (amax / 448 as Triton divides by
a constant, which matched CUDA eager's reciprocal product in silu_mul_quant's H100 tests; y / scale
IEEE-rounded), so the eager reference is the check. rsqrt and the sum's order may move an element by one e4m3
step (tests/test_rms_norm_quant.py bounds how often).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.fp8 import FP8_DTYPE, FP8_MAX, MIN_SCALE, ONE_PROGRAM_ROW, fits_one_program
from atom_aot.ops.triton._common import check_last_dim_contiguous, next_pow2, store_row_quantized

CANDIDATE_WARPS = (4, 8, 16)          # the build measures these against Inductor's kernel (tune_fp8.py)


@triton.jit
def add_rms_norm_quant_kernel(x_ptr, res_ptr, w_ptr, q_ptr, scale_ptr, sum_ptr, N,
                              stride_x, stride_r, stride_q, stride_s,
                              EPS: tl.constexpr, FP8_LIMIT: tl.constexpr, SCALE_FLOOR: tl.constexpr,
                              BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    r = tl.load(res_ptr + row * stride_r + cols, mask=ok, other=0.0)
    h = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)               # x + residual, rounded as eager
    tl.store(sum_ptr + row * stride_s + cols, h, mask=ok)
    hf = h.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(hf * hf, axis=0) / N + EPS)
    normed = (hf * rstd).to(x.dtype)                                    # normalized in float32, cast back
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    y = (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype).to(tl.float32)   # weight * it, rounded
    store_row_quantized(y, q_ptr + row * stride_q, scale_ptr + row, cols, ok, FP8_LIMIT, SCALE_FLOOR)


def launch_add_rms_norm_quant(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              num_warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [M, H] e4m3, scale [M, 1] float32, x + residual [M, H]) of x, residual [M, H] and the norm's weight [H]."""
    if x.dim() != 2 or residual.shape != x.shape or weight.shape != x.shape[1:]:
        raise ValueError(f"add_rms_norm_quant takes x and residual [M, H] and weight [H], got x {tuple(x.shape)}, "
                         f"residual {tuple(residual.shape)}, weight {tuple(weight.shape)}")
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        check_last_dim_contiguous(name, t)
    m, n = x.shape
    if not fits_one_program(n):
        raise ValueError(f"add_rms_norm_quant holds rows of up to {ONE_PROGRAM_ROW} values, got {n}")
    q = torch.empty((m, n), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    summed = torch.empty_like(x)
    wrap_triton(add_rms_norm_quant_kernel)[(m,)](x, residual, weight, q, scale, summed, n,
                                                 x.stride(0), residual.stride(0), q.stride(0), summed.stride(0),
                                                 EPS=float(eps), FP8_LIMIT=FP8_MAX, SCALE_FLOOR=MIN_SCALE,
                                                 BLOCK_N=next_pow2(n), num_warps=num_warps)
    return q, scale, summed


@triton_op("atom_triton::add_rms_norm_quant", mutates_args=())
def add_rms_norm_quant(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       num_warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of the residual add, RMSNorm and per-token fp8 quantization (module docstring)."""
    return launch_add_rms_norm_quant(x, residual, weight, eps, num_warps)
