"""`atom_triton::fp8_linear`: the FP8 W8A8 linear as a Triton GEMM, for every layout of atom_aot/ops/fp8.py.

The activations are quantized by the same torch code as the reference (inside the op's body, so
Inductor fuses it into the graph around the kernel), then one kernel multiplies e4m3 tiles on the
tensor cores with float32 accumulation:

    per-channel scales (BLOCK_SCALED false): acc = sum_k a q_w, scaled once at the end by a_scale[m] * w_scale[n]
    128x128 blocks (BLOCK_SCALED true):      each K step's partial product is scaled by
                                             a_scale[m, k // 128] * w_scale[n // 128, k // 128] before it is added
                                             (BLOCK_K divides 128, so a step never straddles two groups)

Launch params arrive as ints (the build measured them; the exported graph carries them).
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.fp8 import BLOCK, check_block_shapes, is_block_scaled, quantize_activations
from atom_aot.ops.triton._common import GemmConfig, check_last_dim_contiguous


# What the build measures per GEMM shape (small M for decode, large for prefill).
CANDIDATE_CONFIGS = (
    GemmConfig(16, 64, 128, 4, 4),
    GemmConfig(32, 128, 128, 4, 3),
    GemmConfig(64, 128, 128, 4, 3),
    GemmConfig(128, 128, 128, 8, 3),
    GemmConfig(128, 256, 64, 8, 3),
)


@triton.jit
def fp8_scaled_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, bias_ptr,
    M, N,
    stride_am, stride_bn, stride_cm, stride_asm, stride_bsn,
    K: tl.constexpr,                    # a layer's in-features: fixed per weight, so the K loop's trip count is too
    HAS_BIAS: tl.constexpr, BLOCK_SCALED: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """c [M, N] = (a [M, K] e4m3 * a_scale) @ (b [N, K] e4m3 * b_scale)^T (+ bias), fp32 accumulation."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)                 # [BLOCK_M]
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)                 # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    rm64, rn64 = rm.to(tl.int64), rn.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(a_ptr + rm64[:, None] * stride_am + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)                                              # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + rn64[None, :] * stride_bn + (k0 + rk)[:, None], mask=n_ok[None, :] & k_ok[:, None],
                    other=0.0)                                              # [BLOCK_K, BLOCK_N] (w^T by addressing)
        if BLOCK_SCALED:
            group = k0 // GROUP
            sa = tl.load(a_scale_ptr + rm64 * stride_asm + group, mask=m_ok, other=0.0)            # [BLOCK_M]
            sb = tl.load(b_scale_ptr + (rn64 // GROUP) * stride_bsn + group, mask=n_ok, other=0.0)  # [BLOCK_N]
            acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
        else:
            # a fresh product per K step, added in fp32: Hopper's fp8 MMA accumulates in reduced precision,
            # so accumulating the whole K inside it (tl.dot(a, b, acc)) lost accuracy as K grew
            acc += tl.dot(a, b)
    if not BLOCK_SCALED:
        sa = tl.load(a_scale_ptr + rm64 * stride_asm, mask=m_ok, other=0.0)
        sb = tl.load(b_scale_ptr + rn64 * stride_bsn, mask=n_ok, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(c_ptr + rm64[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def launch_fp8_scaled_mm(
    xq: torch.Tensor,                       # [M, K] e4m3
    x_scale: torch.Tensor,                  # [M, G] float32 (G 1, or K/128 for block-scaled weights)
    weight: torch.Tensor,                   # [N, K] e4m3
    weight_scale: torch.Tensor,             # [N] or [ceil(N/128), K/128] float32
    bias: Optional[torch.Tensor],           # [N] or None
    out_dtype: torch.dtype,
    block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    """The GEMM on activations quantized beforehand: out [M, N] in out_dtype."""
    block_scaled = is_block_scaled(weight_scale)
    if block_scaled:
        check_block_shapes(xq, weight, weight_scale)
        if BLOCK % block_k:
            raise ValueError(f"block-scaled fp8 needs block_k dividing {BLOCK}, got {block_k}")
    check_last_dim_contiguous("weight", weight)
    (m, k), n = xq.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    wrap_triton(fp8_scaled_gemm_kernel)[grid](
        xq, weight, out, x_scale, weight_scale, weight_scale if bias is None else bias,
        m, n, xq.stride(0), weight.stride(0), out.stride(0), x_scale.stride(0), weight_scale.stride(0),
        K=k, HAS_BIAS=bias is not None, BLOCK_SCALED=block_scaled, GROUP=BLOCK,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )
    return out


def launch_fp8_linear(
    x: torch.Tensor,                        # [M, K]
    weight: torch.Tensor,                   # [N, K] e4m3
    weight_scale: torch.Tensor,             # [N] or [ceil(N/128), K/128] float32
    input_scale: Optional[torch.Tensor],    # [1] or None
    bias: Optional[torch.Tensor],           # [N] or None
    block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    if is_block_scaled(weight_scale):
        check_block_shapes(x, weight, weight_scale)
    xq, x_scale = quantize_activations(x, input_scale, is_block_scaled(weight_scale))   # [M, K] e4m3, [M, G]
    return launch_fp8_scaled_mm(xq, x_scale, weight, weight_scale, bias, x.dtype,
                                block_m, block_n, block_k, num_warps, num_stages)


@triton_op("atom_triton::fp8_linear", mutates_args=())
def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor], block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    return launch_fp8_linear(x, weight, weight_scale, input_scale, bias,
                             block_m, block_n, block_k, num_warps, num_stages)


@triton_op("atom_triton::fp8_scaled_mm", mutates_args=())
def fp8_scaled_mm(
    xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    bias: Optional[torch.Tensor], out_dtype: torch.dtype,
    block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    """The GEMM alone, on activations the graph quantized (the small-M backend's path above its bound)."""
    return launch_fp8_scaled_mm(xq, x_scale, weight, weight_scale, bias, out_dtype,
                                block_m, block_n, block_k, num_warps, num_stages)
