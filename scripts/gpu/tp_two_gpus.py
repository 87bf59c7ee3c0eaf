"""Tensor parallelism on a machine of several GPUs: what one GPU could not show.

  python scripts/gpu/tp_two_gpus.py collectives --out FILE.json      # NCCL vs symmetric-memory all-reduce
  python scripts/gpu/tp_two_gpus.py tiny --out FILE.json             # greedy TP-2 == TP-1, tiny fp32 models
  python scripts/gpu/tp_two_gpus.py logits --tp1 ART --tp2 ART --out FILE.json
  python scripts/gpu/tp_two_gpus.py plan --table COLLECTIVES.json     # the ATOM_ALL_REDUCE_* bounds it supports

collectives: one process per GPU. For each message of a decoder layer's all-reduce (T tokens x
hidden 4096, bf16) it times NCCL's all-reduce (eager and replayed from a CUDA graph of 32 calls), the path the
compiled graphs call (`atom::all_reduce`: peer memory or NCCL by size, distributed/symmetric_all_reduce.py) and torch's symmetric-memory one-shot / two-shot all-reduce on a prefix
view of one preallocated buffer (P2P loads, no NVLink multicast; ATOM_BENCH_SYMM_MEM=0 skips them), and NCCL's
bus bandwidth on 1 GiB, the reference the issue names. Rank 0 writes the table row by row.
tiny: tiny fp32 Llama (weights only, eager) and Qwen3 (AOTInductor-compiled, CUDA graphs) built for this GPU at
-tp 1, -tp 2 and (with 4 GPUs) -tp 4, side by side in processes of their own; greedy tokens of 8 prompts compared
with -tp 1's; each engine in a fresh process, or with --same-process one after another in this one (what
LLMEngine.close and a rejoin must allow). The JSON is written after every engine.
logits: first-token log-probabilities (top 20) and 32 greedy tokens of the same prompts from two artifacts
of the same random weights (a -tp 1 and a -tp 2 build of one folder with --load-format dummy).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HIDDEN = 4096                          # Llama-3.1-8B's hidden size: the all-reduced rows
TOKENS = (1, 8, 32, 128, 256, 1024, 4096, 8192)
CALLS_PER_GRAPH = 32
TINY_TP_SIZES = (1, 2, 4)              # those the GPUs present allow
TINY_MODELS = (("LlamaForCausalLM", "none"), ("Qwen3ForCausalLM", "aoti"))     # --tiny-models N: the first N


def _time_cuda(fn, iters: int) -> float:
    """Mean seconds per call of fn over iters calls (after a warm-up), by CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


_GRAPHS: list = []     # freed before the process group is destroyed (NCCL's destroy waits on them otherwise)


def _graphed(fn, calls: int = CALLS_PER_GRAPH) -> "callable":
    """fn called `calls` times, captured in one CUDA graph; returns the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    _GRAPHS.append(graph)
    return graph.replay


def _collectives_rank(rank: int, world: int, port: int, out_path: str) -> None:
    import torch.distributed as dist
    from atom_aot.distributed.collectives import all_reduce, all_reduce_path
    from atom_aot.distributed.group import RankPlace, join, leave
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    join(RankPlace(rank, world, "127.0.0.1", port, rank), device)
    group = dist.group.WORLD
    result: dict = {"world_size": world, "hidden": HIDDEN, "dtype": "bfloat16", "rows": []}
    symm = buffer = None
    if os.environ.get("ATOM_BENCH_SYMM_MEM", "1") == "1":
        import torch.distributed._symmetric_memory as symm
        # one buffer for every size, as an engine would hold it: each call reduces a prefix view of it
        buffer = symm.empty(max(TOKENS) * HIDDEN, device=device, dtype=torch.bfloat16)
        symm.rendezvous(buffer, group.group_name)
    else:
        result["symmetric_memory"] = "not run (ATOM_BENCH_SYMM_MEM=0)"
    # correctness first: every path sums the ranks' tensors
    x = torch.randn(64, HIDDEN, device=device, dtype=torch.bfloat16, generator=torch.Generator(device).manual_seed(rank))
    parts = [torch.randn(64, HIDDEN, device=device, dtype=torch.bfloat16,
                         generator=torch.Generator(device).manual_seed(r)) for r in range(world)]
    expected = sum(p.double() for p in parts)
    result["atom_all_reduce_max_err"] = (all_reduce(x).double() - expected).abs().max().item()
    result["atom_all_reduce_path_64_rows"] = all_reduce_path(x)
    for tokens in (1, 256, 2048):             # each path the plan takes, against the float64 sum
        mine = parts[rank][:1].expand(tokens, HIDDEN).contiguous()
        want = sum(p[:1].double() for p in parts).expand(tokens, HIDDEN)
        result[f"atom_all_reduce_{tokens}_rows"] = {"path": all_reduce_path(mine),
                                                    "max_err": (all_reduce(mine).double() - want).abs().max().item()}
    for tokens in TOKENS:
        x = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
        nbytes = x.numel() * x.element_size()
        iters = 200 if tokens <= 1024 else 50
        row = {"tokens": tokens, "bytes": nbytes}
        row["nccl_eager_us"] = _time_cuda(lambda: dist.all_reduce(x, group=group), iters) * 1e6
        row["nccl_graph_us"] = (_time_cuda(_graphed(lambda: dist.all_reduce(x, group=group)), max(iters // CALLS_PER_GRAPH, 5))
                                / CALLS_PER_GRAPH * 1e6)
        row["atom_all_reduce_path"] = all_reduce_path(x)
        row["atom_all_reduce_eager_us"] = _time_cuda(lambda: all_reduce(x), iters) * 1e6
        replay = _graphed(lambda: all_reduce(x))
        row["atom_all_reduce_graph_us"] = _time_cuda(replay, max(iters // CALLS_PER_GRAPH, 5)) / CALLS_PER_GRAPH * 1e6
        if buffer is not None:
            try:
                view, out = buffer[:x.numel()].view_as(x), torch.empty_like(x)
                one = lambda: torch.ops.symm_mem.one_shot_all_reduce_copy_out(view, x, "sum", group.group_name, out)  # noqa: E731
                row["symm_one_shot_copy_eager_us"] = _time_cuda(one, iters) * 1e6
                row["symm_one_shot_copy_graph_us"] = (_time_cuda(_graphed(one), max(iters // CALLS_PER_GRAPH, 5))
                                                      / CALLS_PER_GRAPH * 1e6)
                mine = parts[rank][:1].expand(tokens, HIDDEN).contiguous()
                want = sum(p[:1].double() for p in parts).expand(tokens, HIDDEN)
                torch.ops.symm_mem.one_shot_all_reduce_copy_out(view, mine, "sum", group.group_name, out)
                row["symm_one_shot_max_err"] = (out.double() - want).abs().max().item()
                if x.numel() % (world * 8) == 0:          # two-shot: 16-byte vectors, split over the ranks
                    def two():
                        view.copy_(x)
                        torch.ops.symm_mem.two_shot_all_reduce_out(view, "sum", group.group_name, out)
                    row["symm_two_shot_eager_us"] = _time_cuda(two, iters) * 1e6
                    row["symm_two_shot_graph_us"] = (_time_cuda(_graphed(two), max(iters // CALLS_PER_GRAPH, 5))
                                                     / CALLS_PER_GRAPH * 1e6)
                    view.copy_(mine)
                    torch.ops.symm_mem.two_shot_all_reduce_out(view, "sum", group.group_name, out)
                    row["symm_two_shot_max_err"] = (out.double() - want).abs().max().item()
            except Exception as e:
                row["symm_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        for key in [k for k in row if k.endswith("_us")]:
            row[key.replace("_us", "_bus_GBps")] = round(2 * (world - 1) / world * nbytes / (row[key] * 1e-6) / 1e9, 1)
            row[key] = round(row[key], 2)
        result["rows"].append(row)
        if rank == 0:                                  # kept row by row: a later hang loses nothing measured
            Path(out_path).write_text(json.dumps(result, indent=1))
    big = torch.randn(1 << 29, device=device, dtype=torch.bfloat16)     # 1 GiB
    seconds = _time_cuda(lambda: dist.all_reduce(big, group=group), 10)
    result["nccl_1GiB"] = {"ms": round(seconds * 1e3, 3),
                           "bus_GBps": round(2 * (world - 1) / world * big.numel() * 2 / seconds / 1e9, 1)}
    if rank == 0:
        Path(out_path).write_text(json.dumps(result, indent=1))
    torch.cuda.synchronize()
    for graph in _GRAPHS:
        graph.reset()
    dist.barrier()
    leave()


def collectives(out: dict, out_path: str) -> None:
    import torch.multiprocessing as mp
    from atom_aot.distributed.group import free_port
    world = torch.cuda.device_count()
    table = out_path + ".rows.json"            # rank 0's table, also when this process is stopped before the end
    mp.spawn(_collectives_rank, args=(world, free_port(), table), nprocs=world, join=True)
    out["collectives"] = json.loads(Path(table).read_text())


def plan_from_table(rows: list[dict]) -> dict[str, int]:
    """The all-reduce bounds a collectives table supports (by CUDA-graph time, as the decode graphs run them):
    one-shot while it beats NCCL and two-shot from the smallest size up, then two-shot while it beats NCCL."""
    one_shot_max = two_shot_max = 0
    one_shot_phase = True
    for row in sorted(rows, key=lambda r: r["bytes"]):
        nccl, one, two = (row.get(k, float("inf")) for k in ("nccl_graph_us", "symm_one_shot_copy_graph_us",
                                                             "symm_two_shot_graph_us"))
        if one_shot_phase and one < min(nccl, two):
            one_shot_max = row["bytes"]
            continue
        one_shot_phase = False
        if two < nccl:
            two_shot_max = row["bytes"]
            continue
        break
    return {"ATOM_ALL_REDUCE_ONE_SHOT_MAX": one_shot_max, "ATOM_ALL_REDUCE_TWO_SHOT_MAX": two_shot_max}


def _greedy(artifact: Path, prompts: list[str], max_tokens: int) -> list[list[int]]:
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(str(artifact), max_model_len=512, num_kv_blocks=512)   # not a share of a GPU others use
    try:
        outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        return [o["token_ids"] for o in outs]
    finally:
        engine.close()


def _in_fresh_process(fn, *args):
    """fn(*args) in a new interpreter: each engine starts as a user's would (its ranks forked from a process
    with no CUDA context), and one engine's faults cannot reach the next."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def tiny(out: dict, models: int, same_process: bool, save) -> None:
    """same_process: the engines run one after another in this process (what LLMEngine.close must allow; the
    free memory after each close is recorded), else each in a fresh process. `save()` writes `out` after every
    engine, so a run cut short by its time limit keeps what it finished."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from factories import make_tiny_model
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    prompts = ["Hello world! How are", "The quick brown fox", "0123456789 + - * / =", "Paged attention stores",
               "a b c d e f g", "Once upon a time", "def main():", "The capital of France is"]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for architecture, compile_mode in TINY_MODELS[:models]:
            model = make_tiny_model(work / architecture, architecture)
            tokens, seconds = {}, {}
            sizes = TINY_TP_SIZES[:1 + (torch.cuda.device_count() >= 2) + (torch.cuda.device_count() >= 4)]
            with ProcessPoolExecutor(len(sizes), mp_context=multiprocessing.get_context("spawn")) as pool:
                built = {tp: pool.submit(_build_tiny, model, compile_mode, tp, work / f"cache-tp{tp}") for tp in sizes}
                built = {tp: future.result() for tp, future in built.items()}     # side by side: one call's time
            for tp in sizes:
                art, seconds[f"build_tp{tp}_s"] = built[tp]
                if same_process:
                    tokens[tp] = _greedy(art, prompts, 24)
                    seconds[f"gpu0_free_GB_after_tp{tp}_closed"] = round(torch.cuda.mem_get_info(0)[0] / 1e9, 1)
                else:
                    tokens[tp] = _in_fresh_process(_greedy, art, prompts, 24)
                results[f"{architecture}_{compile_mode}"] = {
                    **seconds, "prompts": len(prompts), "tokens_each": 24,
                    **{f"tp{tp}_equals_tp1": tokens[tp] == tokens[1] for tp in tokens if tp > 1},
                    **{f"tp{tp}_sequences_equal": sum(a == b for a, b in zip(tokens[1], tokens[tp]))
                       for tp in tokens if tp > 1}}
                out["tiny_fp32_greedy"] = {"engines": "one process" if same_process else "a fresh process each",
                                           **results}
                save()


def _build_tiny(model: Path, compile_mode: str, tp: int, cache_dir: Path) -> tuple[Path, float]:
    """(the artifact, build seconds): a tiny fp32 build in its own process, so the -tp sizes build side by side."""
    from atom_aot.arch import detect_arch
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.pipeline import build
    config = BuildConfig(arch=detect_arch(), dtype="float32", compile=compile_mode, tensor_parallel_size=tp)
    t = time.perf_counter()
    art = build(str(model), config, cache_dir=cache_dir, show_progress=False).path
    return art, round(time.perf_counter() - t, 1)


def _first_token_logprobs(artifact: str, prompts: list[list[int]], greedy_tokens: int) -> tuple[list, list]:
    """Per prompt: {token: logprob} of the first output position (top 20) and greedy_tokens greedy tokens."""
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(artifact, max_model_len=1024, gpu_memory_utilization=0.85)
    try:
        tops: dict[str, dict] = {}
        ids = engine.add_request(prompts, SamplingParams(temperature=0, max_tokens=1, logprobs=20, ignore_eos=True))
        while not engine.is_finished():
            for o in engine.step():
                if o.logprobs:
                    tops[o.request_id] = dict(o.logprobs[0].top)
        greedy = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=greedy_tokens, ignore_eos=True))
        return [tops[r] for r in ids], [g["token_ids"] for g in greedy]
    finally:
        engine.close()


def logits(out: dict, tp1: str, tp2: str, vocab: int) -> None:
    import random
    rng = random.Random(7)
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(n)] for n in (16, 64, 128, 200, 256, 333, 512, 700)]
    top1, greedy1 = _in_fresh_process(_first_token_logprobs, tp1, prompts, 32)
    top2, greedy2 = _in_fresh_process(_first_token_logprobs, tp2, prompts, 32)
    rows = []
    for a, b, g1, g2 in zip(top1, top2, greedy1, greedy2):
        shared = set(a) & set(b)
        diffs = [abs(a[t] - b[t]) for t in shared]
        same_prefix = next((i for i, (x, y) in enumerate(zip(g1, g2)) if x != y), len(g1))
        rows.append({"top20_shared": len(shared), "max_abs_logprob_diff": round(max(diffs), 5),
                     "mean_abs_logprob_diff": round(sum(diffs) / len(diffs), 5),
                     "argmax_equal": max(a, key=a.get) == max(b, key=b.get),
                     "greedy_tokens_equal_before_first_difference": same_prefix})
    out["logits_tp2_vs_tp1"] = {"tp1": Path(tp1).name, "tp2": Path(tp2).name, "prompt_lengths": [len(p) for p in prompts],
                                "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["collectives", "tiny", "logits", "plan"])
    p.add_argument("--tiny-models", type=int, default=len(TINY_MODELS), help="tiny: the first N of " + str(TINY_MODELS))
    p.add_argument("--same-process", action="store_true", help="tiny: run the engines one after another in this process")
    p.add_argument("--table", help="plan: a collectives JSON; prints the ATOM_ALL_REDUCE_* bounds it supports")
    p.add_argument("--out", help="the JSON written (all but plan)")
    p.add_argument("--tp1")
    p.add_argument("--tp2")
    p.add_argument("--vocab", type=int, default=128256, help="prompt token ids are drawn below this (logits)")
    a = p.parse_args()
    if a.what != "plan" and not a.out:
        p.error("--out is required")
    if a.what == "plan":
        table = json.loads(Path(a.table).read_text())
        print(" ".join(f"{k}={v}" for k, v in plan_from_table(table.get("collectives", table)["rows"]).items()))
        return
    out = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "gpus": torch.cuda.device_count(), "torch": torch.__version__,
           "nccl_env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM"))}}
    t = time.perf_counter()
    try:
        if a.what == "collectives":
            collectives(out, a.out)
        elif a.what == "tiny":
            tiny(out, a.tiny_models, a.same_process, save=lambda: Path(a.out).write_text(json.dumps(out, indent=1)))
        else:
            logits(out, a.tp1, a.tp2, a.vocab)
    except Exception as e:
        import traceback
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-3000:]
    out["seconds"] = round(time.perf_counter() - t, 1)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1)[-6000:])


if __name__ == "__main__":
    main()
