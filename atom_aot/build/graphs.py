"""CUDA-graph capture sizes and the graph-pool bytes they need, measured at build (graphs.json),
so the runtime sets that memory aside before sizing the KV cache and captures without trial.

The probe loads the freshly compiled decode package in a new process, as serving will: a process
that has just compiled (Inductor, Triton JIT) is not where the runtime's code ever runs.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from atom_aot.build.config import BuildConfig


def probe_capture_sizes(config: BuildConfig, staging: Path, max_model_len: int) -> dict:
    if config.arch == "cpu" or not (staging / "compiled" / "decode.pt2").exists():
        return {"capture_sizes": [], "pool_bytes": 0, "note": f"no CUDA graphs on the {config.arch} arch"}
    if not config.graph_capture_sizes:
        return {"capture_sizes": [], "pool_bytes": 0, "note": "built with --capture-sizes none: no CUDA graphs"}
    args = {"staging": str(staging), "sizes": list(config.graph_capture_sizes), "block_size": config.block_size,
            "kv_dtype": str(config.kv_torch_dtype).removeprefix("torch."), "max_model_len": max_model_len}
    out = subprocess.run([sys.executable, "-m", "atom_aot.build.graphs", json.dumps(args)], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the capture-size probe failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _probe(staging: Path, sizes: list[int], block_size: int, kv_dtype: str, max_model_len: int) -> dict:
    import torch
    from safetensors.torch import load_file

    from atom_aot.models import ModelConfig
    from atom_aot.runtime.compiled import CompiledModel
    from atom_aot.runtime.cuda_graphs import DecodeGraphs
    from atom_aot.runtime.kv_cache import allocate_kv_cache
    device = torch.device("cuda")
    cfg = ModelConfig.from_json(staging / "config" / "config.json")
    weights = load_file(str(staging / "weights" / "rank0.safetensors"), device="cuda")
    decode = CompiledModel(staging / "compiled" / "decode.pt2", device).bind(weights)
    kv_cache = allocate_kv_cache(cfg, sizes[-1] + 1, block_size, getattr(torch, kv_dtype), device)
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    graphs = DecodeGraphs(decode, kv_cache, tuple(sizes), -(-max_model_len // block_size))
    graphs.capture()
    return {"capture_sizes": sizes, "pool_bytes": torch.cuda.memory_reserved() - before,
            "note": "pool_bytes: memory reserved by capturing every size into one pool (static inputs included)"}


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    print(json.dumps(_probe(Path(a["staging"]), a["sizes"], a["block_size"], a["kv_dtype"], a["max_model_len"])))
