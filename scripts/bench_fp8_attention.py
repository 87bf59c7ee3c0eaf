"""Decode attention over an fp8 KV cache against the same over bf16, on the GPU: which kernel variant,
page layout and launch config reach the memory bound at large batch; then prefill over the same layouts (the one
kernel serves both). Writes one JSON (--out).

    PYTHONPATH=. python scripts/bench_fp8_attention.py --out $OUT/fp8_attention.json    # H100, ~3 min

Variants: bf16 cache; fp8 cache with fp16 dots (FP8_AS_FP16); value pages key-minor ([Hkv, D, block]: the PV dot
reads keys in pairs, which an fp8 page with D adjacent gives only as single bytes from shared memory); head-major
pages (one kv head's slots contiguous). Each runs the build's decode candidates plus wider / narrower / deeper
tiles. Achieved bandwidth counts the cache bytes a step must read (every sequence's K and V at its context),
against this run's copy bandwidth. Each variant's error against a float64 reference on one batch is recorded first.
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
SHAPES = ((256, 1024), (256, 2048), (128, 2048), (64, 2048), (8, 4096))   # (batch, context)
EXTRA = (AttentionConfig(16, 128, 4, 3, 512, 16), AttentionConfig(16, 256, 4, 2, 512, 16),
         AttentionConfig(16, 128, 8, 2, 512, 16), AttentionConfig(16, 32, 4, 2, 512, 16),
         AttentionConfig(16, 32, 4, 6, 512, 16), AttentionConfig(16, 64, 4, 5, 512, 16))
PREFILL_SHAPES = ((8, 1024, 1024), (2, 0, 4096))   # (sequences, cached context, new tokens each)
# name -> (cache dtype, fp16 dots, page layout, e4m3 dots). Layouts: "standard", "value-key-minor" (value pages
# [Hkv, D, block]: keys adjacent, what a dot's B operand reads in pairs, and what an e4m3 MMA needs). e4m3 dots:
# q quantized per row and p scaled to e4m3 (FlashAttention-3's FP8 path); they run as 64-row wgmma tiles.
VARIANTS = {"bf16": (torch.bfloat16, False, "standard", False), "fp8->fp16": (FP8, True, "standard", False),
            "fp8->fp16 value-key-minor": (FP8, True, "value-key-minor", False),
            "fp8 e4m3-dots": (FP8, False, "standard", True),
            "fp8 e4m3-dots value-key-minor": (FP8, False, "value-key-minor", True)}
E4M3_CONFIGS = (AttentionConfig(64, 64, 4, 2, 512, 16), AttentionConfig(64, 32, 4, 2, 512, 16),
                AttentionConfig(64, 64, 4, 5, 512, 16), AttentionConfig(64, 128, 4, 3, 512, 16),
                AttentionConfig(64, 64, 8, 2, 512, 16), AttentionConfig(64, 32, 4, 6, 512, 16),
                AttentionConfig(64, 128, 8, 2, 512, 16), AttentionConfig(64, 64, 4, 2, 1024, 32))


def batch_of(context_lens, query_lens, kv_heads, dim, dtype, layout: str):
    """A random paged batch and the cache the kernel reads. head-major: each page holds one kv head's slots
    contiguously ([.., Hkv, block, D] in memory), seen through the same logical [L, 2, blocks, block, Hkv, D]
    view (the kernel uses strides); value-key-minor: the value half's bytes are [L, blocks, Hkv, D, block] (the
    kernel's V_KEY_MINOR addressing). The batch keeps the standard cache for the float64 reference."""
    b = make_paged_batch(context_lens, query_lens, kv_heads, dim, num_layers=1, dtype=dtype, device="cuda")
    cache = b.kv_cache
    if layout == "value-key-minor":
        cache = cache.clone()
        cache[:, 1].copy_(b.kv_cache[:, 1].permute(0, 1, 3, 4, 2).contiguous().view(cache[:, 1].shape))
    return b, cache


def copy_gbps() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms, _ = measure_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / ms / 1e6


def run(q, batch, cache, config: AttentionConfig, kv_scale, fp16: bool, layout: str, e4m3: bool = False):
    return launch_paged_attention(q, cache, 0, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                                  q.shape[-1] ** -0.5, *config.as_args(), kv_scale=kv_scale, fp8_as_fp16=fp16,
                                  value_key_minor=layout == "value-key-minor", e4m3_dots=e4m3)


def check(heads, kv_heads, dim) -> dict:
    """Relative error (float64) of each variant on a batch of mixed contexts, decode shape."""
    errors = {}
    for name, (dtype, fp16, layout, e4m3) in VARIANTS.items():
        b, cache = batch_of([700, 33, 1500, 5], [1, 1, 1, 1], kv_heads, dim, dtype, layout)
        q = torch.randn(4, heads, dim, device="cuda", dtype=torch.bfloat16)
        scale = torch.tensor([0.7, 1.3], device="cuda") if dtype == FP8 else None
        config = E4M3_CONFIGS[0] if e4m3 else CANDIDATE_CONFIGS["decode"][0]
        out = run(q, b, cache, config, scale, fp16, layout, e4m3).double()
        ref = reference_attention(q.double(), b.kv_cache[0].double(), b.block_tables, b.seq_lens,
                                  b.query_start_loc, dim ** -0.5,
                                  None if scale is None else scale.double())
        errors[name] = float((out - ref).norm() / ref.norm())
    return errors


def sweep(heads, kv_heads, dim, ceiling: float, deadline: float) -> list:
    rows = []
    configs = CANDIDATE_CONFIGS["decode"] + EXTRA
    for batch_size, context in SHAPES:
        for name, (dtype, fp16, layout, e4m3) in VARIANTS.items():
            b, cache = batch_of([context] * batch_size, [1] * batch_size, kv_heads, dim, dtype, layout)
            q = torch.randn(batch_size, heads, dim, device="cuda", dtype=torch.bfloat16)
            scale = torch.tensor([0.5, 2.0], device="cuda") if dtype == FP8 else None
            cache_bytes = 2 * batch_size * (context + 1) * kv_heads * dim * dtype.itemsize
            for c in E4M3_CONFIGS if e4m3 else configs:
                if time.time() > deadline:
                    return rows
                try:
                    ms, captured = measure_ms(lambda: run(q, b, cache, c, scale, fp16, layout, e4m3))
                except Exception as e:  # noqa: BLE001  (a config that does not fit: recorded)
                    rows.append({"batch": batch_size, "context": context, "variant": name, "config": c.as_args(),
                                 "error": repr(e)[:300]})
                    continue
                gbps = cache_bytes / ms / 1e6
                rows.append({"batch": batch_size, "context": context, "variant": name, "config": c.as_args(),
                             "ms": round(ms, 4), "gbps": round(gbps, 1), "of_copy": round(gbps / ceiling, 3),
                             "captured": captured})
            del b, cache
    return rows


def prefill(heads, kv_heads, dim, deadline: float) -> list:
    """Prefill steps (every new token attends causally over context + the new tokens) per variant and config."""
    rows = []
    for seqs, context, new in PREFILL_SHAPES:
        for name, (dtype, fp16, layout, e4m3) in VARIANTS.items():
            b, cache = batch_of([context] * seqs, [new] * seqs, kv_heads, dim, dtype, layout)
            q = torch.randn(seqs * new, heads, dim, device="cuda", dtype=torch.bfloat16)
            scale = torch.tensor([0.5, 2.0], device="cuda") if dtype == FP8 else None
            for c in CANDIDATE_CONFIGS["prefill"]:
                if time.time() > deadline:
                    return rows
                row = {"batch": seqs, "context": context, "new": new, "variant": name, "config": c.as_args()}
                try:
                    row["ms"] = round(measure_ms(lambda: run(q, b, cache, c, scale, fp16, layout, e4m3))[0], 4)
                except Exception as e:  # noqa: BLE001  (a config that does not fit: recorded)
                    row["error"] = repr(e)[:300]
                rows.append(row)
            del b, cache
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
    a = ap.parse_args()
    deadline = time.time() + a.budget_s
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result["copy_gbps"] = ceiling = copy_gbps()
    result["models"] = {}
    for model, (heads, kv_heads, dim) in MODELS.items():
        errors = check(heads, kv_heads, dim)
        rows = sweep(heads, kv_heads, dim, ceiling, deadline - 60)
        prefill_rows = prefill(heads, kv_heads, dim, deadline)
        result["models"][model] = {"rel_error_vs_float64": errors, "best": best(rows),
                                   "prefill_best": best(prefill_rows), "rows": rows, "prefill_rows": prefill_rows}
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({m: {**v["best"], **v["prefill_best"]} for m, v in result["models"].items()}, indent=1))
    print(json.dumps({m: v["rel_error_vs_float64"] for m, v in result["models"].items()}))


if __name__ == "__main__":
    main()
