"""Where decode CUDA-graph capture spends its time at load, per capture size, and whether cheaper
capture orders give the same graphs (outputs compared with the decode package called directly).

Variants, run one after another in one process: `current` (what DecodeGraphs does: a warm-up
call per size, then `torch.cuda.graph`), `warm_largest_only` (one warm-up, for the largest size),
`raw_capture` (that, with CUDAGraph.capture_begin/end on a side stream, no empty_cache per size),
and `current_again` (the first variant repeated: what is left once every size has run once).

  PYTHONPATH=. python scripts/probe_graph_capture.py ARTIFACT capture.json      (GPU only)
"""
from __future__ import annotations

import json
import sys
import time

import torch

from atom_aot.artifact.phase import Phase
from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.execution.cuda_graphs import DecodeGraphs
from atom_aot.runtime.execution.kv_cache import allocate_kv_cache
from atom_aot.runtime.loading.loader import load_artifact

VARIANTS = {"current": (True, False), "warm_largest_only": (False, False), "raw_capture": (False, True),
            "current_again": (True, False)}   # name -> (warm-up every size, raw capture calls)


def capture(graphs: DecodeGraphs, warm_each: bool, raw: bool) -> dict:
    """Capture every size as DecodeGraphs would, timing each step (ms) per size."""
    rows, stream, pool = [], torch.cuda.Stream(), None
    start = time.perf_counter()
    with torch.inference_mode():
        for i, size in enumerate(reversed(graphs.sizes)):
            t0 = time.perf_counter()
            if warm_each or i == 0:
                graphs.forward_at(size)
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            if raw:
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    graph.capture_begin(pool) if pool is not None else graph.capture_begin()
                    t2 = time.perf_counter()
                    output = graphs.forward_at(size)
                    t3 = time.perf_counter()
                    graph.capture_end()
                torch.cuda.current_stream().wait_stream(stream)
            else:
                context = torch.cuda.graph(graph, pool=pool)
                context.__enter__()
                t2 = time.perf_counter()
                output = graphs.forward_at(size)
                t3 = time.perf_counter()
                context.__exit__(None, None, None)
            t4 = time.perf_counter()
            pool = graph.pool()
            graphs.replays[size] = lambda graph=graph, output=output: (graph.replay(), output)[1]
            rows.append({"size": size, "warmup": t1 - t0, "enter": t2 - t1, "body": t3 - t2, "end": t4 - t3})
        torch.cuda.synchronize()
    return {"total_s": time.perf_counter() - start, "per_size": rows}


def max_diff_vs_package(graphs: DecodeGraphs, decode, kv: torch.Tensor, vocab: int, block_size: int) -> float:
    """Largest logit difference between graph replays and direct package calls, random decode batches."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for n in (1, 3, 17, 100):
        seq_lens = torch.randint(5, 128, (n,), device="cuda", dtype=torch.int32, generator=gen)
        blocks = torch.randperm(kv.shape[2] - 1, device="cuda", generator=gen)[: n * 8].view(n, 8).int() + 1
        positions = (seq_lens - 1).long()
        slots = blocks.gather(1, (positions // block_size).view(-1, 1).int()).view(-1).long() * block_size \
            + positions % block_size
        inputs = StepInputs(input_ids=torch.randint(0, vocab, (n,), device="cuda", generator=gen),
                            positions=positions, kv_cache=kv, slot_mapping=slots, block_tables=blocks,
                            seq_lens=seq_lens, query_start_loc=torch.arange(n + 1, device="cuda", dtype=torch.int32),
                            logits_indices=torch.arange(n, device="cuda"))
        with torch.inference_mode():
            direct = decode(inputs).float()
            replayed = graphs(inputs).float()
        worst = max(worst, (direct - replayed).abs().max().item())
    return worst


def main(argv=None) -> int:
    artifact, out = (sys.argv[1:] if argv is None else argv)[:2]
    start = time.perf_counter()
    loaded = load_artifact(artifact)
    result = {"load_timings": loaded.timings, "load_s": time.perf_counter() - start,
              "sizes": list(loaded.graph_plan.capture_sizes), "variants": {}}
    cfg, block_size = loaded.model_config, loaded.block_size
    kv = allocate_kv_cache(loaded.kv_cache, 1024, block_size, loaded.device).normal_()
    decode = loaded.forwards[Phase.DECODE]
    for name, (warm_each, raw) in VARIANTS.items():
        graphs = DecodeGraphs(decode, kv, tuple(result["sizes"]), -(-loaded.max_model_len // block_size))
        row = capture(graphs, warm_each, raw)
        row["max_abs_diff_vs_package"] = max_diff_vs_package(graphs, decode, kv, cfg.vocab_size, block_size)
        result["variants"][name] = row
        print(name, round(row["total_s"], 3), row["max_abs_diff_vs_package"], flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
