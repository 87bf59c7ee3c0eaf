"""`atom_triton::int4_linear_small_m`: the W4A16 linear for a handful of tokens (decode at small batch).

At M = 1..16 an int4 linear is a stream of a quarter of bf16's weight bytes, and the M x N tiling of
int4_gemm.py leaves SMs idle (Llama-3.1-8B's qkv_proj at BLOCK_N 64: 96 programs on 132 SMs, each
walking all of K). As the fp8/int8 small-M kernel (small_m_gemm.py) this one tiles the *weight*:

    acc^T [BLOCK_N, BLOCK_M] = (BIAS + q) [BLOCK_N, BLOCK_K] @ x^T [BLOCK_K, BLOCK_M]  - (BIAS + z) x sums
    grid = (N / BLOCK_N, SPLIT_K, M / BLOCK_M)

with the nibbles widened by bit patterns (int4_gemm.biased_nibbles: no conversion instruction) and the
zero point taken off after the dot (int4_gemm.py's docstring). Each K step lies in one group (BLOCK_K
divides the group size) and is scaled by it; SPLIT_K > 1 writes float32 partials (scaled already)
that small_m_gemm's reduce kernel adds, with the bias, into the output.
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton.int4_gemm import biased_nibbles, biased_zeros, int4_operands
from atom_aot.ops.triton.small_m_gemm import (BLOCK_M, REDUCE_BLOCK, k_per_split, split_k_reduce_kernel,
                                             store_swapped_tile)

# (block_n, block_k, split_k, num_warps, num_stages): what the build measures at decode sizes. block_k 256
# only for per-channel weights (a K step must lie in one group of 128).
CANDIDATE_CONFIGS = (
    (64, 128, 1, 4, 4),
    (64, 128, 2, 4, 4),
    (64, 128, 4, 4, 4),
    (32, 128, 2, 4, 4),
    (128, 128, 1, 4, 3),
    (128, 128, 2, 8, 3),
    (64, 64, 4, 4, 4),
    (64, 256, 1, 4, 4),
)


@triton.jit
def int4_small_m_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, part_ptr, bias_ptr,
    M, N, stride_xm, stride_wn, stride_om,
    K: tl.constexpr, K_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, GROUPS: tl.constexpr,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """acc^T = ((q - z) s)[n tile, k slice] @ x[m tile, k slice]^T; the output (SPLIT_K 1) or a float32 partial."""
    HALF: tl.constexpr = BLOCK_K // 2
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                               # [BLOCK_N]
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                               # [BLOCK_M]
    rk, rj = tl.arange(0, BLOCK_K), tl.arange(0, HALF)
    n_ok, m_ok = rn < N, rm < M
    rn64, rm64 = rn.to(tl.int64), rm.to(tl.int64)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    if GROUPS == 1:
        zb = biased_zeros(tl.load(z_ptr + rn64, mask=n_ok, other=0), DTYPE)   # [BLOCK_N] BIAS + z
    k_begin = pid_k * K_PER_SPLIT
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        kb = k_begin + k0
        k = kb + rk
        packed = tl.load(w_ptr + rn64[:, None] * stride_wn + (kb // 2 + rj)[None, :],
                         mask=n_ok[:, None] & (kb // 2 + rj < K // 2)[None, :], other=0)   # [BLOCK_N, HALF]
        xt = tl.load(x_ptr + rm64[None, :] * stride_xm + k[:, None], mask=m_ok[None, :] & (k < K)[:, None],
                     other=0.0)                                                # [BLOCK_K, BLOCK_M] (x^T)
        if GROUPS > 1:          # a step past K (the slices' round-up) has no group: its zeros and scales are not
            group = kb * GROUPS // K                # read (past the last row's, 0 x whatever lies there can be NaN)
            g_ok = n_ok & (kb < K)
            zb = biased_zeros(tl.load(z_ptr + rn64 * GROUPS + group, mask=g_ok, other=0), DTYPE)
        w = biased_nibbles(packed, BLOCK_N, HALF, DTYPE)                       # [BLOCK_N, BLOCK_K] BIAS + q
        if IEEE:
            partial = tl.dot(w - zb[:, None], xt, input_precision="ieee")
        else:
            col_sums = tl.sum(xt.to(tl.float32), axis=0)                       # [BLOCK_M]
            partial = tl.dot(w, xt) - zb[:, None] * col_sums[None, :]
        if GROUPS > 1:
            acc += partial * tl.load(s_ptr + rn64 * GROUPS + group, mask=g_ok, other=0.0)[:, None]
        else:
            acc += partial
    if GROUPS == 1:
        acc = acc * tl.load(s_ptr + rn64, mask=n_ok, other=0.0)[:, None]
    store_swapped_tile(acc, out_ptr, part_ptr, bias_ptr, rn64, rm64, n_ok, m_ok, pid_k, M, N, stride_om,
                       SPLIT_K, HAS_BIAS)            # split K: float32 partials, already scaled


def launch_int4_small_m(
    x: torch.Tensor,                        # [M, K] bf16/fp16/fp32
    weight: torch.Tensor,                   # [N, K/2] uint8
    weight_scale: torch.Tensor,             # [N, G] float32
    weight_zero: torch.Tensor,              # [N, G] uint8
    bias: Optional[torch.Tensor],           # [N] or None
    block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    x, scale, zero = int4_operands(x, weight, weight_scale, weight_zero, block_k)
    (m, k), n, groups = x.shape, weight.shape[0], scale.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    per_split = k_per_split(k, block_k, split_k)
    part = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device) if split_k > 1 else out
    bias_arg = scale if bias is None else bias
    wrap_triton(int4_small_m_kernel)[(triton.cdiv(n, block_n), split_k, triton.cdiv(m, BLOCK_M))](
        x, weight, scale, zero, out, part, bias_arg,
        m, n, x.stride(0), weight.stride(0), out.stride(0),
        K=k, K_PER_SPLIT=per_split, SPLIT_K=split_k, GROUPS=groups, HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )
    if split_k > 1:                         # partials carry their scales: the reduce adds, biases and casts
        wrap_triton(split_k_reduce_kernel)[(triton.cdiv(n, REDUCE_BLOCK), m)](
            part, out, part, part, bias_arg, m, n, out.stride(0), 0,
            SPLIT_K=split_k, HAS_BIAS=bias is not None, SCALED=True, BLOCK=REDUCE_BLOCK, num_warps=4,
        )
    return out


@triton_op("atom_triton::int4_linear_small_m", mutates_args=())
def int4_linear_small_m(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_zero: torch.Tensor,
    bias: Optional[torch.Tensor], block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    return launch_int4_small_m(x, weight, weight_scale, weight_zero, bias,
                               block_n, block_k, split_k, num_warps, num_stages)
