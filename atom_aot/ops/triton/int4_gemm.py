"""`atom_triton::int4_linear`: the W4A16 linear (atom_aot/ops/int4.py's layout) as a Triton GEMM.

The packed weight is read as bytes and widened in registers without a single int -> float conversion
instruction. The first form of this kernel converted each nibble to float32, then to bf16: two
conversions per value at an SM's 16 a clock, which bounds it at ~1 TB/s of int4 bytes on an H100; it
ran at 0.87 (gate_up at M = 1) and was 1.5-10x slower than bf16 cuBLAS
(docs/benchmarks/h100-int4-int8-gemm-2026-11-27.json). Instead each nibble q is OR-ed into the mantissa of a
constant BIAS (128 in bf16 and float32, 1024 in fp16, whose ulp there is 1), so the bit pattern read
as a float *is* BIAS + q, exactly (`biased_nibbles`). The zero point and the bias come off after the
dot, once per output instead of once per weight value:

    sum_k x[m, k] (q[n, k] - z[n, g]) = sum_k x[m, k] (BIAS + q[n, k]) - (BIAS + z[n, g]) sum_k x[m, k]

(tl.dot in x's dtype, fp32 accumulation; the products are exact, the subtraction cancels ~5 bits of
the fp32 sum's 24 with bf16's BIAS, ~8 with fp16's). float32 activations (tests, the CPU interpreter) subtract BIAS + z from the widened
weight instead, exactly, and take the IEEE dot. Per group (G > 1; BLOCK_K divides the group) each
K step's sum is scaled by s[n, group]; per channel (G = 1) the total once at the end.
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
def biased_nibbles(packed, ROWS: tl.constexpr, HALF: tl.constexpr, DTYPE: tl.constexpr):
    """packed [ROWS, HALF] uint8 -> [ROWS, 2 * HALF] BIAS + q in DTYPE, in k order (each byte's low nibble
    first): bit patterns only (mask, shift, or, bitcast), no conversion instruction."""
    if DTYPE == tl.float32:
        low = ((packed & 0xF).to(tl.int32) << 16) | 0x43000000              # 128.0 = 0x43000000
        high = ((packed >> 4).to(tl.int32) << 16) | 0x43000000
        return tl.join(low, high).reshape(ROWS, 2 * HALF).to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        low = (packed & 0xF).to(tl.int16) | 0x6400                          # 1024.0 = 0x6400
        high = (packed >> 4).to(tl.int16) | 0x6400
        return tl.join(low, high).reshape(ROWS, 2 * HALF).to(tl.float16, bitcast=True)
    else:
        low = (packed & 0xF).to(tl.int16) | 0x4300                          # bf16 128.0 = 0x4300
        high = (packed >> 4).to(tl.int16) | 0x4300
        return tl.join(low, high).reshape(ROWS, 2 * HALF).to(tl.bfloat16, bitcast=True)


@triton.jit
def biased_zeros(z, DTYPE: tl.constexpr):
    """z (uint8 zero points) -> float32 BIAS + z, by bits as biased_nibbles (BIAS 2^7: z at mantissa bit 16;
    fp16's 2^10: bit 13)."""
    if DTYPE == tl.float16:
        return ((z.to(tl.int32) << 13) | 0x44800000).to(tl.float32, bitcast=True)     # 1024.0 = 0x44800000
    return ((z.to(tl.int32) << 16) | 0x43000000).to(tl.float32, bitcast=True)         # 128.0 = 0x43000000


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
    DTYPE: tl.constexpr = a_ptr.dtype.element_ty
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)                 # [BLOCK_M]
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)                 # [BLOCK_N]
    rj = tl.arange(0, HALF)                                                 # byte index within the step
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    rm64, rn64 = rm.to(tl.int64), rn.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if GROUPS == 1:
        zb = biased_zeros(tl.load(z_ptr + rn64, mask=n_ok, other=0), DTYPE)          # [BLOCK_N] BIAS + z
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm64[:, None] * stride_am + (k0 + rk)[None, :],
                    mask=m_ok[:, None] & (k0 + rk < K)[None, :], other=0.0)         # [BLOCK_M, BLOCK_K]
        packed = tl.load(b_ptr + rn64[:, None] * stride_bn + (k0 // 2 + rj)[None, :],
                         mask=n_ok[:, None] & (k0 // 2 + rj < K // 2)[None, :], other=0)   # [BLOCK_N, HALF] uint8
        if GROUPS > 1:
            group = k0 * GROUPS // K
            zb = biased_zeros(tl.load(z_ptr + rn64 * GROUPS + group, mask=n_ok, other=0), DTYPE)
        w = biased_nibbles(packed, BLOCK_N, HALF, DTYPE)                    # [BLOCK_N, BLOCK_K] BIAS + q
        if IEEE:
            partial = tl.dot(a, tl.trans(w - zb[:, None]), input_precision="ieee")
        else:
            row_sums = tl.sum(a.to(tl.float32), axis=1)                         # [BLOCK_M]
            partial = tl.dot(a, tl.trans(w)) - row_sums[:, None] * zb[None, :]
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


def int4_operands(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_zero: torch.Tensor,
                  block_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The int4 GEMMs' checks (layout, a K step within one group) and their contiguous x, scales, zeros."""
    check_int4_shapes(weight, weight_scale, weight_zero)
    check_last_dim_contiguous("weight", weight)
    k, groups = x.shape[1], weight_scale.shape[1]
    if groups > 1 and (k // groups) % block_k:
        raise ValueError(f"int4 linear: block_k {block_k} must divide the group size {k // groups}")
    return x.contiguous(), weight_scale.contiguous(), weight_zero.contiguous()


def launch_int4_linear(
    x: torch.Tensor,                        # [M, K] bf16/fp16/fp32
    weight: torch.Tensor,                   # [N, K/2] uint8
    weight_scale: torch.Tensor,             # [N, G] float32
    weight_zero: torch.Tensor,              # [N, G] uint8
    bias: Optional[torch.Tensor],           # [N] or None
    block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
) -> torch.Tensor:
    x, weight_scale, weight_zero = int4_operands(x, weight, weight_scale, weight_zero, block_k)
    (m, k), n, groups = x.shape, weight.shape[0], weight_scale.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    wrap_triton(int4_gemm_kernel)[grid](
        x, weight, weight_scale, weight_zero, out, weight_scale if bias is None else bias,
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
