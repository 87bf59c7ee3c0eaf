"""The `int8_linear` backend: what runs an INT8 W8A8 linear (atom_aot/ops/int8.py), chosen per phase
from tuning.json like fp8_linear's.

`aten`: on the CPU the dispatcher op `atom::int8_linear` (the exact-accumulation reference); on CUDA
the same computation written into the model's graph as torch ops (per-token quantization, rows
padded by 16, `torch._int_mm`: cuBLAS int8 GEMM with int32 accumulation, then the two scales), so
Inductor fuses the quantization and the scaling epilogue into the code around the GEMM. It is the
only backend (no Triton int8 GEMM yet), so nothing is measured at build.
"""
from __future__ import annotations

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import launch_configs
from atom_aot.ops.backends.fp8_linear import AtenFp8Linear


class AtenInt8Linear(AtenFp8Linear):
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune
        from atom_aot.ops.int8 import int8_linear, int8_linear_int_mm
        self.op, self.inline = int8_linear, int8_linear_int_mm
