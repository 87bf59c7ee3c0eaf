#!/usr/bin/env python
"""The Hugging Face transformers peer: the serving benchmark's random workload, run by
transformers on the same machine, so ours/peer ratios come from one machine.

    python scripts/peer_hf.py --model MODEL --device cuda --num-prompts 64 \
        --random-input-len 1024 --random-output-len 128 --seed 0 --out peer.json \
        [--compare ours.json]

The prompts are `atom_aot.bench.datasets.sample_random` with the same flags and seed as
`python -m atom_aot.bench.serving`, so both sides see the same token ids. Modes (`--modes`):
- latency: batch 1, `generate` with a static cache and `torch.compile` (the documented fast path);
- batch: padded `generate` in batches of `--batch-size` (one prefill, then lockstep decode);
- cb: continuous batching, `model.generate_batch` (when this transformers has it).
Output lengths are exact (eos ignored), as with `--ignore-eos` on our side. `--compare` takes a
`bench.serving` result file and prints our output throughput over the peer's best.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from atom_aot.bench import hf_reference  # noqa: E402
from atom_aot.bench.datasets import sample_random  # noqa: E402
from atom_aot.dtypes import dtype_name

MODES = ("latency", "batch", "cb")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF folder or GGUF (tokenizer files beside it)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on GPUs, float32 on the CPU")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="latency,batch,cb", help=f"any of {','.join(MODES)}")
    p.add_argument("--latency-prompts", type=int, default=4, help="prompts timed at batch 1")
    p.add_argument("--batch-size", type=int, default=32, help="batch mode: prompts per generate call")
    p.add_argument("--no-compile", action="store_true", help="latency mode without torch.compile")
    p.add_argument("--out", default=None, help="write the results as JSON")
    p.add_argument("--compare", default=None, help="a bench.serving result JSON to divide by the peer")
    args = p.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"--modes: unknown {', '.join(sorted(unknown))}")
    return args


def workload(args, tokenizer) -> list[list[int]]:
    requests = sample_random(tokenizer, args.num_prompts, args.random_input_len, args.random_output_len,
                             args.random_range_ratio, 0, args.seed)
    return [tokenizer(r.prompt).input_ids for r in requests]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_latency(model, prompts, args) -> dict:
    """Batch 1: TTFT and decode tok/s per prompt. A static cache makes `generate` compile its
    decode step itself on GPUs (transformers' auto-compile); --no-compile turns that off."""
    from transformers import CompileConfig
    model.generation_config.cache_implementation = "static"
    if args.no_compile:
        model.generation_config.disable_compile = True
    else:
        model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    for ids in prompts[:2]:                    # compile / capture before timing
        hf_reference.greedy(model, ids, args.random_output_len, ignore_eos=True)
    ttfts, rates = [], []
    for ids in prompts[:args.latency_prompts]:
        out, times = hf_reference.greedy(model, ids, args.random_output_len, ignore_eos=True)
        ttfts.append(times.ttft)
        rates.append(times.decode_tok_s)
    compiled = not args.no_compile and args.device != "cpu"     # auto-compile skips the CPU
    return {"prompts": len(ttfts), "compiled": compiled, "mean_ttft_ms": 1000 * sum(ttfts) / len(ttfts),
            "decode_tok_s": sum(rates) / len(rates)}


@torch.inference_mode()
def run_batch(model, tokenizer, prompts, args) -> dict:
    """Left-padded `generate` in fixed batches; output tok/s over the whole workload."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (hf_reference.eos_ids(model) or [0])[0]
    n_out = args.random_output_len
    start, generated = time.perf_counter(), 0
    for i in range(0, len(prompts), args.batch_size):
        chunk = prompts[i:i + args.batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=model.device)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n_out, min_new_tokens=n_out, do_sample=False,
                             eos_token_id=None, pad_token_id=pad)
        generated += (out.shape[1] - width) * len(chunk)
    _sync(args.device)
    elapsed = time.perf_counter() - start
    return {"batch_size": args.batch_size, "seconds": elapsed, "output_tokens": generated,
            "output_throughput": generated / elapsed}


def run_cb(model, prompts, args) -> dict:
    """Continuous batching through `generate_batch`, the workload submitted at once."""
    if not hasattr(model, "generate_batch"):
        return {"skipped": "this transformers has no generate_batch"}
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=args.random_output_len, do_sample=False, eos_token_id=-1)
    try:   # warm up on the whole workload (the manager is sized for it), keep the manager, reuse it
        model.generate_batch(inputs=prompts, generation_config=config, persistent_manager=True)
        timed = {"warmup": False}
    except TypeError:       # an older generate_batch: no persistent manager; the timed call warms up itself
        timed = {}
    start = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=config, **timed)
    _sync(args.device)
    elapsed = time.perf_counter() - start
    generated = sum(len(r.generated_tokens) for r in results.values())
    return {"seconds": elapsed, "output_tokens": generated, "output_throughput": generated / elapsed}


def compare(ours_path: str, results: dict) -> dict:
    ours = json.loads(Path(ours_path).read_text())["output_throughput"]
    peer = max((r["output_throughput"] for r in results.values() if "output_throughput" in r), default=None)
    return {"ours_output_throughput": ours, "peer_best_output_throughput": peer,
            "ratio_ours_over_peer": ours / peer if peer else None}


def main(argv=None) -> int:
    args = parse_args(argv)
    import transformers
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    tokenizer = hf_reference.load_tokenizer(args.model)
    prompts = workload(args, tokenizer)
    record = {"model": args.model, "device": args.device, "dtype": dtype_name(dtype),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "workload": {"num_prompts": args.num_prompts, "input_len": args.random_input_len,
                           "output_len": args.random_output_len, "range_ratio": args.random_range_ratio,
                           "seed": args.seed}, "results": {}}
    for mode in args.modes.split(","):
        model = hf_reference.load_model(args.model, dtype, args.device)    # fresh: compile state does not leak
        try:
            record["results"][mode] = (run_latency(model, prompts, args) if mode == "latency" else
                                       run_batch(model, tokenizer, prompts, args) if mode == "batch" else
                                       run_cb(model, prompts, args))
        except Exception as e:     # one mode failing (an API missing in this transformers) keeps the others
            record["results"][mode] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{mode}: {record['results'][mode]}", flush=True)
    if args.compare:
        record["comparison"] = compare(args.compare, record["results"])
        print(f"comparison: {record['comparison']}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
