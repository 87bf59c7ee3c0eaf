"""Batch-1 TPOT with and without n-gram speculation, measured the way the side-by-side harness measures it.

TPOT = (t(generate 257 tokens) - t(generate 1 token)) / 256, median of 3, batch 1, greedy, ignore_eos.
Two prompts: 128 random token ids (as sbs.py), and a 32-token random phrase repeated 4 times (copying can
pay if the model continues the pattern). Random weights decide what the model continues with, so the
acceptance this reports is what these weights give, not what a trained model would.

  python scripts/gpu/spec_tpot.py --artifact ART --vocab N --out FILE.json [--k 3] [--modes baseline,ngram,draft_self]

mtp: the model's own MTP layer drafts (a DeepSeek artifact built with its MTP package, docs/deepseek.md).
draft_self: the artifact drafts for itself (--method draft --draft-model ART), so every draft is accepted:
the verify step's cost when acceptance is 100%, and the draft's when the draft is as big as the target.

Each mode runs in its own process: an engine's KV cache stays reserved in the process after close(),
and a second engine in the same process finds no memory for its own.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time


def prompts(vocab: int) -> dict[str, list[int]]:
    r = random.Random(3)
    phrase = [r.randrange(100, vocab - 100) for _ in range(32)]
    return {"random_128": [r.randrange(100, vocab - 100) for _ in range(128)], "phrase_32_x4": phrase * 4}


def sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def tpot(engine, sampling, prompt: list[int]) -> dict:
    def gen(n: int) -> int:
        out = engine.generate([prompt], sampling(temperature=0, max_tokens=n, ignore_eos=True))
        return out[0]["num_tokens_output"]
    gen(257), gen(1)
    runs = []
    for _ in range(3):
        sync(); t = time.perf_counter(); gen(1); sync(); one = time.perf_counter() - t
        t = time.perf_counter(); n = gen(257); sync(); full = time.perf_counter() - t
        assert n == 257, n
        runs.append((full - one) / 256)
    return {"tpot_s": sorted(runs)[1], "tpot_runs": runs}


def measure(artifact: str, vocab: int, max_model_len: int, options: dict) -> dict:
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(artifact, max_model_len=max_model_len, gpu_memory_utilization=0.85, max_num_seqs=256, **options)
    result = {}
    for name, prompt in prompts(vocab).items():
        before = engine.print_mtp_statistics() if options else None
        result[name] = tpot(engine, SamplingParams, prompt)
        if options:
            result[name]["spec_stats_cumulative"] = engine.print_mtp_statistics()
            result[name]["spec_stats_before"] = before
    engine.close()
    return result


MODES = ("baseline", "ngram", "draft_self", "mtp")


def mode_options(mode: str, artifact: str, k: int) -> dict:
    if mode == "baseline":
        return {}
    if mode in ("ngram", "mtp"):
        return {"method": mode, "num_speculative_tokens": k}
    return {"method": "draft", "draft_model": artifact, "num_speculative_tokens": k}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--modes", default="baseline,ngram", help="comma-separated: " + ", ".join(MODES))
    p.add_argument("--only", choices=MODES, help="measure one mode here (used by the parent run)")
    a = p.parse_args()
    if a.only:
        json.dump(measure(a.artifact, a.vocab, a.max_model_len, mode_options(a.only, a.artifact, a.k)),
                  open(a.out, "w"), indent=1)
        return
    import torch
    out = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "artifact": a.artifact}
    for mode in a.modes.split(","):
        key = mode if mode == "baseline" else f"{mode}_k{a.k}"
        part = f"{a.out}.{mode}"
        subprocess.run([sys.executable, __file__, "--artifact", a.artifact, "--vocab", str(a.vocab), "--out", part,
                        "--k", str(a.k), "--max-model-len", str(a.max_model_len), "--only", mode], check=True)
        out[key] = json.load(open(part))
    json.dump(out, open(a.out, "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
