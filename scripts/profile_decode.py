"""Where a large-batch decode step goes: measure before changing.

Three measurements in one run, written to one JSON:
  step     the engine at batch B (B prompts of I random tokens, all decoding): wall time per step and
           the host time of each part of it (schedule, prepare_inputs, forward and sampling launch,
           reading the sampled tokens back (waits for the GPU), scheduler update, output processing /
           detokenization), timed by wrapping the engine's own methods for the measured steps only.
           With async scheduling (the default; --no-async-scheduling turns it off) a step launches
           step N+1 before it reads step N, so the read waits only for N.
  kernels  torch.profiler over the same steps: GPU time per kernel, grouped (attention, attention
           merge, rope+cache write, GEMMs, fused norms/activations, sampling, copies), the GPU's busy
           share of the step and the idle gaps between kernels.
  attention  the decode attention op alone at batch 1-256 x context 512-4096: achieved KV
           bandwidth (bytes of K and V read / median CUDA-graph replay time) with the artifact's decode
           config and with each candidate, and the key-split count each gets at that batch, against a
           device-to-device copy measured in the same run.

  PYTHONPATH=. python scripts/profile_decode.py --artifact ART --out $OUT/profile.json
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

CATEGORIES = (   # (category, substrings of the kernel name), first match wins
    ("collectives", ("all_reduce", "allreduce", "nccl", "broadcast", "symm_mem", "multimem")),   # -tp N
    ("attention_merge", ("merge_splits",)),
    ("attention", ("paged_attention",)),
    ("moe", ("moe_", "sort_by_expert", "softmax_topk", "grouped_sigmoid_topk")),   # the MoE op's kernels, its routers
    ("rope_cache_write", ("qk_norm_rope", "rope_cache")),
    ("gemm", ("gemm", "sm90_xmma", "nvjet", "cutlass", "cublas", "matmul", "splitk")),
    ("sampling", ("topk", "sort", "argmax", "softmax", "exponential", "multinomial", "radix", "scan")),
    ("copies", ("copy", "memcpy", "memset", "fill", "index", "gather", "scatter", "cat")),
    ("fused_elementwise", ("triton_", "fused")),
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--warm-steps", type=int, default=32, help="decode steps before measuring")
    p.add_argument("--steps", type=int, default=32, help="decode steps measured (timers, then profiler)")
    p.add_argument("--sections", default="step,kernels,attention")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    return p.parse_args(argv)


# -- the engine (the only place that knows the engine's internals) -----------------------------
def make_engine(args):
    from atom_aot import LLMEngine
    return LLMEngine(args.artifact, max_num_seqs=args.batch, gpu_memory_utilization=args.gpu_memory_utilization,
                     async_scheduling=args.async_scheduling)


def start_decoding(engine, args) -> None:
    """Queue B prompts and step until every sequence decodes (no prompt left), plus warm-up steps."""
    from atom_aot import SamplingParams
    vocab = engine.loaded.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, vocab - 100, (args.input_len,), generator=g).tolist() for _ in range(args.batch)]
    engine.add_request(prompts, SamplingParams(temperature=0, max_tokens=args.warm_steps + 3 * args.steps + 64,
                                               ignore_eos=True))
    scheduler = engine.core.scheduler
    while scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in scheduler.running):
        engine.step()
    for _ in range(args.warm_steps):
        engine.step()
    torch.cuda.synchronize()


def timed_parts(engine) -> dict:
    """Methods of one step to time on the host: name -> (owner object, attribute)."""
    runner = engine.core.runner
    return {"schedule": (engine.core.scheduler, "schedule"), "prepare_inputs": (runner, "prepare_inputs"),
            "read_results": (runner, "complete"), "scheduler_update": (engine.core.scheduler, "update"),
            "output_processing": (engine.output_processor, "process")}


# -- measurements -----------------------------------------------------------------------------
@contextmanager
def wrapped(parts: dict, totals: dict):
    originals = {}
    for name, (owner, attr) in parts.items():
        fn = getattr(owner, attr)
        originals[name] = fn

        def timed(*a, _fn=fn, _name=name, **k):
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                totals[_name] += time.perf_counter() - start
        setattr(owner, attr, timed)
    try:
        yield
    finally:
        for name, (owner, attr) in parts.items():
            setattr(owner, attr, originals[name])


def step_breakdown(engine, args) -> dict:
    totals: dict[str, float] = defaultdict(float)
    walls = []
    with wrapped(timed_parts(engine), totals):
        for _ in range(args.steps):
            start = time.perf_counter()
            engine.step()
            walls.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    per_step = {k: 1e3 * v / args.steps for k, v in totals.items()}
    wall = 1e3 * sum(walls) / len(walls)
    per_step["forward_launch_and_rest"] = wall - sum(per_step.values())
    return {"batch": len(engine.core.scheduler.running), "wall_ms_per_step_mean": wall,
            "wall_ms_per_step_median": 1e3 * sorted(walls)[len(walls) // 2],
            "host_ms_per_step": per_step,
            "note": "read_results includes waiting for the GPU to finish the step it reads; "
                    "forward_launch_and_rest is the remainder of step() (forward and sampling launch, graph replay "
                    "call)"}


def categorize(name: str) -> str:
    low = name.lower()
    for category, keys in CATEGORIES:
        if any(k in low for k in keys):
            return category
    return "other"


def kernel_breakdown(engine, args) -> dict:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    wall_ms = 1e3 * (time.perf_counter() - start) / args.steps
    by_name, by_category, spans = kernel_times(prof)
    busy_ms = sum(by_category.values()) / 1e3 / args.steps
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    return {"wall_ms_per_step_under_profiler": wall_ms, "gpu_kernel_ms_per_step": busy_ms,
            "gpu_busy_share": busy_ms / wall_ms if wall_ms else None,
            "idle_gaps": idle_gaps(spans, args.steps),
            "category_ms_per_step": {k: v / 1e3 / args.steps for k, v in sorted(by_category.items(),
                                                                                  key=lambda kv: -kv[1])},
            "top_kernels": [{"name": n[:120], "ms_per_step": t / 1e3 / args.steps, "calls_per_step": c / args.steps}
                            for n, (t, c) in top]}


def kernel_times(prof) -> tuple[dict[str, list], dict[str, float], list[tuple[float, float]]]:
    """A profile's GPU kernels: name -> [microseconds, calls], category -> microseconds, and their time spans."""
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    by_category: dict[str, float] = defaultdict(float)
    spans = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        by_name[e.name][0] += us
        by_name[e.name][1] += 1
        by_category[categorize(e.name)] += us
        spans.append((e.time_range.start, e.time_range.end))
    return by_name, by_category, spans


def idle_gaps(spans: list[tuple[float, float]], steps: int) -> dict:
    """Gaps on the GPU timeline between consecutive kernels (microsecond timestamps)."""
    spans.sort()
    gaps, end = [], None
    for s, e in spans:
        if end is not None and s > end:
            gaps.append(s - end)
        end = e if end is None else max(end, e)
    big = [g for g in gaps if g > 100]
    return {"total_ms_per_step": sum(gaps) / 1e3 / steps, "gaps_over_100us_per_step": len(big) / steps,
            "ms_in_gaps_over_100us_per_step": sum(big) / 1e3 / steps,
            "largest_gap_ms": max(gaps) / 1e3 if gaps else 0.0}


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy (median of 20)."""
    import triton.testing
    src = torch.randn(1 << 30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=200, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


SWEEP_BATCHES = (1, 8, 32, 64, 128, 256)
SWEEP_CONTEXTS = (512, 1024, 2048, 4096)


def attention_sweep(cfg, kv_dtype: torch.dtype, chosen: tuple[int, ...]) -> dict:
    """The decode attention op alone: achieved KV bandwidth per batch x context, for the artifact's decode
    config and each candidate, with the key-split count each config gets at that batch. Timed as CUDA-graph
    replays (as served; at batch 1 a plain call would time the host's launch instead of the kernel)."""
    import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::)
    from atom_aot.ops.triton.paged_attention import CANDIDATE_CONFIGS, AttentionConfig, split_count
    from atom_aot.ops.triton.timing import measure_ms
    configs = {",".join(map(str, c)): c for c in (chosen, *(c.as_args() for c in CANDIDATE_CONFIGS["decode"]))}
    peak = copy_bandwidth()
    rows = []
    for batch in SWEEP_BATCHES:
        for context in SWEEP_CONTEXTS:
            inputs = decode_inputs(cfg, batch, context, kv_dtype)
            kv_bytes = 2 * batch * context * cfg.num_key_value_heads * cfg.head_dim * inputs[1].element_size()
            row = {"batch": batch, "context": context, "kv_bytes": kv_bytes, "configs": {}}
            for key, c in configs.items():
                ms = measure_ms(lambda: torch.ops.atom_triton.paged_attention(*inputs, *c))[0]
                config = AttentionConfig(*c)
                row["configs"][key] = {"ms": ms, "bandwidth_share_of_copy": kv_bytes / (ms / 1e3) / peak,
                                       "key_splits": split_count(batch, cfg.num_key_value_heads,
                                                                 config.target_programs, config.max_splits)}
            best = min(row["configs"], key=lambda k: row["configs"][k]["ms"])
            row["best"], row["chosen"] = best, ",".join(map(str, chosen))
            rows.append(row)
            del inputs
    return {"copy_bandwidth_bytes_per_s": peak, "decode_config_in_artifact": list(chosen),
            "config_fields": list(AttentionConfig.__dataclass_fields__), "rows": rows}


def decode_attention_config(engine) -> tuple[int, ...]:
    """The artifact's decode attention launch params (AttentionConfig's fields, in order)."""
    from atom_aot.artifact.phase import Phase
    return tuple(engine.loaded.tuning.for_phase(Phase.DECODE).op("attention").params["paged_attention"])


def decode_inputs(cfg, batch: int, context: int, kv_dtype: torch.dtype):
    """One decode step's attention inputs for layer 0, on a shuffled block pool (random values)."""
    block_size = 16
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq + 1
    kv = torch.randn(1, 2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, device="cuda",
                     dtype=torch.bfloat16).to(kv_dtype)
    tables = torch.randperm(num_blocks - 1, device="cuda")[:batch * blocks_per_seq].view(batch, -1).to(torch.int32)
    q = torch.randn(batch, cfg.num_attention_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    return q, kv, 0, tables, seq_lens, starts, cfg.head_dim ** -0.5


def save(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))


def main(argv=None):
    args = parse_args(argv)
    sections = args.sections.split(",")
    report = {"meta": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "artifact": args.artifact, "batch": args.batch, "input_len": args.input_len,
                       "steps": args.steps, "warm_steps": args.warm_steps, "async_scheduling": args.async_scheduling}}
    engine = make_engine(args)
    if "step" in sections or "kernels" in sections:
        start_decoding(engine, args)
        report["meta"]["context_at_start"] = args.input_len + args.warm_steps
        if "step" in sections:
            report["step"] = step_breakdown(engine, args)
            save(args.out, report)
        if "kernels" in sections:
            report["kernels"] = kernel_breakdown(engine, args)
            save(args.out, report)
    if "attention" in sections:
        from atom_aot.dtypes import torch_dtype
        cfg, kv_dtype = engine.loaded.model_config, torch_dtype(engine.loaded.kv_cache.dtype)
        chosen = decode_attention_config(engine)
        del engine     # the sweep needs the memory the KV pool held
        import gc
        gc.collect()
        torch.cuda.empty_cache()
        report["attention"] = attention_sweep(cfg, kv_dtype, chosen)
    save(args.out, report)
    print(json.dumps({k: report[k] for k in report if k != "attention"}, indent=1)[:6000])
    if "attention" in report:
        for row in report["attention"]["rows"]:
            chosen, best = row["configs"][row["chosen"]], row["configs"][row["best"]]
            print(f"B={row['batch']:4d} ctx={row['context']:5d} chosen {row['chosen']:>22}: {chosen['ms']:.3f} ms "
                  f"({chosen['bandwidth_share_of_copy']:.0%} of copy, {chosen['key_splits']} splits) | "
                  f"best {row['best']:>22}: {best['ms']:.3f} ms ({best['bandwidth_share_of_copy']:.0%}, "
                  f"{best['key_splits']} splits)")


if __name__ == "__main__":
    main()
