"""Where a prefill-only run goes: GPU time per kernel over N prompts of L tokens, one new token each.

Why: at 256 x 1024 prompts, prefill took 4.37 s against vLLM FP8's 4.00 s (sbs.py --output-len 1, one H100)
while our decode step was faster; this names the kernels of the prefill steps (same categories as
profile_decode.py). The wall time and tokens/s are of a whole run; the kernel table is what torch.profiler
kept of the profiled run, which on the H100 (torch 2.11) was its last step only, acc_events or not: read it
as one step's proportions (`kernel_ms_total` says how much was kept).

  PYTHONPATH=. python scripts/profile_prefill.py --artifact ART --out $OUT/prefill.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from profile_decode import kernel_times  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=1024)
    a = p.parse_args(argv)
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(a.artifact, max_model_len=4096, gpu_memory_utilization=0.85, max_num_seqs=256)
    vocab = engine.loaded.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (a.input_len,), generator=gen).tolist() for _ in range(a.prompts)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.generate(prompts[:16], params)
    torch.cuda.synchronize(); t = time.perf_counter()
    engine.generate(prompts, params)
    torch.cuda.synchronize(); wall = time.perf_counter() - t
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        engine.generate(prompts, params)
        torch.cuda.synchronize()
    by_name, by_category, _ = kernel_times(prof)
    tokens = a.prompts * a.input_len
    report = {"device": torch.cuda.get_device_name(0), "artifact": a.artifact, "prompts": a.prompts,
              "input_len": a.input_len, "wall_s": wall, "tok_s": tokens / wall,
              "kernel_ms_total": sum(by_category.values()) / 1e3,
              "category_ms": {k: us / 1e3 for k, us in sorted(by_category.items(), key=lambda kv: -kv[1])},
              "top_kernels": [{"name": n[:160], "ms": us / 1e3, "calls": calls}
                              for n, (us, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]]}
    json.dump(report, open(a.out, "w"), indent=1)
    print(json.dumps({k: report[k] for k in ("wall_s", "tok_s", "kernel_ms_total", "category_ms")}, indent=1))


if __name__ == "__main__":
    main()
