"""The `fp8_linear` backends: what runs an FP8 W8A8 linear (atom_aot/ops/fp8.py), chosen per phase
from tuning.json like attention's.

`aten`: the dispatcher op `atom::fp8_linear` (the float32 reference on the CPU, cuBLASLt's
`_scaled_mm` on CUDA). `triton`: `atom_triton::fp8_linear` with the launch config the build
measured; the only backend for 128x128 block-scaled weights on a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import launch_configs


class AtenFp8Linear:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune
        from atom_aot.ops.fp8 import fp8_linear
        self.op = fp8_linear

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
        return self.op(x, weight, weight_scale, input_scale, bias)


class TritonFp8Linear:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton.fp8_gemm import Fp8GemmConfig
        self.args = launch_configs(choice, {"fp8_gemm": Fp8GemmConfig})["fp8_gemm"].as_args()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
        return torch.ops.atom_triton.fp8_linear(x, weight, weight_scale, input_scale, bias, *self.args)
