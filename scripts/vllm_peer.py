"""vLLM on the workloads of scripts/bench_gpu.py, in a process of its own (the `vllm` section there).

Run by bench_gpu.py, not by hand: each engine gets the GPU alone (vLLM's CUDA initialisation and
memory profiling must not meet a live atom-aot engine in the same process), and vLLM's imports stay
out of ours. The prompts are bench_gpu.random_prompts with the same seeds, so both engines see the
same token ids. Measured here, the way ../shared/tools/vllm-peer/sbs.py measures both engines:
  throughput  N prompts x I tokens, O new tokens each (greedy, ignore_eos), one generate call
  tpot        batch 1, the tpot section's 128-token prompt: (t(1 + D tokens) - t(1 token)) / D, median of 3

  python scripts/vllm_peer.py --model-dir DIR --out FILE.json [--engine-kwargs JSON] ...
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

MEMORY_SHARE = 0.85      # sbs.py's, for both engines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--engine-kwargs", default="{}", help='extra vllm.LLM arguments, e.g. {"quantization": "fp8"}')
    return p.parse_args(argv)


def sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Peer:
    """vllm.LLM with sbs.py's settings, generating from token ids."""

    def __init__(self, args):
        from vllm import LLM, SamplingParams
        self.sampling = SamplingParams
        self.llm = LLM(model=str(args.model_dir), max_model_len=args.max_model_len, gpu_memory_utilization=MEMORY_SHARE,
                       max_num_seqs=256, seed=0, **json.loads(args.engine_kwargs))

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        from vllm.inputs import TokensPrompt
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                 self.sampling(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)


def tpot(peer: Peer, prompt: list[int], decode_tokens: int) -> dict:
    peer.generate([prompt], decode_tokens + 1)
    runs = []
    for _ in range(3):
        sync(); start = time.perf_counter(); peer.generate([prompt], 1); sync(); one = time.perf_counter() - start
        start = time.perf_counter(); n = peer.generate([prompt], decode_tokens + 1); sync()
        full = time.perf_counter() - start
        if n != decode_tokens + 1:
            raise RuntimeError(f"vLLM generated {n} tokens, not {decode_tokens + 1} (ignore_eos was set)")
        runs.append((full - one) / decode_tokens)
    return {"tpot_s": sorted(runs)[1], "runs": runs, "method": "(t(1 + D tokens) - t(1 token)) / D, median of 3"}


def throughput(peer: Peer, prompts: list[list[int]], output_len: int) -> dict:
    peer.generate(prompts[:4], 8)
    sync(); start = time.perf_counter()
    out_tokens = peer.generate(prompts, output_len)
    sync(); elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "output_tokens": out_tokens, "output_tok_s": out_tokens / elapsed,
            "total_tok_s": (out_tokens + len(prompts) * len(prompts[0])) / elapsed}


def main(argv=None) -> None:
    from bench_gpu import random_prompts
    args = parse_args(argv)
    import vllm
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    start = time.perf_counter()
    peer = Peer(args)
    result = {"vllm": vllm.__version__, "engine_kwargs": json.loads(args.engine_kwargs),
              "init_s": time.perf_counter() - start,
              "tpot": tpot(peer, random_prompts(1, 128, vocab, seed=3)[0], args.decode_tokens),
              "throughput": throughput(peer, random_prompts(args.num_prompts, args.input_len, vocab, seed=4),
                                       args.output_len)}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
