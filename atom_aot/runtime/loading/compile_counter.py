"""Counts every compilation that happened in this process: Dynamo frames, Inductor graph
compilations and Triton JIT compilations.

The runtime must keep all three at zero. A compiler that was never imported compiled nothing,
so the counts are read only from modules already loaded; reading them never imports one.
Every runtime load installs the Triton counter (runtime/assembly.py `start_core`), so whoever loads an artifact
(LLMEngine, the engine process, atom-run) counts Triton compilations without asking.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys

log = logging.getLogger("atom_aot")


class TritonCompileCounter:
    """Counts Triton JIT compilations (cache hits included: either means a kernel was not
    shipped compiled), through Triton's own post-compile hook.

    Installing never imports triton (seconds, and the CPU runtime may not need it): if triton is
    not loaded yet, the hook goes in the moment it is."""

    def __init__(self):
        self.count = 0
        self.installed = False
        self._waiting = False

    def install(self) -> None:
        if self.installed:
            return
        if "triton" in sys.modules:
            self._hook(sys.modules["triton"])
        elif not self._waiting:
            self._waiting = True
            sys.meta_path.insert(0, _OnImport("triton", self._hook))

    def _hook(self, triton) -> None:
        if self.installed:
            return
        knobs = getattr(triton, "knobs", None)
        if knobs is None:
            log.warning("triton %s has no post-compile hook (triton.knobs, from 3.4 on): Triton JIT "
                        "compilations are not counted", getattr(triton, "__version__", "?"))
            return
        previous = knobs.runtime.jit_post_compile_hook

        def counting_hook(*args, **kwargs):
            self.count += 1
            return previous(*args, **kwargs) if previous else None

        knobs.runtime.jit_post_compile_hook = counting_hook
        self.installed = True


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after the module `name` is imported, then steps aside.

    A lookup alone (`importlib.util.find_spec`, which torch uses to ask whether triton is there)
    executes nothing, so the finder stays until the module really runs."""

    def __init__(self, name: str, then):
        self.name = name
        self.then = then
        self._looking = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self._looking:
            return None
        self._looking = True
        try:
            spec = importlib.util.find_spec(fullname)      # from the finders after this one
        finally:
            self._looking = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.then(module)

        spec.loader.exec_module = exec_then_call
        return spec


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
