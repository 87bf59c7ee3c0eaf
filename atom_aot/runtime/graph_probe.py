"""`python -m atom_aot.runtime.graph_probe ARGS_JSON`: the graph-pool probe the build runs in a
child process (atom_aot/build/graphs.py). It loads a staged tree's decode package and weights as
serving does, captures every decode size into one pool with the runtime's CUDA-graph code, and
prints the resulting GraphPlan as JSON on its last line. A tensor-parallel build probes rank 0's graph
and shapes on the one GPU the build has, with the collectives stood in for (the pool is per rank; the
ranks' graphs are the same)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from atom_aot.artifact.graph_plan import GraphPlan
from atom_aot.artifact.layout import CONFIG, package_member, weights_member
from atom_aot.artifact.phase import Phase
from atom_aot.models.parallel import Split, rank_shapes


def probe(staging: Path, sizes: list[int], block_size: int, kv_dtype: str, max_model_len: int,
          split: Split, draw: dict | None = None) -> GraphPlan:
    """`draw` ({dtype, quant}): the staged weights member holds only what a draw cannot reproduce
    (--load-format dummy-at-load), so rank 0's weights are drawn here as the loader draws them."""
    import torch
    from safetensors.torch import load_file

    from atom_aot.distributed.collectives import register_stand_in
    from atom_aot.models import ModelConfig
    from atom_aot.runtime.compiled import CompiledModel
    from atom_aot.runtime.cuda_graphs import DecodeGraphs
    from atom_aot.runtime.kv_cache import allocate_kv_cache
    device = torch.device("cuda")
    cfg = rank_shapes(ModelConfig.from_json(staging / CONFIG), split)
    if split.world_size > 1:
        register_stand_in()
    weights = load_file(str(staging / weights_member(0)), device="cuda")
    if draw is not None:
        from safetensors import safe_open

        from atom_aot.runtime.drawn_weights import draw_weights, recorded_draw_order
        with safe_open(str(staging / weights_member(0)), "pt") as stored:
            shapes = recorded_draw_order(stored.metadata() or {})
        weights = draw_weights(staging / Path(CONFIG).parent, getattr(torch, draw["dtype"]), draw["quant"],
                               max_model_len, split, 0, device, weights, shapes)
    decode = CompiledModel(staging / package_member(Phase.DECODE), device).bind(weights)
    kv_cache = allocate_kv_cache(cfg, sizes[-1] + 1, block_size, getattr(torch, kv_dtype), device)
    del weights                       # bound into the package: the loader's dict of them is not needed
    torch.cuda.synchronize()
    # Cached free blocks (the load's, the draw's) are given back first: the capture could reuse them (the pool
    # measured too small) or the allocator could release them under memory pressure mid-capture (a GPU shared
    # with another process), making the difference negative (seen on a shared H100, session 34).
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    graphs = DecodeGraphs(decode, kv_cache, tuple(sizes), -(-max_model_len // block_size))
    graphs.capture()
    grown = torch.cuda.memory_reserved() - before
    if grown < 0:
        raise RuntimeError(f"the graph pool measured {grown} bytes: this process's reserved GPU memory shrank during "
                           f"the capture (the allocator freed cached memory under pressure: is another process using "
                           f"this GPU?); build on an idle GPU")
    return GraphPlan(tuple(sizes), grown,
                     "pool_bytes: memory reserved by capturing every size into one pool (static inputs included)")


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    plan = probe(Path(a["staging"]), a["sizes"], a["block_size"], a["kv_dtype"], a["max_model_len"], Split(**a["split"]),
                 a["draw"])
    print(plan.to_json(indent=None))
