"""`python -m atom_aot.examples.profile_offline --model ART --input-length 128 --output-length 32
--bs 4 [--random-input] --torch-profiler-dir DIR`: one batch through the offline engine under the
torch profiler, written as a gzipped Chrome trace for `scripts/analyze_trace.py` (or Perfetto).

The engine flags are ATOM's EngineArgs' and ours (atom_aot/entrypoints/engine_args.py): build flags for
a model built here (`--kv_cache_dtype fp8`, `-tp 2`, ...), runtime flags (`--enforce-eager`, `--seed`, which
also draws the --random-input prompts) and ATOM's spellings (`--level 0`, ...). The trace is rank 0's.

Each engine step is labelled `prefill[bs=..,tokens=..]` or `decode[bs=..,tokens=..]`; on the
eager path each decoder layer is labelled `layer[i]` too (compiled code has no layers to see).
`ATOM_PROFILER_MORE=1` also records shapes, Python stacks and memory (a slower, larger trace).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

from atom_aot.entrypoints.engine_args import add_engine_arguments, engine_options

FIXED_TEXT = ("The quick brown fox jumps over the lazy dog while the engine profiles every step of "
              "prefill and decode. ")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atom_aot.examples.profile_offline",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="artifact, HF folder or GGUF (default: the embedded model)")
    p.add_argument("--input-length", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-length", type=int, default=32, help="generated tokens per request (eos ignored)")
    p.add_argument("--bs", type=int, default=4, help="requests in the batch")
    p.add_argument("--random-input", action="store_true", help="random token prompts (default: fixed text)")
    p.add_argument("--torch-profiler-dir", default="profiles", help="where the trace goes")
    add_engine_arguments(p)
    return p.parse_args(argv)


def make_prompts(tokenizer, bs: int, length: int, random_input: bool, seed: int) -> list[list[int]]:
    """`bs` token-id prompts of exactly `length` tokens, all different (so the prefix cache does not
    turn the batch into one prompt)."""
    if random_input:
        rng = np.random.default_rng(seed)
        special = set(tokenizer.all_special_ids)
        allowed = np.array([t for t in range(tokenizer.vocab_size) if t not in special])
        return [allowed[rng.integers(0, len(allowed), size=length)].tolist() for _ in range(bs)]
    text = tokenizer(FIXED_TEXT * (length // 8 + 2), add_special_tokens=False).input_ids
    return [text[i:i + length] for i in range(bs)]


def label_layers(forwards: dict) -> int:
    """Wrap every decoder layer (`layers.<i>`) of the eager modules among the engine's forwards in
    a `layer[i]` range; returns how many were labelled (0 for compiled code)."""
    modules = {id(f): f for f in forwards.values() if isinstance(f, torch.nn.Module)}.values()
    count = 0
    for name, module in (item for model in modules for item in model.named_modules()):
        match = re.search(r"layers\.(\d+)$", name)
        if match:
            ranges = []
            label = f"layer[{match.group(1)}]"
            module.register_forward_pre_hook(lambda *_, r=ranges, n=label: r.append(_enter(n)))
            module.register_forward_hook(lambda *_, r=ranges: r.pop().__exit__(None, None, None))
            count += 1
    return count


def _enter(name: str):
    ctx = torch.profiler.record_function(name)
    ctx.__enter__()
    return ctx


def run_batch(engine, prompts, params) -> float:
    start = time.perf_counter()
    engine.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None) -> int:
    from atom_aot.cli_util import run_cli
    args = parse_args(argv)
    return run_cli(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    from atom_aot import LLMEngine, SamplingParams
    from atom_aot.runtime.profiler import more_from_env, torch_profile
    if args.bs > args.max_num_seqs:
        raise ValueError(f"--bs {args.bs} is more than --max-num-seqs {args.max_num_seqs}: the batch would not "
                         f"run as one; raise --max-num-seqs")
    more = more_from_env()
    engine = LLMEngine(model=args.model, **engine_options(args))
    prompts = make_prompts(engine.tokenizer, args.bs, args.input_length, args.random_input, args.seed)
    params = SamplingParams(temperature=0, max_tokens=args.output_length, ignore_eos=True)
    run_batch(engine, [p[::-1] for p in prompts], params)      # warm-up on other prompts: no prefix-cache hits later
    layers = label_layers(engine.loaded.forwards)
    with torch_profile(more, record_shapes=more) as prof:
        elapsed = run_batch(engine, prompts, params)
    out_dir = Path(args.torch_profiler_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / (f"profile_offline-bs{args.bs}-in{args.input_length}-out{args.output_length}-"
                       f"{engine.loaded.execution}-{time.strftime('%Y%m%d-%H%M%S')}.json.gz")
    prof.export_chrome_trace(str(trace))
    tokens = args.bs * args.output_length
    print(f"{engine.loaded.execution}: bs {args.bs}, {args.input_length} in + {args.output_length} out: "
          f"{elapsed:.2f}s under the profiler ({tokens / elapsed:.1f} output tok/s); "
          f"{layers} layers labelled{', shapes/stacks/memory recorded' if more else ''}")
    print(f"trace: {trace}\nsummary: python scripts/analyze_trace.py {trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
