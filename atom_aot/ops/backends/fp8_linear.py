"""The `fp8_linear` backends: what runs an FP8 W8A8 linear (atom_aot/ops/fp8.py), chosen per phase
from tuning.json like attention's.

`aten`: on the CPU the dispatcher op `atom::fp8_linear` (the float32 reference); on CUDA the same
computation written into the model's graph as torch ops (the per-token quantization, then
`torch._scaled_mm`, cuBLASLt/CUTLASS with row-wise scales), not the opaque op: so Inductor fuses the
quantization's reduction and cast into the code around it (the preceding norm or SiLU-mul) instead of
running ~6 eager kernels per linear inside a custom op call, and AOTInductor calls `_scaled_mm` itself.
`triton`: `atom_triton::fp8_linear` with the launch config the build measured; the only backend for
128x128 block-scaled weights on a GPU.
`small_m+aten`, `small_m+triton`: up to `max_m` tokens the small-M kernel (ops/triton/small_m_gemm.py:
the weight streamed by many programs, near the memory bandwidth where cuBLASLt's tiles leave SMs idle),
above it `_scaled_mm` or the Triton GEMM. The quantization comes first, in the graph (fused as for
`aten`); then, on an exported graph whose token count is symbolic, `torch.cond` on M <= max_m holds
both GEMMs and the package picks one per call (each captured CUDA graph has one M, so one branch).
"""
from __future__ import annotations

from typing import Optional

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import by_token_count, launch_configs


class AtenFp8Linear:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune
        from atom_aot.ops.fp8 import fp8_linear, fp8_linear_cublas
        self.op, self.inline = fp8_linear, fp8_linear_cublas

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
        if x.device.type == "cuda":       # fixed per artifact: the graph holds one of the two
            return self.inline(x, weight, weight_scale, input_scale, bias)
        return self.op(x, weight, weight_scale, input_scale, bias)

    def quantized(self, xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
        """The GEMM on activations quantized before it (per-token: the silu_mul_quant backends)."""
        from atom_aot.ops.fp8 import scaled_matmul_reference, scaled_mm_rowwise
        gemm = scaled_mm_rowwise if xq.device.type == "cuda" else scaled_matmul_reference
        return gemm(xq, x_scale, weight, weight_scale, bias, out_dtype)


class TritonFp8Linear:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import GemmConfig
        self.args = launch_configs(choice, {"fp8_gemm": GemmConfig})["fp8_gemm"].as_args()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
        return torch.ops.atom_triton.fp8_linear(x, weight, weight_scale, input_scale, bias, *self.args)

    def quantized(self, xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
        return torch.ops.atom_triton.fp8_scaled_mm(xq, x_scale, weight, weight_scale, bias, out_dtype, *self.args)


class SmallMFp8Linear:
    """fp8 linears: the small-M kernel up to max_m tokens, the large-M GEMM above (block-scaled weights:
    the Triton GEMM only)."""

    def __init__(self, choice: BackendChoice, large: str):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import GemmConfig, SmallMConfig
        expected = {"fp8_small_m": SmallMConfig, **({"fp8_gemm": GemmConfig} if large == "triton" else {})}
        configs = launch_configs(choice, expected)
        self.small = configs["fp8_small_m"]
        self.large_args = configs["fp8_gemm"].as_args() if large == "triton" else None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
        from atom_aot.ops.fp8 import is_block_scaled, quantize_activations
        block_scaled = is_block_scaled(weight_scale)
        if block_scaled and self.large_args is None:
            raise ValueError("block-scaled fp8 weights need small_m+triton (cuBLASLt has no 128x128 block scales); "
                             "rebuild the artifact with this atom-aot's atom-build")
        xq, x_scale = quantize_activations(x, input_scale, block_scaled)          # [M, K] e4m3, [M, 1 or K/128]
        return self.quantized(xq, x_scale, weight, weight_scale, bias, x.dtype)

    def quantized(self, xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
        """The GEMM on quantized activations: the small-M kernel up to max_m tokens, the large one above."""
        from atom_aot.ops.fp8 import scaled_mm_rowwise

        def small(xq, x_scale, weight, weight_scale, bias):
            return torch.ops.atom_triton.scaled_mm_small_m(xq, x_scale, weight, weight_scale, bias, out_dtype,
                                                           *self.small.as_args())

        def large(xq, x_scale, weight, weight_scale, bias):
            if self.large_args is not None:
                return torch.ops.atom_triton.fp8_scaled_mm(xq, x_scale, weight, weight_scale, bias, out_dtype,
                                                           *self.large_args)
            return scaled_mm_rowwise(xq, x_scale, weight, weight_scale, bias, out_dtype)

        return by_token_count(xq.shape[0], self.small.max_m, small, large, (xq, x_scale, weight, weight_scale), bias)


def small_m_over_aten(choice: BackendChoice) -> SmallMFp8Linear:
    return SmallMFp8Linear(choice, large="aten")


def small_m_over_triton(choice: BackendChoice) -> SmallMFp8Linear:
    return SmallMFp8Linear(choice, large="triton")
