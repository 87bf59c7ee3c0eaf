#!/usr/bin/env python
"""CPU decode speed of SmolLM2-135M, ours vs Hugging Face transformers eager, in one process:
batch 1, greedy, `--max-new-tokens` after a short chat prompt (eos ignored), same weights.

    python scripts/bench_cpu_decode.py [--model GGUF] [--max-new-tokens 128] [--repeats 3] \
        [--threads N] [--out cpu_decode.json]

Our side runs the AOTInductor artifact that `atom-build --model GGUF` makes (built once, then
found in the artifact cache by its build key) and the same artifact with `enforce_eager=True`.
Runs are interleaved (ours, ours eager, HF; repeated) so machine noise hits all three alike;
the median of the repeats is reported. Decode tok/s counts tokens after the first (1 / TPOT).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from atom_aot.bench import hf_reference  # noqa: E402

SHARED_GGUF = (Path(__file__).resolve().parents[2] / "shared" / "models" / "smollm2-135m-instruct"
               / "SmolLM2-135M-Instruct.Q4_1.gguf")
QUESTION = "Write a short story about a robot who learns to paint."


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(SHARED_GGUF) if SHARED_GGUF.exists() else None,
                   help="GGUF (tokenizer files beside it); default: the shared SmolLM2, else the embedded default")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default="cpu_decode.json")
    return p.parse_args(argv)


def artifact_for(model: str) -> tuple[Path, dict]:
    """The AOTI artifact of `model`, from the cache or built now (as `atom-build --model` would)."""
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.pipeline import build
    start = time.perf_counter()
    result = build(model, BuildConfig(arch="cpu", compile="aoti"))
    return result.path, {"artifact": str(result.path), "cached": result.cached,
                         "build_s": round(time.perf_counter() - start, 1)}


class Ours:
    def __init__(self, artifact: Path, eager: bool):
        from atom_aot import LLMEngine
        self.engine = LLMEngine(str(artifact), enforce_eager=eager)
        self.name = "ours eager" if eager else "ours (AOTInductor)"

    def run(self, prompt_ids: list[int], n: int) -> dict:
        from atom_aot import SamplingParams
        out = self.engine.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
        return {"tokens": out["token_ids"], "ttft_s": out["ttft"], "decode_tok_s": 1 / out["tpot"],
                "e2e_tok_s": len(out["token_ids"]) / out["latency"]}


class HF:
    name = "HF transformers eager"

    def __init__(self, model: str):
        self.model = hf_reference.load_model(model)

    def run(self, prompt_ids: list[int], n: int) -> dict:
        tokens, times = hf_reference.greedy(self.model, prompt_ids, n, ignore_eos=True)
        return {"tokens": tokens, "ttft_s": times.ttft, "decode_tok_s": times.decode_tok_s,
                "e2e_tok_s": len(tokens) / (times.stamps[-1] - times.start)}


def measure(runners: list, prompt_ids: list[int], args) -> dict:
    for runner in runners:                      # warm-up: first-call costs out of the timings
        runner.run(prompt_ids, 8)
    runs = {r.name: [] for r in runners}
    for _ in range(args.repeats):
        for runner in runners:
            runs[runner.name].append(runner.run(prompt_ids, args.max_new_tokens))
    return {name: {"decode_tok_s": statistics.median(r["decode_tok_s"] for r in rs),
                   "e2e_tok_s": statistics.median(r["e2e_tok_s"] for r in rs),
                   "ttft_ms": 1000 * statistics.median(r["ttft_s"] for r in rs),
                   "decode_tok_s_runs": [round(r["decode_tok_s"], 2) for r in rs], "tokens": rs[-1]["tokens"]}
            for name, rs in runs.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from atom_aot.build.default_model import default_model_path
        args.model = default_model_path()
    artifact, build_info = artifact_for(args.model)
    ours, ours_eager = Ours(artifact, eager=False), Ours(artifact, eager=True)
    prompt = ours.engine.apply_chat_template([{"role": "user", "content": QUESTION}])
    prompt_ids = ours.engine.tokenizer(prompt, add_special_tokens=False).input_ids
    hf = HF(args.model)
    results = measure([ours, ours_eager, hf], prompt_ids, args)
    reference = results[hf.name]
    for name, r in results.items():
        r["ratio_vs_hf"] = r["decode_tok_s"] / reference["decode_tok_s"]
        r["same_tokens_as_hf"] = r["tokens"] == reference["tokens"]
        print(f"{name:24s} decode {r['decode_tok_s']:7.1f} tok/s  e2e {r['e2e_tok_s']:7.1f} tok/s  "
              f"TTFT {r['ttft_ms']:6.1f} ms  x{r['ratio_vs_hf']:.2f} vs HF  runs {r['decode_tok_s_runs']}")
    for r in results.values():
        del r["tokens"]
    record = {"model": args.model, "prompt_tokens": len(prompt_ids), "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "load_average": os.getloadavg(), **build_info, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
