"""Does an AOTInductor package built on this machine load in a fresh process, and with which compiler?

A GPU image once crashed at load inside the wrapper's std::regex (docs/gpu.md). This builds a
tiny package with each candidate C++ compiler (the environment's CXX, the system g++, and the
system g++ linking with -Bsymbolic so the wrapper binds its own inlined template code), loads
each one in a fresh process plainly and with the system libstdc++ preloaded, and records where
the regex symbols bound (LD_DEBUG) and the toolchain facts, as JSON.

  python scripts/check_aoti_toolchain.py --out toolchain.json [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SYSTEM_LIBSTDCXX = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"

LOAD_CHILD = r"""
import sys, torch
device = sys.argv[2]
idx = -1 if device == "cpu" else 0
loader = torch._C._aoti.AOTIModelPackageLoader(sys.argv[1], "model", True, 1, idx)
x = torch.randn(4, 16, device=device)
y = loader.run([x])[0]
print("LOADED", tuple(y.shape), float(y.float().abs().sum()) > 0, flush=True)
"""


def run(cmd: list[str], env: dict | None = None, timeout: int = 300) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return {"rc": proc.returncode, "stdout": proc.stdout[-1500:], "stderr": proc.stderr[-1500:]}


def toolchain_facts() -> dict:
    facts = {k: os.environ.get(k) for k in ("CXX", "CC", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    for name, cxx in (("env_cxx", os.environ.get("CXX")), ("system_gxx", "/usr/bin/g++")):
        if cxx and shutil.which(cxx):
            facts[name] = {"path": shutil.which(cxx),
                           "version": run([cxx, "--version"])["stdout"].splitlines()[0],
                           "libstdcxx": run([cxx, "-print-file-name=libstdc++.so.6"])["stdout"].strip()}
    probe = run([sys.executable, "-c", "import torch\nfor l in open('/proc/self/maps'):\n"
                 "    'libstdc++' in l and print(l.split()[-1])\nprint('CONFIG', torch.__config__.show()[:400])"])
    facts["libstdcxx_mapped_after_import_torch"] = sorted(set(
        line for line in probe["stdout"].splitlines() if "libstdc++" in line))
    facts["torch_config_head"] = probe["stdout"].split("CONFIG", 1)[-1][:400]
    return facts


def symbolic_wrapper(real: str, folder: Path) -> str:
    """A compiler wrapper that adds -Wl,-Bsymbolic (ignored when compiling only)."""
    path = folder / "g++-bsymbolic"
    path.write_text(f'#!/bin/sh\nexec {real} "$@" -Wl,-Bsymbolic\n')
    path.chmod(0o755)
    return str(path)


def build_package(cxx: str, out: Path, device: str) -> dict:
    child = r"""
import sys, torch
import torch._inductor
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
    def forward(self, x):
        return torch.relu(self.lin(x)) * 2
dev = sys.argv[2]
m = M().to(dev).eval()
ep = torch.export.export(m, (torch.randn(4, 16, device=dev),))
with torch._inductor.config.patch({"cpp.cxx": (sys.argv[3],)}):
    torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[1])
print("BUILT")
"""
    return run([sys.executable, "-c", child, str(out), device, cxx], timeout=600)


def bindings(package: Path, device: str, env: dict, folder: Path) -> list[str]:
    """Where the loader's regex template symbols bound, from LD_DEBUG=bindings."""
    log = folder / "lddebug"
    run([sys.executable, "-c", LOAD_CHILD, str(package), device],
        env={**env, "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(log)})
    lines = []
    for f in folder.glob("lddebug*"):
        lines += [ln.strip() for ln in f.read_text(errors="replace").splitlines() if "regex" in ln or "_Compiler" in ln]
        f.unlink()
    return lines[:12]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    report = {"facts": toolchain_facts(), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        compilers = {"system": "/usr/bin/g++", "system_bsymbolic": symbolic_wrapper("/usr/bin/g++", folder)}
        if os.environ.get("CXX") and shutil.which(os.environ["CXX"]):
            compilers = {"env_cxx": os.environ["CXX"],
                         "env_cxx_bsymbolic": symbolic_wrapper(shutil.which(os.environ["CXX"]), folder), **compilers}
        for name, cxx in compilers.items():
            package = folder / f"{name}.pt2"
            entry = {"cxx": cxx, "build": build_package(cxx, package, a.device)}
            if package.exists():
                plain = dict(os.environ)
                preload = {**os.environ, "LD_PRELOAD": SYSTEM_LIBSTDCXX}
                entry["load_plain"] = run([sys.executable, "-c", LOAD_CHILD, str(package), a.device], env=plain)
                entry["load_preload_system_libstdcxx"] = run([sys.executable, "-c", LOAD_CHILD, str(package), a.device],
                                                             env=preload)
                entry["regex_bindings_plain"] = bindings(package, a.device, plain, folder)
            report["variants"][name] = entry
            a.out.write_text(json.dumps(report, indent=1))
    summary = {name: {k: v["rc"] for k, v in e.items() if isinstance(v, dict) and "rc" in v}
               for name, e in report["variants"].items()}
    print(json.dumps({"facts": report["facts"], "rc": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
