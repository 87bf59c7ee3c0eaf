"""What of tensor parallelism one GPU can show: a TP-2 artifact built and inspected on it, its start
refused with the build that fits, and the world-size-1 NCCL path of the in-graph collectives
(atom::all_reduce / atom::all_gather / atom::reduce_scatter on an NCCL group, eager and captured in a CUDA
graph; --collectives-only skips the build).

  python scripts/gpu/tp_one_gpu.py --out FILE.json [--collectives-only | --dp-attention]
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


def build_tp2(work: Path, dp_attention: bool = False) -> dict:
    """A TP-2 artifact of a tiny Qwen3, or (`dp_attention`) a -dp 2 --ep one of a tiny Qwen3-MoE."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from factories import make_tiny_model
    from atom_aot.arch import detect_arch
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.pipeline import build
    if dp_attention:
        model = make_tiny_model(work / "tiny-qwen3moe", "Qwen3MoeForCausalLM", num_experts=8, num_experts_per_tok=2,
                                moe_intermediate_size=64, norm_topk_prob=True)
        config = BuildConfig(arch=detect_arch(), data_parallel_size=2, enable_expert_parallel=True)
    else:
        model = make_tiny_model(work / "tiny-qwen3", "Qwen3ForCausalLM")
        config = BuildConfig(arch=detect_arch(), tensor_parallel_size=2)
    t = time.perf_counter()
    result = build(str(model), config, cache_dir=work / "cache", show_progress=False)
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
    from atom_aot.distributed.collectives import all_gather_columns, all_gather_rows, all_reduce, reduce_scatter_rows
    from atom_aot.distributed.group import RankPlace, join, leave
    device = torch.device("cuda", 0)
    group = join(RankPlace.local_leader(1), device)
    backend = torch.distributed.get_backend()
    x = torch.randn(64, 4096, device=device, dtype=torch.bfloat16)
    eager_reduce = torch.equal(all_reduce(x), x)
    eager_gather = torch.equal(all_gather_columns(x, 1), x)
    eager_rows = torch.equal(all_gather_rows(x, 1), x)
    eager_scatter = torch.equal(reduce_scatter_rows(x, 1), x)
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
    # the data-parallel-attention expert layer's pair (models/moe.py), warmed up then captured
    with torch.cuda.stream(stream):
        for _ in range(2):
            reduce_scatter_rows(all_gather_rows(static_in, 1) * 3, 1)
    torch.cuda.current_stream().wait_stream(stream)
    pair_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(pair_graph):
        pair_out = reduce_scatter_rows(all_gather_rows(static_in, 1) * 3, 1)
    fresh = torch.randn_like(x)
    static_in.copy_(fresh)
    pair_graph.replay()
    torch.cuda.synchronize()
    pair_graphed = torch.equal(pair_out, fresh * 3)
    leave()
    return {"backend": backend, "world_size": group.world_size, "all_reduce_eager_equal": eager_reduce,
            "all_gather_eager_equal": eager_gather, "all_reduce_in_cuda_graph_equal": graphed,
            "all_gather_rows_eager_equal": eager_rows, "reduce_scatter_eager_equal": eager_scatter,
            "gather_scatter_pair_in_cuda_graph_equal": pair_graphed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--collectives-only", action="store_true", help="skip the TP-2 build")
    p.add_argument("--dp-attention", action="store_true",
                   help="build a tiny Qwen3-MoE with -dp 2 --ep (data-parallel attention) instead of the TP-2 Qwen3")
    a = p.parse_args()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    try:
        out["nccl_world_of_one"] = nccl_world_of_one()
    except Exception as e:
        out["nccl_world_of_one"] = {"error": f"{type(e).__name__}: {e}"}
    if a.collectives_only:
        out["tp2_build_on_one_gpu"] = "not run (--collectives-only)"
    else:
        with tempfile.TemporaryDirectory() as work:
            key = "dp2_ep_build_on_one_gpu" if a.dp_attention else "tp2_build_on_one_gpu"
            try:
                out[key] = build_tp2(Path(work), a.dp_attention)
            except Exception as e:
                out[key] = {"error": f"{type(e).__name__}: {e}"}
    json.dump(out, open(a.out, "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
