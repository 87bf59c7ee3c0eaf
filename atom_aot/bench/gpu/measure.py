"""One engine's figures for one scenario, in a process of its own: the same measuring code for atom-aot and
vLLM (each behind a two-method adapter), so each engine gets the GPU alone and vLLM's imports stay out of ours.

Run by the runner (atom_aot/bench/gpu/runner.py), not by hand:
  python -m atom_aot.bench.gpu.measure ENGINE SCENARIO --model DIR [--artifact ART] --out FILE.json
The prompts and methods are those of the shared side-by-side harness (../shared/tools/vllm-peer/sbs.py) and
scripts/vllm_peer.py: random token ids from random.Random(seed) in [100, vocab - 100), seed 3 for the TPOT
prompt and 4 for the throughput prompts.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from atom_aot.bench.gpu.scenarios import (GPU_MEMORY_UTILIZATION, MAX_NUM_SEQS, Scenario, engine_kwargs_vllm,
                                          scenario)

ENGINES = ("ours", "vllm")
TPOT_PROMPT_LEN = 128
OFFLINE_BATCH_KINDS = {"throughput", "prefill", "sampled"}     # the kinds that run the N x I prompts


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


class Ours:
    """atom-aot's offline engine from the scenario's artifact."""

    def __init__(self, artifact: str, max_model_len: int, **kwargs):
        from atom_aot import LLMEngine, SamplingParams
        self.params = SamplingParams
        self.engine = LLMEngine(artifact, max_model_len=max_model_len, gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                                max_num_seqs=MAX_NUM_SEQS, **kwargs)

    def generate(self, batch: list[list[int]], max_tokens: int, sampling: dict) -> int:
        outs = self.engine.generate(batch, self.params(max_tokens=max_tokens, ignore_eos=True, **sampling))
        return sum(o["num_tokens_output"] for o in outs)


class VLLM:
    """vllm.LLM on the scenario's model folder, generating from token ids."""

    def __init__(self, model: str, max_model_len: int, **kwargs):
        from vllm import LLM, SamplingParams
        self.params = SamplingParams
        self.engine = LLM(model=model, max_model_len=max_model_len, gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                          max_num_seqs=MAX_NUM_SEQS, seed=0, **kwargs)

    def generate(self, batch: list[list[int]], max_tokens: int, sampling: dict) -> int:
        from vllm.inputs import TokensPrompt
        outs = self.engine.generate([TokensPrompt(prompt_token_ids=p) for p in batch],
                                    self.params(max_tokens=max_tokens, ignore_eos=True, **sampling), use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)


def sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


GREEDY = {"temperature": 0.0}


def tpot(engine, prompt: list[list[int]], decode_tokens: int) -> dict:
    """Batch 1: (t(generate 1 + D tokens) - t(generate 1 token)) / D, median of 3, after one warm-up of each."""
    engine.generate(prompt, decode_tokens + 1, GREEDY)
    engine.generate(prompt, 1, GREEDY)
    runs = []
    for _ in range(3):
        sync(); start = time.perf_counter(); engine.generate(prompt, 1, GREEDY); sync()
        one = time.perf_counter() - start
        start = time.perf_counter(); n = engine.generate(prompt, decode_tokens + 1, GREEDY); sync()
        full = time.perf_counter() - start
        if n != decode_tokens + 1:
            raise RuntimeError(f"generated {n} tokens, not {decode_tokens + 1} (ignore_eos was set)")
        runs.append((full - one) / decode_tokens)
    return {"tpot_s": sorted(runs)[1], "runs": runs, "prompt_len": len(prompt[0]), "decode_tokens": decode_tokens,
            "method": "(t(1 + D tokens) - t(1 token)) / D, median of 3"}


def throughput(engine, batch: list[list[int]], output_len: int, sampling: dict) -> dict:
    """All prompts in one generate call (the engine schedules them), after a small warm-up batch."""
    engine.generate(batch[:4], 8, sampling)
    sync(); start = time.perf_counter()
    n = engine.generate(batch, output_len, sampling)
    sync(); seconds = time.perf_counter() - start
    return {"prompts": len(batch), "input_len": len(batch[0]), "output_len": output_len, "sampling": sampling,
            "seconds": seconds, "output_tokens": n, "output_tok_s": n / seconds,
            "total_tok_s": (n + len(batch) * len(batch[0])) / seconds}


def offline(which: str, s: Scenario, model: Path, artifact: Path | None) -> dict:
    """The scenario's offline kinds (throughput, prefill, sampled, tpot) on one engine started once."""
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    start = time.perf_counter()
    if which == "ours":
        engine = Ours(str(artifact), s.max_model_len, **dict(s.ours_kwargs))
    else:
        engine = VLLM(str(model), s.max_model_len, **engine_kwargs_vllm(s))
    result: dict = {"init_s": time.perf_counter() - start}
    w = s.workload
    batch = prompts(w.num_prompts, w.input_len, vocab, seed=4) if OFFLINE_BATCH_KINDS & set(w.kinds) else []
    if "tpot" in w.kinds:
        result["tpot"] = tpot(engine, prompts(1, TPOT_PROMPT_LEN, vocab, seed=3), w.decode_tokens)
    if "throughput" in w.kinds:
        result["throughput"] = throughput(engine, batch, w.output_len, GREEDY)
    if "prefill" in w.kinds:      # the same prompts, one new token each: what the prefill alone takes
        result["prefill"] = throughput(engine, batch, 1, GREEDY)
    if "sampled" in w.kinds:
        result["sampled"] = throughput(engine, batch, w.output_len, dict(w.sampling))
    if which == "ours" and dict(s.ours_kwargs).get("method"):
        result["speculation"] = engine.engine.print_mtp_statistics()
    return result


def versions(which: str) -> dict:
    import torch
    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    if which == "vllm":
        import vllm
        out["vllm"] = vllm.__version__
    else:
        from atom_aot import __version__
        out["atom_aot"] = __version__
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine", choices=ENGINES)
    p.add_argument("scenario")
    p.add_argument("--model", required=True, type=Path, help="the scenario's model folder")
    p.add_argument("--artifact", type=Path, help="ours: the scenario's artifact")
    p.add_argument("--work", type=Path, help="serving: where the client's result files go")
    p.add_argument("--out", required=True, type=Path)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    s = scenario(args.scenario)
    if args.engine == "ours" and args.artifact is None:
        raise SystemExit("measure: engine 'ours' needs --artifact")
    result = {"engine": args.engine, "versions": versions(args.engine)}   # no CUDA init: vLLM forks cleanly
    kinds = set(s.workload.kinds)
    if "cold" in kinds:
        from atom_aot.bench.gpu.cold import cold_start
        result["cold"] = cold_start(args.engine, s, args.model, args.artifact)
    if "serving" in kinds:
        from atom_aot.bench.gpu.serve import serving
        result["serving"] = serving(args.engine, s, args.model, args.artifact, args.work or args.out.parent)
    if kinds & (OFFLINE_BATCH_KINDS | {"tpot"}):
        result.update(offline(args.engine, s, args.model, args.artifact))
    if args.engine == "vllm" and "sampled" in kinds:
        result["sampler"] = "vLLM's PyTorch top-p/top-k (VLLM_USE_FLASHINFER_SAMPLER=0; no FlashInfer in the bundle)"
    import torch
    result["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
