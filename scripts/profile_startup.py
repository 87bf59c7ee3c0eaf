"""Where a cold start's seconds go: fresh processes to first token from an artifact, and one run
under cProfile with the compiled packages' contents and per-package load times.

  PYTHONPATH=. python scripts/profile_startup.py --artifact ART --out startup.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

PROFILED_CHILD = r"""
import cProfile, io, json, pstats, sys, time, zipfile
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter()
from atom_aot import LLMEngine, SamplingParams
profiler = cProfile.Profile()
profiler.enable()
engine = LLMEngine(sys.argv[1])
profiler.disable()
t_ready = time.perf_counter()
engine.generate(["Hello"], SamplingParams(temperature=0, max_tokens=1))
t_first = time.perf_counter()
report = {"import_torch_s": t_torch - t0, "engine_init_s": t_ready - t_torch, "first_token_s": t_first - t0,
          "timings": engine.loaded.timings, "packages": {}}
for sort in ("cumulative", "tottime"):
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(30)
    report["profile_" + sort] = out.getvalue()[-6000:]
from atom_aot.artifact.reader import Artifact
art = Artifact.open(sys.argv[1])
for phase, member in art.manifest.compiled.packages.items():
    path = art.member_path(member)
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
    start = time.perf_counter()
    torch._C._aoti.AOTIModelPackageLoader(str(path), "model", True, 1, 0 if torch.cuda.is_available() else -1)
    report["packages"][phase] = {"bytes": path.stat().st_size, "entries": len(infos),
        "largest": sorted(((i.file_size, i.filename) for i in infos), reverse=True)[:6],
        "reload_s": time.perf_counter() - start}
print("RESULT " + json.dumps(report, default=str), flush=True)
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    from atom_aot.bench.cold_start import measure
    result = measure(a.artifact, "", {}, include_hf=False, include_jit=False)
    out = subprocess.run([sys.executable, "-c", PROFILED_CHILD, str(a.artifact)], capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    result["profiled"] = json.loads(lines[-1][7:]) if lines else {"exit_code": out.returncode,
                                                                  "stderr_tail": out.stderr[-3000:]}
    a.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str)[-8000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
