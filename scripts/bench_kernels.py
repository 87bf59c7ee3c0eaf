"""Check and time the atom_triton kernels on a GPU; every number goes to the JSON named by --out.

    PYTHONPATH=. python scripts/bench_kernels.py --out $OUT/kernels.json      # H100/H200, ~3 min
    PYTHONPATH=. python scripts/bench_kernels.py --out /tmp/k.json --smoke    # CPU interpreter, tiny shapes

1. ceilings: device-to-device copy bandwidth (bytes read + written) and a bf16 matmul rate;
2. checks: each kernel, every candidate config, against the torch reference at Qwen3-0.6B and
   Llama-3.1-8B shapes in bf16 (and an fp8 KV cache), relative error in float64;
3. timings: each candidate config (triton.testing.do_bench, median, L2 flushed between runs) on
   decode batches 1..256 x context 512..8192 (with the key-split count each decode config gets at
   that batch), prefill 1x1024 and 8x1024, and the fused
   QK-norm + rope + cache write; achieved bandwidth against the copy ceiling; torch eager as a baseline;
4. winners per (kernel, model, shape): what the build would store in tuning.json.
One failing case is recorded under "errors" and the run goes on; a time budget skips what is left.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

from pathlib import Path

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the kernel checks the tests use

import triton  # noqa: E402
import triton.testing  # noqa: E402
from triton_kernel_checks import patch_triton_interpreter, rel_error, rope_cache_reference  # noqa: E402

from atom_aot.ops.attention import reference_attention  # noqa: E402
from atom_aot.ops.norm import rms_norm  # noqa: E402
from atom_aot.ops.rope import apply_rope, rope_cos_sin_cache  # noqa: E402
from atom_aot.ops.triton import paged_attention, rope_cache  # noqa: E402
from atom_aot.ops.triton.batch_inputs import make_paged_batch  # noqa: E402
from atom_aot.ops.triton.timing import measure_ms  # noqa: E402

EPS = 1e-6


@dataclass
class Plan:
    """Models and shapes: the real ones on a GPU, tiny ones for --smoke."""
    models: dict
    decode_batches: tuple
    decode_contexts: tuple
    prefill: tuple                  # (num_seqs, tokens each)
    fp8_decode: tuple               # (batch, context) pairs timed with an fp8 cache (first model)
    tokens: tuple                   # token counts for the fused rope/cache op
    check_attention: tuple          # (context_lens, query_lens, pad) of the mixed check batch
    copy_bytes: int


FULL = Plan(
    models={"qwen3-0.6b": dict(heads=16, kv_heads=8, head_dim=128, qk_norm=True),
            "llama-3.1-8b": dict(heads=32, kv_heads=8, head_dim=128, qk_norm=False)},
    decode_batches=(1, 8, 64, 256), decode_contexts=(512, 2048, 8192), prefill=((1, 1024), (8, 1024)),
    fp8_decode=((8, 2048), (64, 2048), (256, 2048)), tokens=(8, 256, 4096),
    check_attention=([511, 2047, 8191, 100, 300, 0], [1, 1, 1, 1, 513, 1024], 3), copy_bytes=1 << 30)
TINY = Plan(
    models={"tiny-qk-norm": dict(heads=4, kv_heads=2, head_dim=64, qk_norm=True)},
    decode_batches=(1, 3), decode_contexts=(40,), prefill=((2, 24),), fp8_decode=((2, 40),), tokens=(3,),
    check_attention=([20, 0, 5], [1, 17, 3], 2), copy_bytes=1 << 20)


@dataclass
class Bench:
    device: str
    smoke: bool
    deadline: float
    checks: list = field(default_factory=list)
    timings: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    uncaptured: int = 0             # timings that could not use a CUDA graph

    def time_ms(self, fn) -> float:
        """Median ms of one call: captured in a CUDA graph (no Python launch overhead, as served), then
        replayed under do_bench, which flushes L2 before each replay. Falls back to plain calls."""
        if self.smoke:   # the interpreter: one call, only to exercise the script
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        ms, captured = measure_ms(fn)
        self.uncaptured += not captured
        return ms

    def guarded(self, name: str, fn, *args) -> None:
        """Runs one case; an exception is recorded, never raised; past the deadline the case is skipped."""
        if time.time() > self.deadline:
            self.skipped.append(name)
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            self.errors.append({"case": name, "error": repr(e)[:500], "traceback": traceback.format_exc()[-3000:]})
            if self.device == "cuda":
                torch.cuda.synchronize()

    def check(self, kernel: str, model: str, config, err: float, tol: float, **extra) -> None:
        self.checks.append({"kernel": kernel, "model": model, "config": config, "rel_error": err, "tol": tol,
                            "ok": bool(err < tol), **extra})

    def timing(self, kernel: str, model: str, shape: str, config, ms: float, bytes_moved: int, flops: int = 0,
               **extra):
        self.timings.append({"kernel": kernel, "model": model, "shape": shape, "config": config, "ms": ms,
                             "gbps": bytes_moved / ms / 1e6, "tflops": flops / ms / 1e9 if flops else None, **extra})


# ---- ceilings ----

def measure_ceilings(bench: Bench, plan: Plan) -> dict:
    src = torch.randn(plan.copy_bytes // 2, device=bench.device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = bench.time_ms(lambda: dst.copy_(src))
    n = 8192 if bench.device == "cuda" else 64
    a, b = (torch.randn(n, n, device=bench.device, dtype=torch.bfloat16) for _ in range(2))
    mm_ms = bench.time_ms(lambda: a @ b)
    return {"copy_gbps": 2 * plan.copy_bytes / copy_ms / 1e6, "matmul_bf16_tflops": 2 * n ** 3 / mm_ms / 1e9}


# ---- attention ----

def attention_inputs(bench, m, context_lens, query_lens, pad=0, cache_dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(context_lens, query_lens, m["kv_heads"], m["head_dim"], block_size=16, num_layers=1,
                             pad_tokens=pad, dtype=cache_dtype, device=bench.device, generator=g)
    q = torch.randn(batch.slot_mapping.shape[0], m["heads"], m["head_dim"], device=bench.device,
                    dtype=torch.bfloat16)   # q: [T, H, D]
    return batch, q


def run_attention(batch, q, config):
    return paged_attention.paged_attention(q, batch.kv_cache, 0, batch.block_tables, batch.seq_lens,
                                           batch.query_start_loc, q.shape[-1] ** -0.5, *config.as_args())


def check_attention(bench: Bench, plan: Plan, name: str, m: dict) -> None:
    context_lens, query_lens, pad = plan.check_attention
    for cache_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        batch, q = attention_inputs(bench, m, context_lens, query_lens, pad, cache_dtype, seed=1)
        n = batch.num_real_tokens
        ref = reference_attention(q.double(), batch.kv_cache[0].float().double(), batch.block_tables, batch.seq_lens,
                                  batch.query_start_loc, q.shape[-1] ** -0.5)[:n]
        configs = [c for phase in paged_attention.CANDIDATE_CONFIGS.values() for c in phase]
        if cache_dtype != torch.bfloat16:
            configs = list(paged_attention.DEFAULT_CONFIGS.values())
        for config in configs:
            def one(config=config):
                out = run_attention(batch, q, config)
                err = rel_error(out[:n], ref)
                pad_ok = bool((out[n:] == 0).all())
                bench.check("paged_attention", name, config.as_dict(), err if pad_ok else float("nan"), 2e-2,
                            cache=str(cache_dtype).split(".")[-1], padding_rows_zero=pad_ok)
            bench.guarded(f"check attention {name} {config} {cache_dtype}", one)
        del batch, q, ref


def kv_bytes(batch, m) -> int:
    per_token = 2 * m["kv_heads"] * m["head_dim"] * batch.kv_cache.element_size()
    return int(batch.seq_lens.sum()) * per_token


def time_attention(bench: Bench, name: str, m: dict, phase: str, num_seqs: int, context: int, new: int,
                   cache_dtype=torch.bfloat16) -> None:
    batch, q = attention_inputs(bench, m, [context - new] * num_seqs, [new] * num_seqs, cache_dtype=cache_dtype)
    moved = kv_bytes(batch, m) + 2 * q.numel() * q.element_size()
    flops = 4 * m["heads"] * m["head_dim"] * num_seqs * new * (context - new + (new + 1) / 2)
    cache = "" if cache_dtype == torch.bfloat16 else " fp8"
    shape = f"{phase} B={num_seqs} ctx={context}{cache}" if phase == "decode" else f"prefill {num_seqs}x{new}"
    for config in paged_attention.CANDIDATE_CONFIGS[phase]:
        def one(config=config):
            ms = bench.time_ms(lambda: run_attention(batch, q, config))
            splits = paged_attention.split_count(num_seqs, m["kv_heads"], config.target_programs, config.max_splits)
            bench.timing("paged_attention", name, shape, config.as_dict(), ms, moved, int(flops), key_splits=splits)
        bench.guarded(f"time attention {name} {shape} {config}", one)
    del batch, q


# ---- fused QK-norm + rope + cache write ----

def rope_inputs(bench, m, tokens, cache_dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    per_seq = max(tokens // 4, 1)
    batch = make_paged_batch([7] * (tokens // per_seq), [per_seq] * (tokens // per_seq), m["kv_heads"],
                             m["head_dim"], num_layers=1, pad_tokens=tokens % per_seq, dtype=cache_dtype,
                             device=bench.device, generator=g)
    h, hkv, d = m["heads"], m["kv_heads"], m["head_dim"]
    qkv = torch.randn(tokens, (h + 2 * hkv) * d, device=bench.device, dtype=torch.bfloat16)
    q, k, v = (t.unflatten(-1, (-1, d)) for t in qkv.split([h * d, hkv * d, hkv * d], dim=-1))
    cos_sin = rope_cos_sin_cache(d, 1e6, {}, 8192).to(bench.device)
    weights = [(1 + 0.3 * torch.randn(d, device=bench.device)).to(torch.bfloat16) for _ in range(2)]
    if not m["qk_norm"]:
        weights = [None, None]
    return (q, k, v, batch.positions, cos_sin, *weights, EPS, batch.kv_cache, 0, batch.slot_mapping)


def check_rope_cache(bench: Bench, name: str, m: dict) -> None:
    for cache_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        args = rope_inputs(bench, m, 300 if bench.device == "cuda" else 9, cache_dtype, seed=2)
        inputs, kv_cache, slots = args[:7], args[8], args[10]
        ref_cache = kv_cache.clone()
        q_ref = rope_cache_reference(*inputs, EPS, ref_cache, 0, slots)
        for config in rope_cache.CANDIDATE_CONFIGS:
            def one(config=config):
                cache = kv_cache.clone()
                q_out = rope_cache.qk_norm_rope_cache_write(*inputs, EPS, cache, 0, slots, *config.as_args())
                err = max(rel_error(q_out, q_ref), rel_error(cache.float(), ref_cache.float()))
                bench.check("qk_norm_rope_cache_write", name, config.as_dict(), err, 2e-2,
                            cache=str(cache_dtype).split(".")[-1])
            bench.guarded(f"check rope {name} {config}", one)


def time_rope_cache(bench: Bench, name: str, m: dict, tokens: int) -> None:
    shape = f"T={tokens}"
    args = rope_inputs(bench, m, tokens)
    h, hkv, d = m["heads"], m["kv_heads"], m["head_dim"]
    rope_bytes = tokens * (2 * h * d * 2 + 2 * hkv * d * 2 * 2 + d * 4 + 16)
    for config in rope_cache.CANDIDATE_CONFIGS:
        def one(config=config):
            ms = bench.time_ms(lambda: rope_cache.qk_norm_rope_cache_write(*args, *config.as_args()))
            bench.timing("qk_norm_rope_cache_write", name, shape, config.as_dict(), ms, rope_bytes)
        bench.guarded(f"time rope {name} {shape} {config}", one)
    bench.guarded(f"time rope torch {name} {shape}", lambda: bench.timing(
        "qk_norm_rope_cache_write", name, shape, "torch", bench.time_ms(lambda: torch_rope_cache(*args)),
        rope_bytes))


def torch_rope_cache(q, k, v, positions, cos_sin, q_w, k_w, eps, kv_cache, layer, slots):
    """The reference backend's QK-norm + rope, then the cache scatter as plain ops; slots must all be
    valid (no -1), so no host sync."""
    if q_w is not None:
        q, k = rms_norm(q, q_w, eps), rms_norm(k, k_w, eps)
    q, k = apply_rope(positions, q, k, cos_sin)
    flat = kv_cache[layer].flatten(1, 2)   # [2, slots, Hkv, D]
    flat[0].index_copy_(0, slots, k.to(kv_cache.dtype))
    flat[1].index_copy_(0, slots, v.to(kv_cache.dtype))
    return q


# ---- report ----

def winners(timings: list, copy_gbps: float) -> list:
    """Fastest Triton config per (kernel, model, shape), with the torch baseline when there is one."""
    best: dict = {}
    torch_ms: dict = {}
    for t in timings:
        key = (t["kernel"], t["model"], t["shape"])
        if t["config"] == "torch":
            torch_ms[key] = t["ms"]
        elif key not in best or t["ms"] < best[key]["ms"]:
            best[key] = t
    rows = []
    for key, t in best.items():
        rows.append({**t, "copy_fraction": t["gbps"] / copy_gbps, "torch_ms": torch_ms.get(key),
                     "n_configs": sum(1 for x in timings if (x["kernel"], x["model"], x["shape"]) == key
                                      and x["config"] != "torch")})
    return rows


def short_config(config) -> str:
    return "-".join(str(v) for v in config.values()) if isinstance(config, dict) else str(config)


def print_table(report: dict) -> None:
    ceilings = report["ceilings"]
    bad = [c for c in report["checks"] if not c["ok"]]
    print(f"\n{report['device']}: copy {ceilings.get('copy_gbps', 0):.0f} GB/s, "
          f"bf16 matmul {ceilings.get('matmul_bf16_tflops', 0):.0f} TFLOP/s")
    print(f"checks: {len(report['checks']) - len(bad)}/{len(report['checks'])} ok"
          + "".join(f"\n  FAIL {c['kernel']} {c['model']} {short_config(c['config'])} err={c['rel_error']:.2e}"
                    for c in bad[:10]))
    print(f"{'kernel':<24} {'model':<12} {'shape':<24} {'best config':<18} {'splits':>6} {'us':>9} {'GB/s':>7} "
          f"{'%copy':>6} {'TFLOP/s':>7} {'torch us':>9}")
    for w in report["winners"]:
        tflops = f"{w['tflops']:.0f}" if w["tflops"] else ""
        torch_us = f"{w['torch_ms'] * 1e3:.1f}" if w["torch_ms"] else ""
        print(f"{w['kernel'][:24]:<24} {w['model'][:12]:<12} {w['shape'][:24]:<24} {short_config(w['config']):<18} "
              f"{w.get('key_splits', ''):>6} {w['ms'] * 1e3:>9.1f} {w['gbps']:>7.0f} {100 * w['copy_fraction']:>5.0f}% "
              f"{tflops:>7} {torch_us:>9}")
    print(f"errors: {len(report['errors'])}, skipped (time budget): {len(report['skipped'])}, "
          f"elapsed {report['elapsed_s']:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for every check and timing")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes: checks the script only")
    parser.add_argument("--budget-s", type=float, default=210.0, help="skip the remaining cases after this long")
    args = parser.parse_args()
    start = time.time()
    if args.smoke:
        patch_triton_interpreter()
    elif not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a GPU (or --smoke for the CPU interpreter)")
    plan = TINY if args.smoke else FULL
    bench = Bench("cpu" if args.smoke else "cuda", args.smoke, start + args.budget_s)
    device_name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    report = {"device": device_name, "torch": torch.__version__, "triton": triton.__version__,
              "hip": torch.version.hip, "cuda": torch.version.cuda, "ceilings": {}}
    bench.guarded("ceilings", lambda: report["ceilings"].update(measure_ceilings(bench, plan)))
    for name, m in plan.models.items():
        bench.guarded(f"check attention {name}", check_attention, bench, plan, name, m)
        bench.guarded(f"check rope cache {name}", check_rope_cache, bench, name, m)
    for name, m in plan.models.items():
        for batch in plan.decode_batches:
            for context in plan.decode_contexts:
                bench.guarded(f"decode {name} {batch} {context}", time_attention, bench, name, m, "decode",
                              batch, context, 1)
        for num_seqs, tokens in plan.prefill:
            bench.guarded(f"prefill {name} {num_seqs}x{tokens}", time_attention, bench, name, m, "prefill",
                          num_seqs, tokens, tokens)
    for name, m in plan.models.items():
        for tokens in plan.tokens:
            bench.guarded(f"rope cache {name} {tokens}", time_rope_cache, bench, name, m, tokens)
    name, m = next(iter(plan.models.items()))
    for batch, context in plan.fp8_decode:
        bench.guarded(f"decode fp8 {name} {batch} {context}", time_attention, bench, name, m, "decode", batch,
                      context, 1, torch.float8_e4m3fn)
    report.update(checks=bench.checks, timings=bench.timings, errors=bench.errors, skipped=bench.skipped,
                  timer="CUDA graph replay under triton.testing.do_bench (median, L2 flushed per replay)",
                  uncaptured_timings=bench.uncaptured, elapsed_s=time.time() - start)
    report["winners"] = winners(bench.timings, report["ceilings"].get("copy_gbps", float("nan")))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print_table(report)


if __name__ == "__main__":
    main()
