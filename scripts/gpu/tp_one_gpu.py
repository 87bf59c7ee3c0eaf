"""What of tensor parallelism one GPU can show: a TP-2 artifact built and inspected on it, its start
refused with the build that fits, and the world-size-1 NCCL path of the in-graph collectives
(atom::all_reduce / atom::all_gather on an NCCL group, eager and captured in a CUDA graph).

  python scripts/gpu/tp_one_gpu.py --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def build_tp2(work: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from factories import make_tiny_model
    from atom_aot.arch import detect_arch
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.pipeline import build
    model = make_tiny_model(work / "tiny-qwen3", "Qwen3ForCausalLM")
    t = time.perf_counter()
    result = build(str(model), BuildConfig(arch=detect_arch(), tensor_parallel_size=2), cache_dir=work / "cache",
                   show_progress=False)
    seconds = time.perf_counter() - t
    inspect = subprocess.run([sys.executable, "-m", "atom_aot.entrypoints.run_cli", str(result.path), "inspect"],
                             capture_output=True, text=True)
    from atom_aot import LLMEngine
    try:
        LLMEngine(str(result.path), max_model_len=256)
        refusal = None
    except Exception as e:                       # the refusal is what is measured here
        refusal = f"{type(e).__name__}: {e}"
    return {"artifact": result.path.name, "build_s": round(seconds, 1), "inspect": inspect.stdout[-3000:],
            "inspect_rc": inspect.returncode, "start_on_one_gpu": refusal}


def nccl_world_of_one() -> dict:
    from atom_aot.distributed.collectives import all_gather_columns, all_reduce
    from atom_aot.distributed.group import RankPlace, join, leave
    device = torch.device("cuda", 0)
    group = join(RankPlace.local_leader(1), device)
    backend = torch.distributed.get_backend()
    x = torch.randn(64, 4096, device=device, dtype=torch.bfloat16)
    eager_reduce = torch.equal(all_reduce(x), x)
    eager_gather = torch.equal(all_gather_columns(x, 1), x)
    static_in = torch.randn_like(x)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            all_reduce(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = all_reduce(static_in) * 2
    fresh = torch.randn_like(x)
    static_in.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    graphed = torch.equal(static_out, fresh * 2)
    leave()
    return {"backend": backend, "world_size": group.world_size, "all_reduce_eager_equal": eager_reduce,
            "all_gather_eager_equal": eager_gather, "all_reduce_in_cuda_graph_equal": graphed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    try:
        out["nccl_world_of_one"] = nccl_world_of_one()
    except Exception as e:
        out["nccl_world_of_one"] = {"error": f"{type(e).__name__}: {e}"}
    with tempfile.TemporaryDirectory() as work:
        try:
            out["tp2_build_on_one_gpu"] = build_tp2(Path(work))
        except Exception as e:
            out["tp2_build_on_one_gpu"] = {"error": f"{type(e).__name__}: {e}"}
    json.dump(out, open(a.out, "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
