"""The W8A8 GEMM (FP8 e4m3 or INT8) for a handful of tokens (decode at small batch): swapped operands
and split K.

At M = 1..16 a linear is a weight stream: the time is the weight's bytes over the memory bandwidth,
and the usual M x N output tiling leaves most SMs idle (cuBLASLt's 128 x 128 tile gives a
4096-wide output 32 programs). This kernel tiles the *weight* instead, which is how vLLM's CUTLASS
and TensorRT-LLM's small-M FP8 kernels are laid out:

    acc^T [BLOCK_N, BLOCK_M] = w [BLOCK_N, BLOCK_K] @ x^T [BLOCK_K, BLOCK_M]     (the weight is the MMA's
                                                                              wide operand; M pads to BLOCK_M)
    grid = (N / BLOCK_N, SPLIT_K, M / BLOCK_M)                                 (SPLIT_K slices of K per tile)

SPLIT_K = 1 scales and stores the tile in the same program. SPLIT_K > 1 writes partial sums (float32;
int32 for int8, whose sums stay exact), and a second kernel adds the slices, applies the scales and
bias and casts (a few microseconds on an [M, N] output). INT8 operands (ops/int8.py: per-channel
weights, per-token or static activations) accumulate in int32, exact. Per-channel layouts (weight_scale [N]; activation scale [M, 1], per token or
static) scale the sum at the end; 128x128 block-scaled weights (activation groups of 1 x 128) scale
each K step's product, with BLOCK_K dividing 128 (the configs with block_k 256 and 512 are per-channel
only).
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.fp8 import BLOCK, check_block_shapes, is_block_scaled
from atom_aot.ops.triton._common import check_last_dim_contiguous

# (block_n, block_k, split_k, num_warps, num_stages): what the build measures at decode sizes.
# BLOCK_M is fixed at 16, the MMA's narrow side (the kernel serves M up to its caller's bound).
BLOCK_M = 16
CANDIDATE_CONFIGS = (        # the spread measured on an H100 (docs/benchmarks/h100-fp8-decode-gemm-2026-11-25.json), best first
    (64, 256, 1, 4, 6),
    (64, 256, 1, 4, 4),
    (64, 256, 2, 4, 4),
    (32, 512, 1, 4, 4),
    (64, 128, 4, 4, 6),
    (128, 256, 1, 8, 3),
    (64, 128, 1, 4, 6),         # block_k 128: also for 128x128 block-scaled weights (not measured yet)
    (64, 128, 2, 4, 4),
)


@triton.jit
def store_swapped_tile(acc, out_ptr, part_ptr, bias_ptr, rn64, rm64, n_ok, m_ok, pid_k, M, N, stride_om,
                       SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """acc^T [BLOCK_N, BLOCK_M] to out [M, N] (+ bias, cast) with one K slice, else to its slice of the
    contiguous partials [SPLIT_K, M, N] as it is (the small-M kernels' epilogue; int4_small_m.py's too)."""
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn64, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + rm64[None, :] * stride_om + rn64[:, None], acc.to(out_ptr.dtype.element_ty),
                 mask=n_ok[:, None] & m_ok[None, :])
    else:
        tl.store(part_ptr + (pid_k * M + rm64[None, :]) * N + rn64[:, None], acc, mask=n_ok[:, None] & m_ok[None, :])


@triton.jit
def small_m_gemm_kernel(
    x_ptr, w_ptr, out_ptr, part_ptr, x_scale_ptr, w_scale_ptr, bias_ptr,
    M, N, stride_xm, stride_wn, stride_om, stride_xsm, stride_wsn,
    K: tl.constexpr, K_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    INT8: tl.constexpr, BLOCK_SCALED: tl.constexpr, GROUP: tl.constexpr, ACCUMULATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """acc^T = w[n tile, k slice] @ x[m tile, k slice]^T; the output (SPLIT_K 1) or a float32 partial.

    Per-channel scales multiply the sum once at the end; 128x128 block scales (BLOCK_SCALED) multiply
    each K step's product (BLOCK_K divides GROUP, so a step lies in one group), as in fp8_gemm.py.
    """
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                               # [BLOCK_N]
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                               # [BLOCK_M]
    rk = tl.arange(0, BLOCK_K)
    n_ok, m_ok = rn < N, rm < M
    rn64, rm64 = rn.to(tl.int64), rm.to(tl.int64)
    if INT8:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.int32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    k_begin = pid_k * K_PER_SPLIT
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        k = k_begin + k0 + rk
        k_ok = k < K
        w = tl.load(w_ptr + rn64[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)                                                 # [BLOCK_N, BLOCK_K]
        xt = tl.load(x_ptr + rm64[None, :] * stride_xm + k[:, None], mask=m_ok[None, :] & k_ok[:, None],
                     other=0.0)                                                # [BLOCK_K, BLOCK_M] (x^T by addressing)
        if INT8:                   # int8 x int8 summed in int32: exact
            acc = tl.dot(w, xt, acc, out_dtype=tl.int32)
        elif BLOCK_SCALED:
            group = (k_begin + k0) // GROUP      # a step past K (the slices' round-up) has no group: its
            in_k = (k_begin + k0) < K               # scales are not read (0 x whatever lies past them can be NaN)
            sw = tl.load(w_scale_ptr + (rn64 // GROUP) * stride_wsn + group, mask=n_ok & in_k, other=0.0)  # [BLOCK_N]
            sx = tl.load(x_scale_ptr + rm64 * stride_xsm + group, mask=m_ok & in_k, other=0.0)            # [BLOCK_M]
            acc += tl.dot(w, xt) * sw[:, None] * sx[None, :]
        # Hopper's fp8 MMA sums its products in reduced precision; where they reach the fp32 accumulator:
        elif ACCUMULATION == 0:      # after every MMA instruction (32 values): what cuBLASLt's default gives
            acc = tl.dot(w, xt, acc, max_num_imprecise_acc=0)
        elif ACCUMULATION == 1:    # after every K step (BLOCK_K values): DeepSeek-V3's promotion interval
            acc += tl.dot(w, xt)
        else:                      # only at the end (the MMA's own fast accumulation over all of K)
            acc = tl.dot(w, xt, acc)
    if SPLIT_K == 1 and not BLOCK_SCALED:
        sw = tl.load(w_scale_ptr + rn64, mask=n_ok, other=0.0)                 # [BLOCK_N]
        sx = tl.load(x_scale_ptr + rm64 * stride_xsm, mask=m_ok, other=0.0)    # [BLOCK_M]
        acc = acc.to(tl.float32) * sw[:, None] * sx[None, :]
    store_swapped_tile(acc, out_ptr, part_ptr, bias_ptr, rn64, rm64, n_ok, m_ok, pid_k, M, N, stride_om,
                       SPLIT_K, HAS_BIAS)            # split K: float32 partials (int32 for int8), scaled by the reduce


@triton.jit
def split_k_reduce_kernel(
    part_ptr, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr,
    M, N, stride_om, stride_xsm,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[m, n tile] = (sum over the K slices' partials) (* x_scale[m] * w_scale[n] unless the partials
    are scaled already: block scales) (+ bias), cast."""
    m = tl.program_id(1).to(tl.int64)
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_ok = rn < N
    acc = tl.zeros([BLOCK], part_ptr.dtype.element_ty)           # int32 partials of int8 add exactly
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (s * M + m) * N + rn, mask=n_ok, other=0)
    acc = acc.to(tl.float32)
    if not SCALED:
        acc = acc * tl.load(w_scale_ptr + rn, mask=n_ok, other=0.0) * tl.load(x_scale_ptr + m * stride_xsm)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + rn, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


REDUCE_BLOCK = 1024


def k_per_split(k: int, block_k: int, split_k: int) -> int:
    """The K each slice covers: whole BLOCK_K steps, the last slice possibly shorter (masked)."""
    return triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k


def launch_small_m_gemm(
    xq: torch.Tensor,                 # [M, K] e4m3 or int8
    x_scale: torch.Tensor,            # [M, 1] float32 (a stride-0 expand for a static scale is fine), or [M, K/128]
    weight: torch.Tensor,             # [N, K] e4m3 or int8 (as xq)
    weight_scale: torch.Tensor,       # [N] float32, or [ceil(N/128), K/128] (block-scaled)
    bias: Optional[torch.Tensor],     # [N] or None
    out_dtype: torch.dtype,
    block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
    accumulation: int = 1,            # ACCUMULATION in the kernel: 1 (per K step) measured within 1.5% of the
                                      # fast sums' time at 1/14 of their error (quantization.md); 0, 2 for benchmarks
) -> torch.Tensor:
    """out [M, N] = (xq * x_scale) @ (weight * weight_scale)^T (+ bias), float32 accumulation."""
    int8 = xq.dtype == torch.int8
    if xq.dtype != weight.dtype or xq.dtype not in (torch.int8, torch.float8_e4m3fn):
        raise ValueError(f"the small-M GEMM takes int8 or float8_e4m3fn activations and weights of one dtype, "
                         f"got {xq.dtype} and {weight.dtype}")
    block_scaled = is_block_scaled(weight_scale)
    if block_scaled and int8:
        raise ValueError("int8 weights have per-channel scales ([N]); 128x128 block scales are fp8's")
    if block_scaled:
        check_block_shapes(xq, weight, weight_scale)
        if BLOCK % block_k:
            raise ValueError(f"block-scaled fp8 needs block_k dividing {BLOCK}, got {block_k}")
    check_last_dim_contiguous("weight", weight)
    check_last_dim_contiguous("activations", xq)
    (m, k), n = xq.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    per_split = k_per_split(k, block_k, split_k)
    part = (torch.empty((split_k, m, n), dtype=torch.int32 if int8 else torch.float32, device=xq.device)
            if split_k > 1 else out)
    bias_arg = weight_scale if bias is None else bias
    grid = (triton.cdiv(n, block_n), split_k, triton.cdiv(m, BLOCK_M))
    wrap_triton(small_m_gemm_kernel)[grid](
        xq, weight, out, part, x_scale, weight_scale, bias_arg,
        m, n, xq.stride(0), weight.stride(0), out.stride(0), x_scale.stride(0), weight_scale.stride(0),
        K=k, K_PER_SPLIT=per_split, SPLIT_K=split_k, HAS_BIAS=bias is not None, INT8=int8,
        BLOCK_SCALED=block_scaled, GROUP=BLOCK, ACCUMULATION=accumulation,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )
    if split_k > 1:
        wrap_triton(split_k_reduce_kernel)[(triton.cdiv(n, REDUCE_BLOCK), m)](
            part, out, x_scale, weight_scale, bias_arg, m, n, out.stride(0), x_scale.stride(0),
            SPLIT_K=split_k, HAS_BIAS=bias is not None, SCALED=block_scaled, BLOCK=REDUCE_BLOCK, num_warps=4,
        )
    return out


@triton_op("atom_triton::scaled_mm_small_m", mutates_args=())
def scaled_mm_small_m(
    xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    bias: Optional[torch.Tensor], out_dtype: torch.dtype,
    block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    """The small-M GEMM on activations the graph quantized (Inductor fuses that quantization into the
    norm or SiLU-mul before it): fp8 or int8 operands, told apart by their dtype."""
    return launch_small_m_gemm(xq, x_scale, weight, weight_scale, bias, out_dtype,
                               block_n, block_k, split_k, num_warps, num_stages)
