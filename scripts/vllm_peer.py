"""vLLM on the workloads of scripts/bench_gpu.py, in a process of its own (the `vllm` section there).

Run by bench_gpu.py, not by hand: each engine gets the GPU alone (vLLM's CUDA initialisation and
memory profiling must not meet a live atom-aot engine in the same process), and vLLM's imports stay
out of ours. The prompts are bench_gpu.random_prompts with the same seeds, so both engines see the
same token ids. The measuring code is the GPU benchmark runner's (atom_aot/bench/gpu/measure.py, which
`python -m atom_aot.bench.gpu` runs for both engines):
  throughput  N prompts x I tokens, O new tokens each (greedy, ignore_eos), one generate call
  tpot        batch 1, the tpot section's 128-token prompt: (t(1 + D tokens) - t(1 token)) / D, median of 3

  python scripts/vllm_peer.py --model-dir DIR --out FILE.json [--engine-kwargs JSON] ...
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from atom_aot.bench.gpu.measure import GREEDY, VLLM, throughput, tpot


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


def main(argv=None) -> None:
    from bench_gpu import random_prompts
    args = parse_args(argv)
    import vllm
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    start = time.perf_counter()
    peer = VLLM(str(args.model_dir), args.max_model_len, **json.loads(args.engine_kwargs))
    result = {"vllm": vllm.__version__, "engine_kwargs": json.loads(args.engine_kwargs),
              "init_s": time.perf_counter() - start,
              "tpot": tpot(peer, random_prompts(1, 128, vocab, seed=3), args.decode_tokens),
              "throughput": throughput(peer, random_prompts(args.num_prompts, args.input_len, vocab, seed=4),
                                       args.output_len, GREEDY)}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
