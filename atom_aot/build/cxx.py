"""Which C++ compiler builds the AOTInductor wrapper.

The compiled `.so` has no libstdc++ of its own: its inlined standard-library code (std::regex in
AOTInductor's device parsing) comes from the compiler's headers and binds at load to the libstdc++
the serving process has. A `CXX` from another GCC than that libstdc++ builds code that crashes at
load (seen on a GPU image whose CXX points at a second GCC). So the build uses a compiler whose own
libstdc++ is the one this process maps, and the manifest records it.

"The same libstdc++" is judged by the path the compiler links against, spelled the way the dynamic
loader will see it: on that image `$CXX -print-file-name=libstdc++.so.6` says
`/lib/x86_64-linux-gnu/...`, which resolves through the `/lib -> /usr/lib` link to the very file
torch maps, yet a wrapper built with it segfaults at load unless the system libstdc++ is preloaded,
while `/usr/bin/g++` (which names the `/usr/lib/...` directory) builds one that loads as is. So a
compiler whose library sits in the mapped directory by name wins over one that only matches after
resolving links. (Linking libstdc++ statically
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
    """The libstdc++ file this process maps, as /proc/self/maps names it."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libstdc++.so" in line:
                return Path(line.split()[-1])
    return None


def _compiler_libstdcxx(cxx: str) -> Path | None:
    """The libstdc++ the compiler links against, normalised lexically (symlinked folders kept)."""
    try:
        out = subprocess.run([cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    path = Path(os.path.normpath(out.stdout.strip()))
    return path if out.returncode == 0 and path.is_absolute() and path.exists() else None


def libstdcxx_match(compiler_lib: Path | None, loaded: Path | None) -> str:
    """"exact" (same file, same folder by name), "resolved" (same file only through links) or "none"."""
    if compiler_lib is None or loaded is None or compiler_lib.resolve() != loaded.resolve():
        return "none"
    return "exact" if compiler_lib.parent == loaded.parent else "resolved"


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
    matches = {cxx: libstdcxx_match(_compiler_libstdcxx(cxx), loaded) for cxx in candidates}
    for wanted in ("exact", "resolved"):
        for cxx, match in matches.items():
            if match == wanted:
                if wanted == "resolved":
                    log.warning("C++ compiler %s reaches this process's libstdc++ (%s) only through symlinks; "
                                "its compiled code may not load", cxx, loaded)
                return {"cxx": shutil.which(cxx), "version": _version(cxx), "libstdcxx_match": True,
                        "libstdcxx_path_match": wanted}
    chosen = candidates[0]
    log.warning("no C++ compiler here uses this process's libstdc++ (%s); using %s, whose compiled code may "
                "not load", loaded, chosen)
    return {"cxx": shutil.which(chosen), "version": _version(chosen), "libstdcxx_match": False}
