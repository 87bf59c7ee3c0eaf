"""SiLU-mul and per-token FP8 quantization in one pass: the input of an FP8 MLP's down projection.

    gate_up [M, 2N] -> q [M, N] e4m3, scale [M, 1] float32 with q * scale ~= silu(gate) * up

What Inductor makes of the same torch code (ops/fp8.quantize_activations after F.silu(gate) * up) is a
looped row reduction for the amax and a second kernel for the quantization, each reading the row of
gate and up from memory (rows of 14336 are past its persistent-reduction size): 20.9 us per layer at
256 tokens and 316 us at 8192 on an H100 for Llama-3.1-8B (docs/benchmarks/h100-silu-mul-quant-2026-11-26.json),
about 11% of a prefill step. Here one program holds a whole row in registers (BLOCK_N = next power of
two of N, num_warps spreading it), so gate and up are read once and q written once: 13.6 us at 256 tokens
and 251 us at 8192 on an H100 (docs/kernels.md).

The numerics are the eager model's: silu(gate) and the product are rounded to the activation dtype, as
F.silu(gate) * up is, then quantized as quantize_activations does (amax / 448, floored at MIN_SCALE; y / scale IEEE-rounded), so
the eager reference is the check on either device. The scale's division is Triton's by a constant: on an H100
it equals CUDA eager's amax / 448, which torch computes as amax times the fp32 reciprocal of 448 (a CPU
scalar divisor); the interpreter divides as CPU eager does. An IEEE division there (div_rn) differed from
CUDA eager by an ulp on some rows, enough to flip q's rounding (seen on an H100).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.fp8 import FP8_DTYPE, FP8_MAX, MIN_SCALE, ONE_PROGRAM_ROW, fits_one_program
from atom_aot.ops.triton._common import check_last_dim_contiguous, next_pow2, store_row_quantized

CANDIDATE_WARPS = (4, 8, 16, 32)          # the build measures these against Inductor's kernels (tune_fp8.py)


@triton.jit
def silu_mul_quant_kernel(x_ptr, q_ptr, scale_ptr, N, stride_x, stride_q,
                          FP8_LIMIT: tl.constexpr, SCALE_FLOOR: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < N
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    up = tl.load(x_ptr + row * stride_x + N + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    act = (g * tl.sigmoid(g)).to(gate.dtype)                            # F.silu(gate), rounded as eager
    y = (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype).to(tl.float32)   # * up, rounded as eager
    store_row_quantized(y, q_ptr + row * stride_q, scale_ptr + row, cols, ok, FP8_LIMIT, SCALE_FLOOR)


def launch_silu_mul_quant(gate_up: torch.Tensor, num_warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up [M, 2N] (gate columns first, as GatedMLP's chunk(2)) -> (q [M, N] e4m3, scale [M, 1])."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul_quant takes gate_up [M, 2N], got {tuple(gate_up.shape)}")
    check_last_dim_contiguous("gate_up", gate_up)
    m, n = gate_up.shape[0], gate_up.shape[1] // 2
    if not fits_one_program(n):
        raise ValueError(f"silu_mul_quant holds rows of up to {ONE_PROGRAM_ROW} outputs, got {n}")
    q = torch.empty((m, n), dtype=FP8_DTYPE, device=gate_up.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=gate_up.device)
    wrap_triton(silu_mul_quant_kernel)[(m,)](gate_up, q, scale, n, gate_up.stride(0), q.stride(0),
                                             FP8_LIMIT=FP8_MAX, SCALE_FLOOR=MIN_SCALE, BLOCK_N=next_pow2(n),
                                             num_warps=num_warps)
    return q, scale


@triton_op("atom_triton::silu_mul_quant", mutates_args=())
def silu_mul_quant(gate_up: torch.Tensor, num_warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass of silu(gate) * up and its per-token fp8 quantization (module docstring)."""
    return launch_silu_mul_quant(gate_up, num_warps)
