"""Cold start to first token, each case a fresh process timed from spawn to its first token:
the artifact (twice: page cache cold-ish, then warm), the JIT path (LLMEngine given the model
itself, building into an empty cache first), and Hugging Face transformers (load + one token).

  python -m atom_aot.bench.cold_start --artifact ART --model MODEL --out cold_start.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_OURS = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter()
from atom_aot import LLMEngine, SamplingParams
from atom_aot.runtime.loading.compile_counter import compile_counts, compilers_loaded
from atom_aot.runtime.loading.bytecode import torch_bytecode_state
t_imports = time.perf_counter()
engine = LLMEngine(sys.argv[1], **json.loads(sys.argv[2]))
t_ready = time.perf_counter()
def first(update):
    print("FIRST_TOKEN", flush=True)
engine.add_request(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=1), stream_callback=first)
while not engine.is_finished():
    engine.step()
print("RESULT " + json.dumps({"timings": engine.loaded.timings, "execution": engine.loaded.execution,
      "import_torch_s": t_torch - t0,
      "import_engine_s": t_imports - t_torch, "engine_init_s": t_ready - t_imports,
      "ready_s": t_ready - t0, "compile_counts": compile_counts(), "compilers_loaded": compilers_loaded(),
      **torch_bytecode_state()}), flush=True)
"""

CHILD_HF = r"""
import os, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
folder, gguf = (os.path.dirname(path), {"gguf_file": os.path.basename(path)}) if path.endswith(".gguf") else (path, {})
dev = "cuda" if torch.cuda.is_available() else "cpu"
tok = AutoTokenizer.from_pretrained(folder, **gguf)
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **gguf).to(dev).eval()
ids = tok("Hello, my name is", return_tensors="pt").input_ids.to(dev)
model.generate(ids, max_new_tokens=1, do_sample=False)
if dev == "cuda":
    torch.cuda.synchronize()
print("FIRST_TOKEN", flush=True)
"""


def time_to_first_token(cmd: list[str], timeout: int = 1800) -> dict:
    """Wall seconds from process spawn to its FIRST_TOKEN line (and whatever RESULT it prints)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = {"first_token_s": None}
    for line in proc.stdout:
        if line.startswith("FIRST_TOKEN") and out["first_token_s"] is None:
            out["first_token_s"] = round(time.perf_counter() - start, 3)
        elif line.startswith("RESULT "):
            out.update(json.loads(line[7:]))
    proc.wait(timeout=timeout)
    out["exit_code"] = proc.returncode
    if proc.returncode:
        out["stderr_tail"] = proc.stderr.read()[-2000:]
    return out


def measure(artifact: Path, model: str, engine_kwargs: dict, include_hf: bool = True,
            include_jit: bool = True) -> dict:
    kw = json.dumps(engine_kwargs)
    ours = [time_to_first_token([sys.executable, "-c", CHILD_OURS, str(artifact), kw]) for _ in range(2)]
    result = {"artifact_runs": ours}
    jit = {}
    if include_jit:
        with tempfile.TemporaryDirectory(dir=".") as empty_cache:
            jit = time_to_first_token([sys.executable, "-c", CHILD_OURS, model,
                                       json.dumps({**engine_kwargs, "cache_dir": empty_cache})])
        result["jit_build_then_serve"] = jit
    if include_hf:
        result["transformers"] = time_to_first_token([sys.executable, "-c", CHILD_HF, model])
    best = min((r["first_token_s"] for r in ours if r["first_token_s"]), default=None)
    ratios = {}
    if best and jit.get("first_token_s"):
        ratios["jit_over_artifact"] = jit["first_token_s"] / best
    if best and result.get("transformers", {}).get("first_token_s"):
        ratios["transformers_over_artifact"] = result["transformers"]["first_token_s"] / best
    result["ratios"] = ratios
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True, type=Path)
    p.add_argument("--model", required=True, help="the model the artifact was built from (HF folder or GGUF)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--skip-hf", action="store_true")
    a = p.parse_args(argv)
    import platform
    import torch
    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
              "cpus": os.cpu_count(), **measure(a.artifact, a.model, {}, include_hf=not a.skip_hf)}
    a.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "artifact_runs"}, indent=1, default=str)[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
