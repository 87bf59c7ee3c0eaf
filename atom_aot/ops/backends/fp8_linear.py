"""The `fp8_linear` backends: what runs an FP8 W8A8 linear (atom_aot/ops/fp8.py), chosen per phase
from tuning.json like attention's.

`aten`: on the CPU the dispatcher op `atom::fp8_linear` (the float32 reference); on CUDA the same
computation written into the model's graph as torch ops (the per-token quantization, then
`torch._scaled_mm`, cuBLASLt/CUTLASS with row-wise scales), not the opaque op: so Inductor fuses the
quantization's reduction and cast into the code around it (the preceding norm or SiLU-mul) instead of
running ~6 eager kernels per linear inside a custom op call, and AOTInductor calls `_scaled_mm` itself.
`triton`: `atom_triton::fp8_linear` with the launch config the build measured; the only backend for
128x128 block-scaled weights on a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import launch_configs


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


class TritonFp8Linear:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import GemmConfig
        self.args = launch_configs(choice, {"fp8_gemm": GemmConfig})["fp8_gemm"].as_args()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
        return torch.ops.atom_triton.fp8_linear(x, weight, weight_scale, input_scale, bias, *self.args)
