"""Time atom_triton::fused_moe on MXFP4 experts against bf16 experts at GPT-OSS-20B's expert shapes.

    PYTHONPATH=. python scripts/bench_moe_mxfp4.py --out $OUT/moe-mxfp4.json           # one H100/H200
    PYTHONPATH=. TRITON_INTERPRET=1 python scripts/bench_moe_mxfp4.py --dry-run --out /tmp/moe-mxfp4.json   # CPU

One layer of 32 experts, top-4, hidden 2880, expert width 2880 (GPT-OSS-20B), with its expert biases (--no-biases
leaves them out), bf16 activations. bf16 experts: normal weights; mxfp4 experts: random bytes with exponents
2^-7 .. 2^-4 (a trained layer's spread). Routing: softmax top-k of random logits. For each batch T (1 .. 256) and
each format, every config the build's tuning times for that format (build/tune.py moe_candidates) is checked
against the reference op (ops/moe.py, on the first 64 tokens) and timed as the build times it (CUDA-graph replay
under do_bench, median, L2 flushed: ops/triton/timing.py). Each row: ms; the bytes of the experts the batch hits
(each read once: packed e2m1 + scales for mxfp4) plus activations, over ms, and that as a fraction of the copy
bandwidth measured in the same run. `best` has, per T, each format's fastest config and bf16 ms / mxfp4 ms.
--dry-run runs the same code in Triton's interpreter on tiny shapes in float32 (checks only, no timing).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import ceilings  # noqa: E402  (the copy and matmul rates, measured the same way)

GPT_OSS_20B = {"experts": 32, "top_k": 4, "hidden": 2880, "inter": 2880}
DRY_RUN = {"experts": 4, "top_k": 2, "hidden": 64, "inter": 64}
FORMATS = ("model-dtype", "mxfp4")            # ops/expert_formats.py: bf16 experts, mxfp4 experts


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256", help="token counts (decode batches)")
    p.add_argument("--no-biases", action="store_true", help="time the experts without their biases")
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny shapes: checks only")
    return p.parse_args(argv)


def expert_bytes(fmt: str, shape: dict, biases: bool) -> int:
    """One expert's weight bytes as the kernels read them."""
    h, i = shape["hidden"], shape["inter"]
    per_value = 0.5 + 1 / 32 if fmt == "mxfp4" else 2
    return int(3 * h * i * per_value) + (4 * (2 * i + h) if biases else 0)


def layer(fmt: str, shape: dict, biases: bool, dtype: torch.dtype, device: str):
    """The layer's experts in `fmt`, as the build's tuning draws them, with float32 biases if asked."""
    from atom_aot.build.tune import random_expert_stacks
    from atom_aot.ops.expert_formats import FORMATS as EXPERT_FORMATS
    from atom_aot.ops.moe import ExpertWeights
    stacks = random_expert_stacks(EXPERT_FORMATS[fmt], shape["experts"], shape["inter"], shape["hidden"], dtype,
                                  device)
    if not biases:
        return stacks
    e, h, i = shape["experts"], shape["hidden"], shape["inter"]
    return ExpertWeights(stacks.w13, stacks.w2, stacks.w13_scale, stacks.w2_scale,
                         0.1 * torch.randn(e, 2 * i, device=device), 0.1 * torch.randn(e, h, device=device))


def bench_format(fmt: str, shape: dict, token_counts: list[int], args, ceil: dict | None, device: str) -> list[dict]:
    from atom_aot.build.tune import moe_candidates
    from atom_aot.ops.expert_formats import FORMATS as EXPERT_FORMATS
    from atom_aot.ops.moe import fused_moe_reference, softmax_topk
    from atom_aot.ops.triton.timing import measure_ms
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    stacks = layer(fmt, shape, not args.no_biases, dtype, device)
    candidates = moe_candidates(EXPERT_FORMATS[fmt])[:1 if args.dry_run else None]
    op, rows = torch.ops.atom_triton.fused_moe, []
    for tokens in token_counts:
        x = torch.randn(tokens, shape["hidden"], device=device, dtype=dtype)
        weights, ids = softmax_topk(torch.randn(tokens, shape["experts"], device=device), shape["top_k"], True)
        moved = int(torch.unique(ids).numel()) * expert_bytes(fmt, shape, not args.no_biases) + tokens * shape["hidden"] * 4
        checked = slice(0, 64)
        ref = fused_moe_reference(x[checked], stacks.w13, stacks.w2, weights[checked], ids[checked],
                                  *stacks.optional()).float()
        for c in candidates:
            table = [1, *c.as_args()]
            got = op(x[checked], stacks.w13, stacks.w2, weights[checked], ids[checked], table, *stacks.optional())
            err = float((got.float() - ref).norm() / ref.norm())
            ms = None if args.dry_run else measure_ms(lambda: op(x, stacks.w13, stacks.w2, weights, ids, table,
                                                                 *stacks.optional()))[0]
            row = {"format": fmt, "tokens": tokens, "config": list(c.as_args()), "ms": ms, "rel_error": err,
                   "bytes": moved}
            if ms is not None:
                row |= {"gbps": moved / ms / 1e6, "of_copy_bandwidth": moved / ms / 1e6 / ceil["copy_gbps"]}
            rows.append(row)
            print(f"{fmt:11s} T={tokens:4d} {c.as_args()} ms {ms} err {err:.1e}", flush=True)
    return rows


def best_per_tokens(rows: list[dict]) -> dict:
    """T -> {format: its fastest checked row}, and bf16 ms / mxfp4 ms."""
    best: dict[int, dict] = {}
    for row in rows:
        if row["ms"] is None or row["rel_error"] >= 2e-2:
            continue
        mine = best.setdefault(row["tokens"], {})
        if row["format"] not in mine or row["ms"] < mine[row["format"]]["ms"]:
            mine[row["format"]] = row
    for row in best.values():
        if set(FORMATS) <= set(row):
            row["bf16_over_mxfp4"] = row["model-dtype"]["ms"] / row["mxfp4"]["ms"]
    return {str(t): r for t, r in sorted(best.items())}


def main(argv=None) -> int:
    args = parse_args(argv)
    import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
    import triton
    device = "cpu" if args.dry_run else "cuda"
    shape = DRY_RUN if args.dry_run else GPT_OSS_20B
    tokens = [1, 5] if args.dry_run else [int(t) for t in args.tokens.split(",")]
    start = time.time()
    ceil = None if args.dry_run else ceilings()
    rows = [row for fmt in FORMATS for row in bench_format(fmt, shape, tokens, args, ceil, device)]
    result = {"device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "shape": shape, "biases": not args.no_biases, "ceilings": ceil,
              "rows": rows, "best": best_per_tokens(rows), "seconds": time.time() - start}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for t, row in result["best"].items():
        print(f"T={t}: " + "; ".join(f"{fmt} {row[fmt]['ms']:.4f} ms {row[fmt]['config']} {row[fmt]['gbps']:.0f} GB/s"
                                     for fmt in FORMATS if fmt in row)
              + (f"; bf16 / mxfp4 {row['bf16_over_mxfp4']:.2f}x" if "bf16_over_mxfp4" in row else ""))
    bad = [r for r in rows if not r["rel_error"] < 2e-2]
    if bad:
        print(f"{len(bad)} rows disagree with the reference (rel_error >= 2e-2)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
