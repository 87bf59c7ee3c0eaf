"""INT4 weight-only linear layers (W4A16, GPTQ / AWQ checkpoints), as the custom op `atom::int4_linear`.

One runtime layout, which both GPTQ and AWQ checkpoints convert into losslessly at build
(atom_aot/weights/int4_checkpoint.py):

    weight       [N, K/2] uint8: byte [n, j] holds q[n, 2j] in its low nibble and q[n, 2j+1] in its high
    weight_scale [N, G] float32: per output channel and group of K/G inputs (group 128, or G = 1: per channel)
    weight_zero  [N, G] uint8: the group's zero point, 0..16 (GPTQ v1 stores zero - 1, so 16 can occur)

    w[n, k] = (q[n, k] - z[n, k // g]) * s[n, k // g]        y = x w^T (+ bias)

The dequantized weight is exact in float32: (q - z) is an integer in [-16, 15] (5 bits) and s came
from an fp16 (11 significant bits), so the product needs at most 16 of float32's 24 bits. The
activations stay in the model dtype (W4A16): the CPU reference multiplies in float32 and returns
x's dtype; CUDA runs the Triton GEMM (atom_aot/ops/triton/int4_gemm.py) or, as the `aten` backend,
the same dequantization written as torch ops followed by a cuBLAS GEMM.
"""
from __future__ import annotations

from typing import Optional

import torch

GROUP = 128                               # the group size of the grouped scheme (GPTQ/AWQ's usual)
NIBBLE = 0xF

LIBRARY = torch.library.Library("atom", "FRAGMENT")
LIBRARY.define("int4_linear(Tensor x, Tensor weight, Tensor weight_scale, Tensor weight_zero, Tensor? bias) -> Tensor")


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] integers 0..15 -> [N, K/2] uint8 (the runtime layout: even k in the low nibble)."""
    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even number of inputs, got K={q.shape[-1]}")
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] uint8 -> q [N, K] uint8 (0..15), the inverse of pack_nibbles."""
    low, high = packed & NIBBLE, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(weight: torch.Tensor, weight_scale: torch.Tensor, weight_zero: torch.Tensor) -> torch.Tensor:
    """The runtime layout -> w [N, K] float32, exactly (module docstring)."""
    q = unpack_nibbles(weight).float()                                         # [N, K]
    group = q.shape[1] // weight_scale.shape[1]
    zero = weight_zero.float().repeat_interleave(group, dim=1)                 # [N, K]
    scale = weight_scale.float().repeat_interleave(group, dim=1)               # [N, K]
    return (q - zero) * scale


def check_int4_shapes(weight: torch.Tensor, weight_scale: torch.Tensor, weight_zero: torch.Tensor) -> None:
    n, k = weight.shape[0], 2 * weight.shape[1]
    groups = weight_scale.shape[1]
    if weight_scale.shape != (n, groups) or weight_zero.shape != (n, groups) or k % groups:
        raise ValueError(f"int4 linear: weight [N={n}, K/2={k // 2}] needs weight_scale and weight_zero [N, G] with "
                         f"G dividing K; got {tuple(weight_scale.shape)} and {tuple(weight_zero.shape)}")


def int4_linear_reference(
    x: torch.Tensor,                          # [M, K] activations (bf16/fp16/fp32)
    weight: torch.Tensor,                     # [N, K/2] uint8, two nibbles a byte
    weight_scale: torch.Tensor,               # [N, G] float32
    weight_zero: torch.Tensor,                # [N, G] uint8
    bias: Optional[torch.Tensor],             # [N] or None
) -> torch.Tensor:
    """The exact dequantized weight times x, in float32; the result in x's dtype."""
    check_int4_shapes(weight, weight_scale, weight_zero)
    y = x.float() @ dequantize_int4(weight, weight_scale, weight_zero).T           # [M, N]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def int4_linear_dequantized(x, weight, weight_scale, weight_zero, bias) -> torch.Tensor:
    """CUDA `aten` path: the dequantization as torch ops (Inductor fuses it into one kernel), then cuBLAS
    in x's dtype. It materializes the weight each call: a candidate for large M only."""
    w = dequantize_int4(weight, weight_scale, weight_zero).to(x.dtype)            # [N, K]
    return torch.nn.functional.linear(x, w, bias)


LIBRARY.impl("int4_linear", int4_linear_reference, "CPU")
LIBRARY.impl("int4_linear", int4_linear_dequantized, "CUDA")


@torch.library.register_fake("atom::int4_linear", lib=LIBRARY)
def _(x, weight, weight_scale, weight_zero, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


int4_linear = torch.ops.atom.int4_linear
