"""`python -m atom_aot.bench.gsm8k`: GSM8K accuracy of a served model, or of transformers on the
same prompts (`--backend hf --hf-model GGUF_OR_FOLDER`), greedy, scored as lm-eval's gsm8k
(see `gsm8k_task`). Both backends send the same prompt text and cut at the same stop strings,
so the two accuracies differ only where the engines' greedy tokens differ.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from atom_aot.bench import gsm8k_task as task

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atom_aot.bench.gsm8k", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="server", choices=("server", "hf"))
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server backend: the server's URL")
    p.add_argument("--model", default=None, help="server backend: the served model name (default: from /v1/models)")
    p.add_argument("--hf-model", default=None, help="hf backend: a GGUF (tokenizer files beside it) or HF folder")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="GSM8K jsonl (question, answer)")
    p.add_argument("--num-shots", type=int, default=8)
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N problems")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16, help="server backend: requests in flight")
    p.add_argument("--output", default=None, help="write the summary and every completion as JSON")
    args = p.parse_args(argv)
    if args.backend == "hf" and not args.hf_model:
        p.error("--backend hf needs --hf-model")
    return args


async def complete_on_server(base_url: str, model: str | None, prompts: list[str], max_tokens: int,
                             concurrency: int) -> list[str]:
    """Greedy completions from /v1/completions, `concurrency` at a time, in prompt order."""
    from atom_aot.bench.request import make_client
    from atom_aot.bench.serving import served_model
    model = model or served_model(base_url)
    limit = asyncio.Semaphore(concurrency)
    async with make_client() as client:
        async def one(prompt: str) -> str:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                    "stop": task.STOP}
            async with limit:
                response = await client.post(f"{base_url.rstrip('/')}/v1/completions", json=body)
            if response.status_code != 200:
                raise RuntimeError(f"the server answered {response.status_code}: {response.text}")
            return response.json()["choices"][0]["text"]
        return await asyncio.gather(*(one(p) for p in prompts))


def complete_with_hf(model_path: str, prompts: list[str], max_tokens: int) -> list[str]:
    """Greedy completions from transformers, one prompt at a time (no padding), same tokenization
    as the server (the tokenizer's default special tokens)."""
    from tqdm import tqdm
    from atom_aot.bench import hf_reference
    model, tokenizer = hf_reference.load_model(model_path), hf_reference.load_tokenizer(model_path)
    completions = []
    for prompt in tqdm(prompts, desc="hf"):
        ids, _ = hf_reference.greedy(model, tokenizer(prompt).input_ids, max_tokens, tokenizer, task.STOP)
        completions.append(task.cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True)))
    return completions


def evaluate(args) -> dict:
    shots, problems = task.split(task.load_problems(args.data), args.num_shots, args.limit)
    prompts = [task.prompt(p, shots) for p in problems]
    start = time.perf_counter()
    if args.backend == "server":
        completions = asyncio.run(complete_on_server(args.base_url, args.model, prompts, args.max_tokens,
                                                     args.concurrency))
        completions = [task.cut_at_stop(c) for c in completions]
    else:
        completions = complete_with_hf(args.hf_model, prompts, args.max_tokens)
    records = [task.score(p, c) for p, c in zip(problems, completions)]
    return {"backend": args.backend, "model": args.model or args.hf_model, "num_shots": args.num_shots,
            "max_tokens": args.max_tokens, "seconds": time.perf_counter() - start, **task.accuracy(records),
            "records": records}


def main(argv=None) -> int:
    args = parse_args(argv)
    result = evaluate(args)
    print(f"gsm8k {args.num_shots}-shot, {result['n']} problems ({args.backend}): "
          f"strict-match {result['strict-match']:.4f}, flexible-extract {result['flexible-extract']:.4f} "
          f"[{result['seconds']:.0f}s]")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
