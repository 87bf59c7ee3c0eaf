"""vLLM's batch-256 decode step, kernel by kernel, on the workload our side-by-side runs use: where its step is
shorter than ours (Llama-3.1-8B's decode attention read ~35 GB at 2.88 TB/s in ours, vLLM's was never
profiled).

  PYTHONPATH=/tmp/vsite python3 scripts/gpu/vllm_decode_profile.py --model /tmp/m/llama-3.1-8b --out $OUT/vllm-step.json

The 256 prompts of sbs.py's throughput run (1024 random ids) first fill vLLM's prefix cache (one token each), then
generate DECODE + 1 tokens under its torch profiler: their prefill is a cache hit but for the last block, the rest
is DECODE decode steps at batch 256 and a context of ~1.03-1.06k (ours: scripts/profile_decode.py). The engine
core's trace is summed by kernel name over the window and divided by the decode steps; kernels are grouped as
attention, GEMM or other by name, and the trace file comes back beside the JSON.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import shutil
import time
from collections import defaultdict

GROUPS = (("attention", ("flash", "attn", "attention", "fmha")),
          ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "matmul")))


def group_of(kernel: str) -> str:
    name = kernel.lower()
    return next((group for group, keys in GROUPS if any(k in name for k in keys)), "other")


def kernel_times(trace_path: str) -> dict[str, float]:
    """Milliseconds per kernel name in a torch profiler Chrome trace (.json or .json.gz)."""
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    totals: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            totals[e["name"]] += e.get("dur", 0) / 1000
    return dict(totals)


def summarize(totals: dict[str, float], steps: int, top: int = 25) -> dict:
    groups: dict[str, float] = defaultdict(float)
    for name, ms in totals.items():
        groups[group_of(name)] += ms
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return {"steps": steps, "kernel_ms_per_step": round(sum(totals.values()) / steps, 3),
            "groups_ms_per_step": {g: round(ms / steps, 3) for g, ms in sorted(groups.items())},
            "top_kernels_ms_per_step": [{"kernel": n[:160], "group": group_of(n), "ms": round(ms / steps, 4)}
                                        for n, ms in ranked]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--decode", type=int, default=32, help="decode steps profiled")
    parser.add_argument("--batch", type=int, default=256, help="prompts decoding together")
    parser.add_argument("--input-len", type=int, default=1024, help="tokens of each prompt")
    parser.add_argument("--load-format", default="dummy",
                        help="vLLM's: dummy (its own random weights) or auto (the folder's checkpoint, e.g. ours "
                             "drawn: MoE models, where vLLM's dummy weights route every token to the same experts)")
    parser.add_argument("--engine-kwargs", default="{}", help="JSON: more LLM(...) arguments")
    args = parser.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    trace_dir = "/tmp/vllm-profile"
    shutil.rmtree(trace_dir, ignore_errors=True)
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    rng = random.Random(4)                          # sbs.py's throughput prompts
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(100, vocab - 100) for _ in range(args.input_len)])
               for _ in range(args.batch)]
    llm = LLM(model=args.model, max_model_len=4096, gpu_memory_utilization=0.85, max_num_seqs=args.batch, seed=0,
              load_format=args.load_format, profiler_config={"profiler": "torch", "torch_profiler_dir": trace_dir,
                                                     "torch_profiler_with_stack": False},
              **json.loads(args.engine_kwargs))
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)     # noqa: E731
    llm.generate(prompts, greedy(1), use_tqdm=False)                # the prefix cache holds the prompts now
    llm.start_profile()
    start = time.perf_counter()
    llm.generate(prompts, greedy(args.decode + 1), use_tqdm=False)
    seconds = time.perf_counter() - start
    llm.stop_profile()
    time.sleep(5)                                                   # the engine core writes its trace
    traces = sorted(glob.glob(f"{trace_dir}/**/*.json*", recursive=True), key=os.path.getsize)
    report = {"model": args.model, "load_format": args.load_format, "batch": args.batch, "input_len": args.input_len,
              "window_s": round(seconds, 3), "traces": traces}
    if traces:
        report.update(summarize(kernel_times(traces[-1]), args.decode))
        name = "vllm-trace.json.gz" if traces[-1].endswith(".gz") else "vllm-trace.json"
        shutil.copy(traces[-1], os.path.join(os.path.dirname(os.path.abspath(args.out)), name))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "top_kernels_ms_per_step"}, indent=1))


if __name__ == "__main__":
    main()
