"""The `int8_linear` backend: what runs an INT8 W8A8 linear (atom_aot/ops/int8.py), chosen per phase
from tuning.json like fp8_linear's.

`aten`: on the CPU the dispatcher op `atom::int8_linear` (the exact-accumulation reference); on CUDA
the same computation written into the model's graph as torch ops (per-token quantization, rows
padded by 16, `torch._int_mm`: cuBLAS int8 GEMM with int32 accumulation, then the two scales), so
Inductor fuses the quantization and the scaling epilogue into the code around the GEMM.
`small_m+aten`: up to `max_m` tokens the small-M Triton GEMM (ops/triton/small_m_gemm.py, int32 sums,
no row padding), `aten`'s `_int_mm` above, chosen by token count as fp8_linear's small_m backends are;
the build measures both at decode sizes on a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import by_token_count, launch_configs
from atom_aot.ops.backends.fp8_linear import AtenFp8Linear


class AtenInt8Linear(AtenFp8Linear):
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune
        from atom_aot.ops.int8 import int8_linear, int8_linear_int_mm
        self.op, self.inline = int8_linear, int8_linear_int_mm


class SmallMInt8Linear:
    """int8 linears: the small-M kernel up to max_m tokens, `_int_mm` above."""

    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import SmallMConfig
        self.small = launch_configs(choice, {"int8_small_m": SmallMConfig})["int8_small_m"]

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
        from atom_aot.ops.int8 import check_int_mm_shapes, int_mm_scaled, quantize_activations_int8
        check_int_mm_shapes(weight)                                           # the large side's limits
        xq, x_scale = quantize_activations_int8(x, input_scale)              # [M, K] int8, [M, 1]
        out_dtype = x.dtype

        def small(xq, x_scale, weight, weight_scale, bias):
            return torch.ops.atom_triton.scaled_mm_small_m(xq, x_scale, weight, weight_scale, bias, out_dtype,
                                                           *self.small.as_args())

        def large(xq, x_scale, weight, weight_scale, bias):
            return int_mm_scaled(xq, x_scale, weight, weight_scale, bias, out_dtype)

        return by_token_count(x.shape[0], self.small.max_m, small, large, (xq, x_scale, weight, weight_scale), bias)
