"""`python -m atom_aot.examples.simple_inference [--model PATH] [engine flags]`: a few chat prompts
through the offline API, their answers, and the throughput.

`--model` may be an artifact, a HF folder or a GGUF (built into the artifact cache on first use, with
the build flags given: `--kv_cache_dtype fp8 -tp 2`, ...); without it, the embedded default model
(SmolLM2-135M-Instruct) is used. The engine flags are ATOM's EngineArgs' and ours
(atom_aot/entrypoints/engine_args.py): runtime options (`--enforce-eager`, `--max-model-len`, ...)
and ATOM's spellings (`--level 0`, `--cudagraph-capture-sizes "[1,2,4]"`, `--load_dummy`). The defaults are ATOM's
example's: its four prompts (one in Chinese), temperature 0.6, thinking on in the chat template
(Qwen3's reads `enable_thinking`; others ignore it). With --torch-profiler-dir (or
ATOM_TORCH_PROFILER_DIR) the generation runs under the torch profiler, as in ATOM's example.
"""
from __future__ import annotations

import argparse
import sys
import time

from atom_aot.entrypoints.engine_args import add_engine_arguments, engine_options

PROMPTS = ["introduce yourself", "list all prime numbers within 100", "1+2+3=?", "如何在一个月内增肌10公斤"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atom_aot.examples.simple_inference",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="artifact, HF folder or GGUF (default: the embedded model)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=True,
                   help="passed to the chat template as enable_thinking (default: on, as in ATOM)")
    p.add_argument("--torch-profiler-dir", default=None, help="profile the generation; gzipped traces under "
                   "DIR/rank_<r>/, one per tensor-parallel rank (default: $ATOM_TORCH_PROFILER_DIR, else no "
                   "profiling)")
    p.add_argument("prompts", nargs="*", help="prompts to send instead of the built-in ones")
    add_engine_arguments(p)
    return p.parse_args(argv)


def chat_prompts(engine, questions: list[str], enable_thinking: bool) -> list[str]:
    return [engine.apply_chat_template([{"role": "user", "content": q}], enable_thinking=enable_thinking)
            for q in questions]


def main(argv=None) -> int:
    from atom_aot.cli_util import run_cli
    args = parse_args(argv)
    return run_cli(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(model=args.model, torch_profiler_dir=args.torch_profiler_dir, **engine_options(args))
    questions = args.prompts or PROMPTS
    prompts = chat_prompts(engine, questions, args.enable_thinking)
    profiling = engine.profiler.enabled
    if profiling:
        engine.start_profile()
    start = time.perf_counter()
    outputs = engine.generate(prompts, SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens))
    elapsed = time.perf_counter() - start
    if profiling:
        print(f"trace: {engine.stop_profile()}")
    for question, out in zip(questions, outputs):
        print(f"--- {question}\n{out['text']}\n")
    tokens = sum(out["num_tokens_output"] for out in outputs)
    print(f"{len(outputs)} prompts, {tokens} tokens in {elapsed:.2f}s: {tokens / elapsed:.1f} tok/s "
          f"({engine.loaded.execution})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
