"""Time atom_triton::fused_moe on real MoE layer shapes against ceilings measured in the same run.

    PYTHONPATH=. python scripts/bench_moe.py --out $OUT/moe.json          # H100/H200, a few minutes

For each model (one layer of its experts: random bf16 weights of the config's shapes, softmax top-k
routing of random logits) and each token count (decode batches 1, 16, 64, 256 and a 4096-token
prefill), every candidate config is timed as a CUDA-graph replay under do_bench (median, L2
flushed: atom_aot/ops/triton/timing.py), after checking the op against the torch reference. Each
row records:
- ms, TFLOP/s (6 * T * k * H * I flops) and the fraction of the bf16 matmul rate measured here
  (8192^3 `a @ b`): what prefill should approach;
- the bytes of the experts this batch actually hit (weights read once each) over ms, and the fraction
  of the copy bandwidth measured here: what decode should approach;
- dense_gemm_ms: the same flops as two dense bf16 GEMMs (T*k rows through one expert's w13 then w2),
  i.e. the op's cost if routing were free.
The best config per token count is what the build's tuning would keep (build/tune.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = next((p for p in (ROOT / "shared/models/configs", ROOT.parent / "shared/models/configs")
                        if p.is_dir()), ROOT.parent / "shared/models/configs")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--configs", type=Path, default=DEFAULT_CONFIGS, help="folder of HF config.json files")
    p.add_argument("--models", default="qwen3-30b-a3b,mixtral-8x7b")
    p.add_argument("--tokens", default="1,16,64,256,4096", help="token counts (decode batches, then prefill)")
    return p.parse_args(argv)


def ceilings() -> dict:
    from atom_aot.ops.triton.timing import measure_ms
    src = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy_ms = measure_ms(lambda: dst.copy_(src))[0]
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mm_ms = measure_ms(lambda: a @ b)[0]
    return {"copy_gbps": 2 * src.numel() / copy_ms / 1e6, "matmul_bf16_tflops": 2 * n ** 3 / mm_ms / 1e9}


def layer_shapes(config_path: Path) -> dict:
    from atom_aot.models import ModelConfig
    cfg = ModelConfig.from_json(config_path)
    return {"experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok, "hidden": cfg.hidden_size,
            "inter": cfg.moe_intermediate_size, "renormalize": cfg.norm_topk_prob or cfg.architecture == "MixtralForCausalLM"}


def bench_model(shape: dict, token_counts: list[int], ceil: dict) -> list[dict]:
    from atom_aot.ops.moe import fused_moe_reference, softmax_topk
    from atom_aot.ops.triton.fused_moe import CANDIDATE_CONFIGS
    from atom_aot.ops.triton.timing import measure_ms
    E, k, H, I = shape["experts"], shape["top_k"], shape["hidden"], shape["inter"]
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, device="cuda", generator=g).mul_(H ** -0.5).bfloat16()
    w2 = torch.randn(E, H, I, device="cuda", generator=g).mul_(I ** -0.5).bfloat16()
    op, rows = torch.ops.atom_triton.fused_moe, []
    for T in token_counts:
        x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
        weights, ids = softmax_topk(torch.randn(T, E, device="cuda", generator=g), k, shape["renormalize"])
        hit = int(torch.unique(ids).numel())
        active_bytes = hit * 3 * H * I * 2 + T * H * 2 * 2           # experts read once, x in, out
        flops = 6 * T * k * H * I
        ref = fused_moe_reference(x[:64], w13, w2, weights[:64], ids[:64]).float()
        dense_x, dense_h = torch.randn(T * k, H, device="cuda").bfloat16(), torch.randn(T * k, I, device="cuda").bfloat16()
        dense_ms = measure_ms(lambda: (dense_x @ w13[0].T, dense_h @ w2[0].T))[0]
        for c in CANDIDATE_CONFIGS:
            table = [1, *c.as_args()]
            got = op(x[:64], w13, w2, weights[:64], ids[:64], table).float()
            err = float((got - ref).norm() / ref.norm())
            ms = measure_ms(lambda: op(x, w13, w2, weights, ids, table))[0]
            rows.append({"tokens": T, "config": list(c.as_args()), "ms": ms, "rel_error": err,
                         "tflops": flops / ms / 1e9, "of_matmul_peak": flops / ms / 1e9 / ceil["matmul_bf16_tflops"],
                         "experts_hit": hit, "active_gbps": active_bytes / ms / 1e6,
                         "of_copy_bandwidth": active_bytes / ms / 1e6 / ceil["copy_gbps"], "dense_gemm_ms": dense_ms})
            print(f"T={T:5d} {c.as_args()} {ms:8.4f} ms  {rows[-1]['tflops']:6.1f} TFLOP/s  "
                  f"{rows[-1]['active_gbps']:7.0f} GB/s  err {err:.1e}", flush=True)
    return rows


def best_per_tokens(rows: list[dict]) -> dict:
    best = {}
    for row in rows:
        if row["rel_error"] < 2e-2 and (row["tokens"] not in best or row["ms"] < best[row["tokens"]]["ms"]):
            best[row["tokens"]] = row
    return {str(t): r for t, r in sorted(best.items())}


def main(argv=None) -> int:
    args = parse_args(argv)
    import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
    import triton
    start = time.time()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "ceilings": ceilings(), "models": {}, "errors": []}
    for name in args.models.split(","):
        try:
            shape = layer_shapes(args.configs / f"{name}.json")
            rows = bench_model(shape, [int(t) for t in args.tokens.split(",")], result["ceilings"])
            result["models"][name] = {"shape": shape, "rows": rows, "best": best_per_tokens(rows)}
        except Exception:  # noqa: BLE001  (record and go on with the next model)
            result["errors"].append({"model": name, "error": traceback.format_exc()})
    result["seconds"] = time.time() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, model in result["models"].items():
        for t, row in model["best"].items():
            print(f"{name} T={t}: {row['ms']:.4f} ms {row['config']} {row['tflops']:.1f} TFLOP/s "
                  f"({row['of_matmul_peak']:.0%} of matmul) {row['active_gbps']:.0f} GB/s "
                  f"({row['of_copy_bandwidth']:.0%} of copy); dense GEMM {row['dense_gemm_ms']:.4f} ms")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
