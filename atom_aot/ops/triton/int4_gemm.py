"""`atom_triton::int4_linear`: the W4A16 linear (atom_aot/ops/int4.py's layout) as a Triton GEMM.

The packed weight is read as bytes and unpacked in registers: each K step loads a [BLOCK_K/2, BLOCK_N]
tile of bytes, splits it into the even-k (low) and odd-k (high) nibbles, subtracts the group's zero
point and multiplies each half with the matching strided half of the activations:

    partial = a[:, even k] @ (low - z) + a[:, odd k] @ (high - z)     (tl.dot in x's dtype, fp32 accumulation)
    grouped (G > 1): acc += partial * s[n, k0 // group]   (BLOCK_K divides the group: one group per step)
    per channel (G = 1): acc += partial, scaled by s[n, 0] once at the end

(q - z) is an integer in [-16, 15], exact in bf16/fp16, so the dot sees the stored values exactly and
the scale is applied in float32. Launch params arrive as ints (the build measured them).
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.int4 import check_int4_shapes
from atom_aot.ops.triton._common import GemmConfig, check_last_dim_contiguous


# What the build measures per GEMM shape (decode: small M, weight-bound; prefill: large M). BLOCK_K divides 128.
CANDIDATE_CONFIGS = (
    GemmConfig(16, 64, 128, 4, 4),
    GemmConfig(16, 128, 128, 4, 3),
    GemmConfig(32, 128, 64, 4, 3),
    GemmConfig(64, 128, 64, 4, 3),
    GemmConfig(128, 128, 64, 8, 3),
)


@triton.jit
def int4_gemm_kernel(
    a_ptr, b_ptr, s_ptr, z_ptr, c_ptr, bias_ptr,
    M, N,
    stride_am, stride_bn, stride_cm,
    K: tl.constexpr, GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """c [M, N] = a [M, K] @ ((q - z) * s)^T (+ bias); q packed two a byte in b [N, K/2]."""
    HALF: tl.constexpr = BLOCK_K // 2
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)                 # [BLOCK_M]
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)                 # [BLOCK_N]
    rj = tl.arange(0, HALF)                                                 # byte index within the step
    m_ok, n_ok = rm < M, rn < N
    rm64, rn64 = rm.to(tl.int64), rn.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        j_ok = (k0 // 2 + rj) < K // 2
        a_rows = a_ptr + rm64[:, None] * stride_am + (k0 + 2 * rj)[None, :]
        a_mask = m_ok[:, None] & j_ok[None, :]
        a_even = tl.load(a_rows, mask=a_mask, other=0.0)                    # [BLOCK_M, HALF]
        a_odd = tl.load(a_rows + 1, mask=a_mask, other=0.0)                 # [BLOCK_M, HALF]
        packed = tl.load(b_ptr + rn64[None, :] * stride_bn + (k0 // 2 + rj)[:, None],
                         mask=n_ok[None, :] & j_ok[:, None], other=0)       # [HALF, BLOCK_N] uint8
        group = k0 * GROUPS // K
        z = tl.load(z_ptr + rn64 * GROUPS + group, mask=n_ok, other=0).to(tl.int32)    # [BLOCK_N]
        # integers in [-16, 15], exact in every float type; via fp32 (no direct int -> bf16 convert)
        low = ((packed & 0xF).to(tl.int32) - z[None, :]).to(tl.float32).to(a_ptr.dtype.element_ty)
        high = ((packed >> 4).to(tl.int32) - z[None, :]).to(tl.float32).to(a_ptr.dtype.element_ty)
        if IEEE:
            partial = tl.dot(a_even, low, input_precision="ieee")
            partial = tl.dot(a_odd, high, partial, input_precision="ieee")
        else:
            partial = tl.dot(a_odd, high, tl.dot(a_even, low))
        if GROUPS > 1:
            s = tl.load(s_ptr + rn64 * GROUPS + group, mask=n_ok, other=0.0)            # [BLOCK_N]
            acc += partial * s[None, :]
        else:
            acc += partial
    if GROUPS == 1:
        acc = acc * tl.load(s_ptr + rn64, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(c_ptr + rm64[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def launch_int4_linear(
    x: torch.Tensor,                        # [M, K] bf16/fp16/fp32
    weight: torch.Tensor,                   # [N, K/2] uint8
    weight_scale: torch.Tensor,             # [N, G] float32
    weight_zero: torch.Tensor,              # [N, G] uint8
    bias: Optional[torch.Tensor],           # [N] or None
    block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    check_int4_shapes(weight, weight_scale, weight_zero)
    check_last_dim_contiguous("weight", weight)
    (m, k), n, groups = x.shape, weight.shape[0], weight_scale.shape[1]
    if groups > 1 and (k // groups) % block_k:
        raise ValueError(f"int4 linear: block_k {block_k} must divide the group size {k // groups}")
    x = x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    wrap_triton(int4_gemm_kernel)[grid](
        x, weight, weight_scale.contiguous(), weight_zero.contiguous(), out, weight_scale if bias is None else bias,
        m, n, x.stride(0), weight.stride(0), out.stride(0),
        K=k, GROUPS=groups, HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )
    return out


@triton_op("atom_triton::int4_linear", mutates_args=())
def int4_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_zero: torch.Tensor,
    bias: Optional[torch.Tensor], block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    return launch_int4_linear(x, weight, weight_scale, weight_zero, bias,
                              block_m, block_n, block_k, num_warps, num_stages)
