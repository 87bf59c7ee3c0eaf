"""Which C++ compiler builds the AOTInductor wrapper.

The compiled `.so` has no libstdc++ of its own: its inlined standard-library code (std::regex in
AOTInductor's device parsing) comes from the compiler's headers and binds at load to the libstdc++
the serving process has. A `CXX` from another GCC than that libstdc++ builds code that crashes at
load (seen on a GPU image whose CXX points at a second GCC). So the build uses a compiler whose own
libstdc++ is the one this process maps, and the manifest records it. (Linking libstdc++ statically
into the wrapper was tried: AOTInductor's container then fails to initialise.)
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

import torch  # noqa: F401  (maps the libstdc++ that serving processes load, which the check compares with)

log = logging.getLogger("atom_aot")


def _loaded_libstdcxx() -> Path | None:
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libstdc++.so" in line:
                return Path(line.split()[-1]).resolve()
    return None


def _compiler_libstdcxx(cxx: str) -> Path | None:
    try:
        out = subprocess.run([cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    path = Path(out.stdout.strip())
    return path.resolve() if out.returncode == 0 and path.is_absolute() and path.exists() else None


def _version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else "unknown"


@functools.cache
def wrapper_compiler() -> dict:
    """{"cxx": path, "version": ..., "libstdcxx_match": bool}: the compiler the build hands to Inductor."""
    candidates = [c for c in (os.environ.get("CXX"), "g++", "c++", "/usr/bin/g++") if c and shutil.which(c)]
    if not candidates:
        raise FileNotFoundError("no C++ compiler found (set CXX or install g++): AOTInductor needs one at build time")
    loaded = _loaded_libstdcxx()
    for cxx in candidates:
        if loaded is not None and _compiler_libstdcxx(cxx) == loaded:
            return {"cxx": shutil.which(cxx), "version": _version(cxx), "libstdcxx_match": True}
    chosen = candidates[0]
    log.warning("no C++ compiler here uses this process's libstdc++ (%s); using %s, whose compiled code may "
                "not load", loaded, chosen)
    return {"cxx": shutil.which(chosen), "version": _version(chosen), "libstdcxx_match": False}
