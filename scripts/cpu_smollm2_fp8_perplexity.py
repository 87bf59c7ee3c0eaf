"""SmolLM2-135M-Instruct's perplexity on a fixed text (atom_aot/bench/perplexity.py) in float32, bf16,
and with FP8 or INT8 weights (W8A8) and/or an FP8 KV cache (calibrated scales), on the CPU; writes JSON.

    python scripts/cpu_smollm2_fp8_perplexity.py [--out docs/benchmarks/cpu-smollm2-fp8-perplexity.json]

The checkpoint is the shared GGUF (Q4_1, dequantized to float32 by the build), so "float32" is the
reference every other row is compared with.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "float32": {},
    "bf16": {"dtype": "bfloat16"},
    "fp8 weights": {"quant": "fp8"},
    "fp8 kv cache": {"kv_cache_dtype": "fp8"},
    "fp8 weights + fp8 kv cache": {"quant": "fp8", "kv_cache_dtype": "fp8"},
    "bf16, fp8 weights + fp8 kv cache": {"dtype": "bfloat16", "quant": "fp8", "kv_cache_dtype": "fp8"},
    "int8 weights": {"quant": "int8"},
    "bf16, int8 weights": {"dtype": "bfloat16", "quant": "int8"},
}
ROOT = Path(__file__).resolve().parents[1]
GGUF = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(GGUF))
    parser.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks/cpu-smollm2-fp8-perplexity.json")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="these rows (float32 always runs)")
    args = parser.parse_args()
    configs = {n: o for n, o in CONFIGS.items() if not args.only or n == "float32" or n in args.only}
    from atom_aot.bench.perplexity import perplexity
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.pipeline import build
    rows = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, options in configs.items():
            artifact = build(args.model, BuildConfig(arch="cpu", compile="none", **options), cache_dir=Path(cache),
                             show_progress=False).path
            start = time.perf_counter()
            ppl, tokens = perplexity(artifact)
            rows[name] = {"options": options, "perplexity": round(ppl, 4), "tokens": tokens,
                          "seconds": round(time.perf_counter() - start, 1)}
            print(f"{name:<36} ppl {ppl:.4f} over {tokens} tokens")
    base = rows["float32"]["perplexity"]
    for row in rows.values():
        row["relative_to_float32"] = round(row["perplexity"] / base - 1, 5)
    args.out.write_text(json.dumps({"model": Path(args.model).name, "device": "cpu",
                                    "metric": "perplexity of atom_aot/bench/perplexity.py TEXT, teacher-forced",
                                    "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
