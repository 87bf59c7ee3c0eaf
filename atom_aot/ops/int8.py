"""INT8 W8A8 linear layers that compute in int8, as the custom op `atom::int8_linear`.

The layout is compressed-tensors' W8A8 int8 (what vLLM serves for the "...-quantized.w8a8" models):

    weight [N, K] int8 with weight_scale [N] float32 (symmetric, per output channel; a per-tensor
    scale is stored per channel, exact), activations quantized symmetrically to int8 either per token
    at run time (input_scale None) or with the checkpoint's static per-tensor input_scale [1].

    y[m, n] = (sum_k xq[m, k] * wq[n, k]) * x_scale[m] * weight_scale[n]  (+ bias[n])

The sum of int8 x int8 products is exact (int32 on the GPU; the CPU reference sums in float64,
exact as well: |sum| <= K * 2^14 < 2^53), so every implementation agrees up to the float32 scaling.
CUDA: `torch._int_mm` (cuBLAS int8 GEMM). It needs M > 16 and K, N multiples of 8: rows are always
padded by PAD_ROWS zero rows (shape-independent, so one graph serves every M; a padded row costs
nothing in a GEMM bound by reading the weight, and the pad fuses into the quantization kernel), and
K or N off a multiple of 8 is refused by name.
"""
from __future__ import annotations

from typing import Optional

import torch

INT8_MIN, INT8_MAX = -128, 127
MIN_SCALE = 1e-12                         # an all-zero row still gets a finite scale
PAD_ROWS = 16                             # torch._int_mm on CUDA needs M > 16
ALIGN = 8                                 # ... and K, N multiples of 8

LIBRARY = torch.library.Library("atom", "FRAGMENT")
LIBRARY.define("int8_linear(Tensor x, Tensor weight, Tensor weight_scale, Tensor? input_scale, Tensor? bias) -> Tensor")


def _to_int8(x: torch.Tensor) -> torch.Tensor:
    """Round half to even and saturate (vLLM's scaled_int8_quant: nearbyint, then clamp)."""
    return torch.round(x).clamp(INT8_MIN, INT8_MAX).to(torch.int8)


def quantize_activations_int8(x: torch.Tensor, input_scale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] int8, scale [M, 1] float32), x ~= q * scale: per token (dynamic) or the
    static per-tensor scale repeated on every row."""
    xf = x.float()
    if input_scale is not None:
        scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1)             # [M, 1]
    else:
        scale = (xf.abs().amax(-1, keepdim=True) / INT8_MAX).clamp(min=MIN_SCALE)  # [M, 1]
    return _to_int8(xf / scale), scale


def quantize_weight_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] int8, scale [N] float32): symmetric, one scale per output channel."""
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / INT8_MAX).clamp(min=MIN_SCALE)                  # [N]
    return _to_int8(wf / scale[:, None]), scale


def _scaled(acc: torch.Tensor, x_scale: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor],
            dtype: torch.dtype) -> torch.Tensor:
    y = acc.float() * x_scale * weight_scale                                          # [M, N]
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def int8_linear_reference(
    x: torch.Tensor,                          # [M, K] activations (bf16/fp16/fp32)
    weight: torch.Tensor,                     # [N, K] int8
    weight_scale: torch.Tensor,               # [N] float32
    input_scale: Optional[torch.Tensor],      # [1] float32 (static) or None (dynamic per token)
    bias: Optional[torch.Tensor],             # [N] or None
) -> torch.Tensor:
    """The integer GEMM's numerics on the CPU: int8 products summed exactly (float64), then scaled."""
    xq, x_scale = quantize_activations_int8(x, input_scale)
    acc = xq.double() @ weight.double().T                                             # [M, N], exact integers
    return _scaled(acc, x_scale, weight_scale, bias, x.dtype)


def check_int_mm_shapes(weight: torch.Tensor) -> None:
    n, k = weight.shape
    if n % ALIGN or k % ALIGN:
        raise ValueError(f"int8 linear [N={n}, K={k}]: cuBLAS's int8 GEMM (torch._int_mm) needs N and K "
                         f"multiples of {ALIGN}; this layer's shape cannot run on the int8 GPU path")


def int8_linear_int_mm(x, weight, weight_scale, input_scale, bias) -> torch.Tensor:
    """torch._int_mm (int32 accumulation) on PAD_ROWS-padded rows; the quantization and the scaling are
    plain torch ops, so Inductor fuses them into the code around the GEMM."""
    check_int_mm_shapes(weight)
    xq, x_scale = quantize_activations_int8(x, input_scale)
    return int_mm_scaled(xq, x_scale, weight, weight_scale, bias, x.dtype)


def int_mm_scaled(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The GEMM on quantized activations (xq [M, K] int8, x_scale [M, 1]): rows padded, `_int_mm`, scaled."""
    padded = torch.nn.functional.pad(xq, (0, 0, 0, PAD_ROWS))                         # [M + 16, K]
    acc = torch._int_mm(padded, weight.t())[: xq.shape[0]]                            # [M, N] int32
    return _scaled(acc, x_scale, weight_scale, bias, dtype)


LIBRARY.impl("int8_linear", int8_linear_reference, "CPU")
LIBRARY.impl("int8_linear", int8_linear_int_mm, "CUDA")


@torch.library.register_fake("atom::int8_linear", lib=LIBRARY)
def _(x, weight, weight_scale, input_scale, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


int8_linear = torch.ops.atom.int8_linear
