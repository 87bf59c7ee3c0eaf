"""MXFP4 (OCP microscaling, FP4 e2m1 elements with e8m0 block scales): the layout atom-aot stores and its values.

A weight `[N, K]` is stored as

    blocks [N, K/2] uint8    two e2m1 codes a byte: k = 2j in the low nibble of byte j, k = 2j + 1 in the high one
    scales [N, K/32] uint8   one e8m0 exponent e per 32 consecutive k

as GPT-OSS ships its experts (`*_blocks [.., N, K/32, 16]`, `*_scales [.., N, K/32]`, read as they are; transformers'
integrations/mxfp4.py `convert_moe_packed_tensors` is the same reading):

    w[n, k] = FP4[code(n, k)] * 2^(e(n, k // 32) - 127)

FP4 = (0, 0.5, 1, 1.5, 2, 3, 4, 6) for codes 0..7, their negatives for 8..15 (the sign bit). e = 255 is NaN (the OCP
spec; transformers' ldexp makes it 2^128). The product is exact in float32 (at most two significant bits times a
power of two; 2^-128 at the bottom is a float32 subnormal, beyond 2^128 it is inf), and each finite float32 value
stays exact in bf16 (the same exponent range, 8 significant bits), so dequantizing to the compute dtype loses
nothing: an MXFP4 model computes on exactly the checkpoint's weights.
"""
from __future__ import annotations

import torch

BLOCK = 32                   # values per e8m0 scale, along K
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SCALE_BIAS = 127
NAN_EXPONENT = 255


def e8m0_scales(exponents: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 exponents -> float32 2^(e - 127), exactly (its bits: 2^-127 is the subnormal 0x00400000), NaN for
    e = 255."""
    e = exponents.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 0x00400000), e << 23)
    return torch.where(e == NAN_EXPONENT, float("nan"), bits.view(torch.float32))


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks [..., N, K/2] uint8, scales [..., N, K/32] uint8 -> the weight [..., N, K] in `dtype` (exact: module
    docstring)."""
    check_mxfp4_shapes(blocks, scales)
    table = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0xF, blocks >> 4], dim=-1).flatten(-2)         # [..., N, K] in k order
    values = table[codes.long()].unflatten(-1, (scales.shape[-1], BLOCK))        # [..., N, K/32, 32]
    return (values * e8m0_scales(scales).unsqueeze(-1)).flatten(-2).to(dtype)


def check_mxfp4_shapes(blocks: torch.Tensor, scales: torch.Tensor) -> None:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"mxfp4 blocks and scales are uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[:-1] != scales.shape[:-1] or blocks.shape[-1] != scales.shape[-1] * BLOCK // 2:
        raise ValueError(f"mxfp4 blocks [..., N, K/2] and scales [..., N, K/{BLOCK}] do not match: "
                         f"{tuple(blocks.shape)} and {tuple(scales.shape)}")
