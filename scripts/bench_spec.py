#!/usr/bin/env python
"""N-gram speculative decoding on the CPU, with and without: batch 1, greedy, SmolLM2-135M-Instruct,
on prompts where copying pays (rewrite a given paragraph, edit given code) and one where it does not
(a story from a one-line request). Tokens/s and acceptance, written as JSON.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_spec.py [--model GGUF] [--compile none|aoti] [--k 4] [--max-new-tokens 64] \
        [--repeats 1] [--threads N] [--out docs/benchmarks/cpu-smollm2-ngram-spec.json]

Greedy speculation emits exactly the tokens decoding without it does (the test suite checks it),
so both sides generate the same text and the times compare like for like. Runs interleave (plain,
speculative) per prompt and repeat; the median is reported. Decode tok/s counts tokens after the
first (1 / TPOT): speculation changes decoding, not the prefill. On a shared host, OMP_WAIT_POLICY=PASSIVE
and --threads 1 keep idle OpenMP threads from spinning against the other jobs (the report keeps both).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from atom_aot import LLMEngine, SamplingParams  # noqa: E402
from atom_aot.entrypoints.llm import is_artifact  # noqa: E402

SHARED_GGUF = (Path(__file__).resolve().parents[2] / "shared" / "models" / "smollm2-135m-instruct"
               / "SmolLM2-135M-Instruct.Q4_1.gguf")
PARAGRAPH = ("The engine keeps the keys and values of every sequence in fixed-size blocks of memory, so that a "
             "sequence can grow without copying what it already holds. When memory runs out, the youngest "
             "sequence is preempted: its blocks are freed and it is recomputed later from its tokens.")
CODE = ("def total_price(items, tax):\n    result = 0\n    for item in items:\n        result = result + "
        "item.price * item.count\n    result = result * (1 + tax)\n    return result\n")
PROMPTS = {
    "rewrite a paragraph (copying pays)":
        f"Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}",
    "edit code (copying pays)":
        f"Rename the variable `result` to `total` in this Python function and show the whole function:\n\n{CODE}",
    "write a story (copying does not pay)": "Write a short story about a robot who learns to paint.",
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(SHARED_GGUF), help="an artifact, or a GGUF / HF folder (built into the "
                   "artifact cache with --compile)")
    p.add_argument("--compile", default="none", choices=("none", "aoti"), help="how a model is built")
    p.add_argument("--k", type=int, default=4, help="--num-speculative-tokens")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="docs/benchmarks/cpu-smollm2-ngram-spec.json")
    return p.parse_args(argv)


def timed(engine: LLMEngine, prompt: str, max_new_tokens: int) -> dict:
    """One greedy generation: its tokens, decode tok/s and end-to-end tok/s."""
    params = SamplingParams(temperature=0, max_tokens=max_new_tokens)
    out = engine.generate([engine.apply_chat_template([{"role": "user", "content": prompt}])], params)[0]
    n = out["num_tokens_output"]
    decode_s = out["latency"] - out["ttft"]
    return {"tokens": out["token_ids"], "num_tokens": n, "decode_tok_s": (n - 1) / decode_s,
            "e2e_tok_s": n / out["latency"], "ttft_s": out["ttft"]}


def acceptance(before: dict, after: dict) -> dict:
    proposed = after["proposed_total"] - before["proposed_total"]
    accepted = after["accepted_total"] - before["accepted_total"]
    verified = after["num_verified"] - before["num_verified"]
    return {"proposed": proposed, "accepted": accepted, "acceptance_rate": accepted / proposed if proposed else 0.0,
            "mean_accepted_length": 1 + accepted / verified if verified else 0.0}


def measure(plain: LLMEngine, spec: LLMEngine, prompt: str, repeats: int, max_new_tokens: int) -> dict:
    runs = {"plain": [], "ngram": []}
    before = spec.core.spec_counters.summary()
    for _ in range(repeats):
        runs["plain"].append(timed(plain, prompt, max_new_tokens))
        runs["ngram"].append(timed(spec, prompt, max_new_tokens))
    same = all(r["tokens"] == runs["plain"][0]["tokens"] for r in runs["plain"] + runs["ngram"])
    row = {"same_tokens": same, "num_tokens": runs["plain"][0]["num_tokens"],
           "acceptance": acceptance(before, spec.core.spec_counters.summary())}
    for side, results in runs.items():
        row[side] = {key: statistics.median(r[key] for r in results) for key in ("decode_tok_s", "e2e_tok_s", "ttft_s")}
    row["decode_speedup"] = row["ngram"]["decode_tok_s"] / row["plain"]["decode_tok_s"]
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    common = {"num_threads": args.threads, **({} if is_artifact(args.model) else {"compile": args.compile})}
    plain = LLMEngine(args.model, **common)
    spec = LLMEngine(args.model, method="ngram", num_speculative_tokens=args.k, **common)
    for engine in (plain, spec):                                     # warm-up (first-call costs)
        engine.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))
    results = {}
    for name, prompt in PROMPTS.items():
        results[name] = measure(plain, spec, prompt, args.repeats, args.max_new_tokens)
        print(summary_line(name, results[name]), flush=True)
    report = {"what": "n-gram speculative decoding vs none, batch 1, greedy, CPU", "model": args.model,
              "artifact": str(plain.artifact_path), "compiled": plain.loaded.manifest.compiled.kind,
              "num_speculative_tokens": args.k,
              "ngram_n": [spec.config.ngram_min_n, spec.config.ngram_max_n], "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "threads": args.threads, "cpus": os.cpu_count(), "host": platform.node(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]],
              "note": "measured on a 2-core machine shared with other jobs running at the same time: absolute "
                      "tok/s are noisy; the same-prompt ratios are the signal",
              "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
              "prompts": PROMPTS, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def summary_line(name: str, row: dict) -> str:
    return (f"{name}: {row['num_tokens']} tokens, decode {row['plain']['decode_tok_s']:.1f} -> "
            f"{row['ngram']['decode_tok_s']:.1f} tok/s (x{row['decode_speedup']:.2f}), acceptance "
            f"{row['acceptance']['acceptance_rate']:.0%}, mean accepted length "
            f"{row['acceptance']['mean_accepted_length']:.2f}, same tokens: {row['same_tokens']}")


if __name__ == "__main__":
    sys.exit(main())
