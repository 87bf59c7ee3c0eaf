"""Decode attention over an fp8 KV cache against the same over bf16, on the GPU: which kernel variant and launch
config reach the memory bound at large batch; with --prefill, prefill steps first. Writes one JSON (--out).

    PYTHONPATH=. python scripts/bench_fp8_attention.py --out $OUT/fp8_attention.json    # H100, ~5 min

Variants: bf16 and fp8 caches (fp8 with fp16 dots), each with and without the page ids read one iteration ahead
(PREFETCH_PAGES; the op reads ahead for configs of 3+ stages), and fp8 with ptxas' registers
capped at 128 (maxnreg, which an eager launch can pass and an exported graph cannot: it tests whether residency
bounds the kernel). Each runs the build's decode candidates plus narrower / deeper tiles. Achieved bandwidth
counts the cache bytes a step must read (every sequence's K and V at its context), against this run's copy
bandwidth. Each variant's error against a float64 reference on one batch is recorded first. Value pages stored key-minor and both dots
in e4m3 were measured through this script too (docs/benchmarks/h100-fp8-attention-layouts-e4m3-2026-11-26.json).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from atom_aot.ops.attention import reference_attention
from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.paged_attention import CANDIDATE_CONFIGS, AttentionConfig, launch_paged_attention
from atom_aot.ops.triton.timing import measure_ms

FP8 = torch.float8_e4m3fn
MODELS = {"llama-3.1-8b": (32, 8, 128)}
SHAPES = ((256, 1024), (256, 2048), (128, 2048), (64, 2048), (8, 4096), (1, 4096))   # (batch, context)
EXTRA = (AttentionConfig(16, 128, 4, 3, 512, 16), AttentionConfig(16, 64, 4, 3, 512, 16),
         AttentionConfig(16, 64, 4, 4, 512, 16), AttentionConfig(16, 32, 4, 4, 512, 16),
         AttentionConfig(16, 32, 4, 5, 512, 16), AttentionConfig(16, 64, 4, 5, 512, 16),
         AttentionConfig(16, 32, 2, 4, 512, 16), AttentionConfig(16, 128, 8, 3, 512, 16))
# name -> (cache dtype, fp16 dots, head-major pages, register cap, page ids read ahead)
VARIANTS = {"bf16": (torch.bfloat16, False, False, None, False), "fp8->fp16": (FP8, True, False, None, False),
            "bf16 prefetch": (torch.bfloat16, False, False, None, True),
            "fp8->fp16 prefetch": (FP8, True, False, None, True),
            "fp8->fp16 prefetch maxnreg128": (FP8, True, False, 128, True),
            "fp8->fp16 head-major prefetch": (FP8, True, True, None, True),
            "bf16 head-major prefetch": (torch.bfloat16, False, True, None, True)}


def batch_of(context_lens, query_lens, kv_heads, dim, dtype, head_major: bool):
    """A random paged batch; head-major: each page holds one kv head's slots contiguously ([.., Hkv, block, D]
    in memory), seen through the same logical [L, 2, blocks, block, Hkv, D] view (the kernels use strides)."""
    b = make_paged_batch(context_lens, query_lens, kv_heads, dim, num_layers=1, dtype=dtype, device="cuda")
    if head_major:
        pages = b.kv_cache.permute(0, 1, 2, 4, 3, 5).contiguous()     # [L, 2, blocks, Hkv, block, D]
        b.kv_cache = pages.permute(0, 1, 2, 4, 3, 5)
    return b


def copy_gbps() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms, _ = measure_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / ms / 1e6


def run(q, batch, config: AttentionConfig, kv_scale, fp16: bool, maxnreg=None, prefetch: bool = False):
    return launch_paged_attention(q, batch.kv_cache, 0, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                                  q.shape[-1] ** -0.5, *config.as_args(), kv_scale=kv_scale, fp8_as_fp16=fp16,
                                  maxnreg=maxnreg, prefetch_pages=prefetch)


def check(heads, kv_heads, dim, variants: dict) -> dict:
    """Relative error (float64) of each variant on a batch of mixed contexts, decode shape."""
    errors = {}
    for name, (dtype, fp16, head_major, maxnreg, prefetch) in variants.items():
        b = batch_of([700, 33, 1500, 5], [1, 1, 1, 1], kv_heads, dim, dtype, head_major)
        q = torch.randn(4, heads, dim, device="cuda", dtype=torch.bfloat16)
        scale = torch.tensor([0.7, 1.3], device="cuda") if dtype == FP8 else None
        out = run(q, b, CANDIDATE_CONFIGS["decode"][0], scale, fp16, maxnreg, prefetch).double()
        ref = reference_attention(q.double(), b.kv_cache[0].double(), b.block_tables, b.seq_lens,
                                  b.query_start_loc, dim ** -0.5,
                                  None if scale is None else scale.double())
        errors[name] = float((out - ref).norm() / ref.norm())
    return errors


def sweep(heads, kv_heads, dim, variants: dict, shapes: tuple, ceiling: float, deadline: float) -> list:
    rows = []
    configs = CANDIDATE_CONFIGS["decode"] + EXTRA
    for batch_size, context in shapes:
        for name, (dtype, fp16, head_major, maxnreg, prefetch) in variants.items():
            b = batch_of([context] * batch_size, [1] * batch_size, kv_heads, dim, dtype, head_major)
            q = torch.randn(batch_size, heads, dim, device="cuda", dtype=torch.bfloat16)
            scale = torch.tensor([0.5, 2.0], device="cuda") if dtype == FP8 else None
            cache_bytes = 2 * batch_size * (context + 1) * kv_heads * dim * dtype.itemsize
            for c in configs:
                if time.time() > deadline:
                    return rows
                try:
                    ms, captured = measure_ms(lambda: run(q, b, c, scale, fp16, maxnreg, prefetch))
                except Exception as e:  # noqa: BLE001  (a config that does not fit: recorded)
                    rows.append({"batch": batch_size, "context": context, "variant": name, "config": c.as_args(),
                                 "error": repr(e)[:300]})
                    continue
                gbps = cache_bytes / ms / 1e6
                rows.append({"batch": batch_size, "context": context, "variant": name, "config": c.as_args(),
                             "ms": round(ms, 4), "gbps": round(gbps, 1), "of_copy": round(gbps / ceiling, 3),
                             "captured": captured})
            del b
    return rows


PREFILL_SHAPES = ((8, 1024, 1024), (2, 0, 4096), (1, 3072, 1024))   # (sequences, cached context, new tokens each)


def prefill(heads, kv_heads, dim, variants: dict, deadline: float) -> list:
    """Prefill steps (every new token attends causally over context + the new tokens) per variant and config."""
    rows = []
    for seqs, context, new in PREFILL_SHAPES:
        for name, (dtype, fp16, head_major, maxnreg, prefetch) in variants.items():
            if maxnreg is not None:
                continue
            b = batch_of([context] * seqs, [new] * seqs, kv_heads, dim, dtype, head_major)
            q = torch.randn(seqs * new, heads, dim, device="cuda", dtype=torch.bfloat16)
            scale = torch.tensor([0.5, 2.0], device="cuda") if dtype == FP8 else None
            for c in CANDIDATE_CONFIGS["prefill"]:
                if time.time() > deadline:
                    return rows
                row = {"batch": seqs, "context": context, "new": new, "variant": name, "config": c.as_args()}
                try:
                    row["ms"] = round(measure_ms(lambda: run(q, b, c, scale, fp16, None, prefetch))[0], 4)
                except Exception as e:  # noqa: BLE001  (a config that does not fit: recorded)
                    row["error"] = repr(e)[:300]
                rows.append(row)
            del b
    return rows


def best(rows: list) -> dict:
    out = {}
    for r in rows:
        if "ms" not in r:
            continue
        key = f"{r['batch']}x{r['context']}{'+' + str(r['new']) if 'new' in r else ''} {r['variant']}"
        if key not in out or r["ms"] < out[key]["ms"]:
            out[key] = {k: r[k] for k in ("ms", "gbps", "of_copy", "config") if k in r}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--prefill", action="store_true", help="time prefill steps first (the build's prefill candidates)")
    ap.add_argument("--shapes", default=None, help="decode (batch x context) pairs, e.g. 256x1024,1x4096")
    ap.add_argument("--variants", default=None, help="comma-separated VARIANTS names (default: all)")
    a = ap.parse_args()
    deadline = time.time() + a.budget_s
    variants = {name: VARIANTS[name] for name in a.variants.split(",")} if a.variants else VARIANTS
    shapes = tuple(tuple(map(int, pair.split("x"))) for pair in a.shapes.split(",")) if a.shapes else SHAPES
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result["copy_gbps"] = ceiling = copy_gbps()
    result["models"] = {}
    for model, (heads, kv_heads, dim) in MODELS.items():
        errors = check(heads, kv_heads, dim, variants)
        prefill_rows = prefill(heads, kv_heads, dim, variants, deadline) if a.prefill else []
        rows = sweep(heads, kv_heads, dim, variants, shapes, ceiling, deadline)
        result["models"][model] = {"rel_error_vs_float64": errors, "best": best(rows),
                                   "prefill_best": best(prefill_rows), "rows": rows, "prefill_rows": prefill_rows}
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({m: {**v["prefill_best"], **v["best"]} for m, v in result["models"].items()}, indent=1))
    print(json.dumps({m: v["rel_error_vs_float64"] for m, v in result["models"].items()}))


if __name__ == "__main__":
    main()
