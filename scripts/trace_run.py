"""One offline throughput run (sbs.py's workload) traced step by step: where the run's time goes besides kernels.

A profile of one decode step (profile_decode.py) says what a step costs; this says how many steps a run takes,
what each carried (prefill tokens, decode rows), how long each took on the host clock, and what happened
around them: KV blocks left, preemptions, and Python's garbage collections (each pause, its generation and
the step it fell in). The JSON's summary names the steps whose wall was over twice the median and the tail
(steps once fewer than all sequences still run).

  PYTHONPATH=. python scripts/trace_run.py --artifact ART --out trace.json [--num-prompts 256 --input-len 1024
      --output-len 512 --gpu-memory-utilization 0.85 --max-model-len 4096]
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import statistics
import time
from pathlib import Path

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--num-kv-blocks", type=int, default=None, help="force the KV pool's size (an A/B of sizing)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the step budget (default: the artifact's target's, 8192 on a GPU, 128 on the CPU)")
    p.add_argument("--gc-freeze", action="store_true",
                   help="collect, then freeze what survives (gc.freeze) after the warm-up: the A/B of GC pauses")
    p.add_argument("--label", default="")
    return p.parse_args(argv)


def sbs_prompts(n: int, length: int, vocab: int, seed: int = 4) -> list[list[int]]:
    """The shared harness's throughput prompts (sbs.py: random ids in [100, vocab - 100), seed 4)."""
    r = random.Random(seed)
    return [[r.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


class GcPauses:
    """Python's collections while installed: (generation, ms, step index) each."""

    def __init__(self):
        self.pauses: list[tuple[int, float, int]] = []
        self.step = -1
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((info["generation"], 1e3 * (time.perf_counter() - self._start), self.step))

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def traced_generate(engine, prompts, params, gc_pauses: GcPauses) -> tuple[float, list[dict], int]:
    """generate() with a record per step; returns (seconds, steps, output tokens)."""
    scheduler = engine.core.scheduler
    blocks = scheduler.block_manager
    ids = engine.add_request(prompts, params)
    steps, finished, outputs = [], 0, 0
    sync()
    start = time.perf_counter()
    while not engine.is_finished():
        gc_pauses.step = len(steps)
        t = time.perf_counter()
        updates = engine.step()
        wall = time.perf_counter() - t
        batch = engine.core._in_flight[-1][0] if engine.core._in_flight else None
        done = [u for u in updates if u.finished]
        finished += len(done)
        outputs += sum(len(u.new_token_ids) for u in updates)
        steps.append({"t_ms": round(1e3 * (t - start), 3), "wall_ms": round(1e3 * wall, 3),
                      "running": len(scheduler.running), "waiting": len(scheduler.waiting),
                      "free_blocks": blocks.num_free_blocks, "preemptions": scheduler.num_preemptions,
                      "finished": finished,
                      "launched_tokens": sum(batch.num_new_tokens) if batch is not None else 0,
                      "launched_rows": len(batch.seqs) if batch is not None else 0,
                      "launched_prefill": bool(batch.is_prefill) if batch is not None else False})
    sync()
    seconds = time.perf_counter() - start
    if finished != len(ids):
        raise RuntimeError(f"{finished} of {len(ids)} requests finished")
    return seconds, steps, outputs


def summarize(steps: list[dict], seconds: float, num_prompts: int, gc_pauses: GcPauses) -> dict:
    walls = [s["wall_ms"] for s in steps]
    median = statistics.median(walls)
    all_running = [i for i, s in enumerate(steps) if s["running"] == num_prompts]
    last_full = all_running[-1] if all_running else -1
    tail = steps[last_full + 1:]
    first_preempt = next((i for i, s in enumerate(steps) if s["preemptions"] > 0), None)
    pauses = gc_pauses.pauses
    return {
        "seconds": seconds, "steps": len(steps), "wall_ms_median": median, "wall_ms_mean": statistics.fmean(walls),
        "steps_over_2x_median": [{"step": i, **steps[i]} for i, w in enumerate(walls) if w > 2 * median][:40],
        "ms_in_steps_over_2x_median": sum(w - median for w in walls if w > 2 * median),
        "preemptions": steps[-1]["preemptions"] if steps else 0, "first_preemption_step": first_preempt,
        "min_free_blocks": min(s["free_blocks"] for s in steps) if steps else None,
        "last_step_with_all_running": last_full,
        "tail": {"steps": len(tail), "ms": sum(s["wall_ms"] for s in tail),
                 "rows_per_step_mean": statistics.fmean(s["launched_rows"] for s in tail) if tail else 0},
        "prefill_steps": sum(s["launched_prefill"] for s in steps),
        # each step's wall is mostly the step launched before it (async scheduling): a phase's sum, to a step or two
        "ms_by_phase": {phase: sum(s["wall_ms"] for s in steps if s["launched_prefill"] == (phase == "prefill"))
                        for phase in ("prefill", "decode")},
        "gc": {"count_by_generation": {g: sum(1 for p in pauses if p[0] == g) for g in (0, 1, 2)},
               "ms_by_generation": {g: sum(p[1] for p in pauses if p[0] == g) for g in (0, 1, 2)},
               "longest": sorted(pauses, key=lambda p: -p[1])[:10]},
    }


def memory(engine, config) -> dict:
    """The activation reserve this start used, and the bound it replaces: the KV blocks each leaves room for."""
    from atom_aot.runtime.execution.memory import activation_bound, activation_reserve
    loaded = engine.loaded
    config = config.for_target(loaded.manifest.target.arch)      # the step budget the engine ran with
    per_block = loaded.kv_cache.bytes_per_block(loaded.block_size)
    reserve, bound = activation_reserve(loaded, config), activation_bound(loaded, config)
    step_memory = loaded.graph_plan.step_memory
    return {"activation_reserve_bytes": reserve, "activation_bound_bytes": bound, "bytes_per_block": per_block,
            "step_memory": dataclasses.asdict(step_memory) if step_memory else None,
            "kv_blocks_with_the_bound": engine.core.scheduler.block_manager.num_blocks - (bound - reserve) // per_block}


def main(argv=None) -> None:
    args = parse_args(argv)
    from atom_aot.logging_setup import show_engine_logs
    show_engine_logs()
    from atom_aot import SamplingParams
    from atom_aot.runtime.llm_engine import ArtifactEngine
    from atom_aot.runtime.config import RuntimeConfig
    config = RuntimeConfig(max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                           max_num_seqs=args.max_num_seqs, num_kv_blocks=args.num_kv_blocks,
                           max_num_batched_tokens=args.max_num_batched_tokens)
    t = time.perf_counter()
    engine = ArtifactEngine(args.artifact, config)
    init_s = time.perf_counter() - t
    vocab = engine.loaded.model_config.vocab_size
    prompts = sbs_prompts(args.num_prompts, args.input_len, vocab)
    greedy = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    engine.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))   # sbs's warm-up
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    with GcPauses() as pauses:
        seconds, steps, outputs = traced_generate(engine, prompts, greedy, pauses)
    result = {"label": args.label, "artifact": args.artifact, "init_s": init_s, "memory": memory(engine, config),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "config": vars(args) | {"out": str(args.out)},
              "kv_blocks": engine.core.scheduler.block_manager.num_blocks,
              "block_size": engine.core.scheduler.block_manager.block_size,
              "output_tokens": outputs, "output_tok_s": outputs / seconds,
              "summary": summarize(steps, seconds, args.num_prompts, pauses), "steps": steps}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    s = result["summary"]
    print(json.dumps({k: result[k] for k in ("label", "kv_blocks", "output_tok_s", "memory")}
                     | {k: s[k] for k in ("seconds", "steps", "preemptions", "wall_ms_median", "wall_ms_mean",
                                          "ms_in_steps_over_2x_median")} | {"gc": s["gc"]["ms_by_generation"],
                                                                             "tail": s["tail"]}))


if __name__ == "__main__":
    main()
