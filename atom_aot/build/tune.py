"""Kernel choices for the target, measured at build time and stored in tuning.json.

The runtime reads these and never autotunes. On the CPU there is one implementation of each op
(torch reference ops; Inductor's C++ code for the rest), so the table records that choice.
"""
from __future__ import annotations

from atom_aot.build.config import BuildConfig


def tune_kernels(config: BuildConfig) -> dict:
    if config.arch == "cpu":
        return {"arch": "cpu", "measured": False,
                "kernels": {"paged_attention": {"impl": "torch_reference"},
                            "gemm": {"impl": "aten (Inductor extern call)"},
                            "sampling": {"impl": "torch"}}}
    raise ValueError(f"kernel tuning for {config.arch} is not available in this build of atom-aot")
