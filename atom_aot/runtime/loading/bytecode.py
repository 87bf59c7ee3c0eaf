"""Whether torch's Python bytecode is cached: without it every start compiles torch's sources.

Container images often set PYTHONDONTWRITEBYTECODE=1 and ship site-packages without .pyc files;
then each `import torch` compiles some 2,000 modules again (on an H100 host: 3.5-5.9 s instead
of 1.1-1.9 s, docs/gpu.md). Nothing in the engine can win that back, so start-up says so.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
from types import ModuleType

log = logging.getLogger("atom_aot")


def bytecode_cached(module: ModuleType) -> bool:
    """True when the module's source has a compiled .pyc where this interpreter looks for it."""
    source = getattr(module, "__file__", None)
    if not source or not source.endswith(".py"):
        return True   # a built-in or extension module: nothing to compile
    return os.path.exists(importlib.util.cache_from_source(source))


def torch_bytecode_state() -> dict:
    import torch
    return {"torch_bytecode_cached": bytecode_cached(torch),
            "dont_write_bytecode": bool(sys.flags.dont_write_bytecode),
            "pycache_prefix": sys.pycache_prefix}


def warn_if_torch_uncached() -> None:
    """One warning, with the command that fixes it, when every start recompiles torch."""
    state = torch_bytecode_state()
    if state["torch_bytecode_cached"]:
        return
    import torch
    log.warning(
        "torch has no cached bytecode here%s, so every start compiles its Python sources (seconds of "
        "start-up). Compile it once, e.g. in the image: python -m compileall -q -j0 %s",
        " (PYTHONDONTWRITEBYTECODE is set)" if state["dont_write_bytecode"] else "",
        os.path.dirname(torch.__file__))
