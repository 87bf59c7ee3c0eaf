"""Counts every compilation that happened in this process: Dynamo frames, Inductor graph
compilations and Triton JIT compilations.

The runtime must keep all three at zero. A compiler that was never imported compiled nothing,
so the counts are read only from modules already loaded; reading them never imports one.
"""
from __future__ import annotations

import sys


class TritonCompileCounter:
    """Counts Triton JIT compilations (cache hits included: either means a kernel was not
    shipped compiled), through Triton's own post-compile hook."""

    def __init__(self):
        self.count = 0
        self._installed = False

    def install(self) -> None:
        if self._installed or "triton" not in sys.modules:
            return
        knobs = getattr(sys.modules["triton"], "knobs", None)
        if knobs is None:
            return
        previous = knobs.runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            self.count += 1
            return previous(*args, **kwargs) if previous else None

        knobs.runtime.jit_post_compile_hook = hook
        self._installed = True


TRITON = TritonCompileCounter()


def compile_counts() -> dict[str, int]:
    counts = {"dynamo_frames": 0, "inductor_compilations": 0, "triton_jit": TRITON.count}
    if "torch._dynamo.utils" in sys.modules:
        utils = sys.modules["torch._dynamo.utils"]
        counts["dynamo_frames"] = utils.counters["frames"]["total"]
        # one entry per Inductor graph compilation (cache hits and misses alike)
        counts["inductor_compilations"] = len(utils.compilation_time_metrics.get("compile_fx_inner", []))
    return counts


def compilers_loaded() -> list[str]:
    return [m for m in ("torch._dynamo", "torch._inductor", "triton") if m in sys.modules]
