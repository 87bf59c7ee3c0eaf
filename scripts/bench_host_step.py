"""Host (CPU) cost of a large-batch decode step's own work, without a model or a GPU.

Two measurements, one JSON:
  prepare_inputs     B sequences of I prompt tokens decoding through the real scheduler and block
                     manager (blocks of 16 tokens); the time of `ModelRunner.prepare_inputs` per
                     decode step (a batch of B), sequences growing a block every 16 steps.
  prepare_inputs_async  the same in async-scheduling order: each batch is scheduled before the
                     previous one's tokens are read, so every input token is gathered from the
                     previous step's samples (on the CPU here).
  sampled_step       `ModelRunner.launch` of a decode step of B requests that sample (temperature 0.8, top-p
                     0.95; every fourth with top-k 40, every eighth seeded), around a forward that returns
                     ready logits of a small vocabulary, so the time is the host's: inputs, the sampler's
                     per-row parameters and its calls (on the CPU the tensor work of a 64-entry vocabulary
                     is small).
  output_processing  `OutputProcessor.process` with B requests, one token each per step, from a
                     real tokenizer (default: the Qwen3 one under ../shared) fed with natural text
                     (this repo's docs plus some multi-byte text), no stop strings.

  PYTHONPATH=. python scripts/bench_host_step.py --out host_step.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO.parent / "shared" / "models" / "tokenizers" / "qwen3"
MULTI_BYTE = "Ünïcödé tëxt, 日本語の文章、中文句子, emojis 🙂🚀 and Ελληνικά. "
BLOCK_SIZE = 16
TOKEN = 1000        # what every decode step "samples" in the prepare_inputs measurement


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--warm-steps", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.add_argument("--sections", default="prepare_inputs,prepare_inputs_async,sampled_step,output_processing")
    p.add_argument("--vocab", type=int, default=64, help="sampled_step's vocabulary")
    return p.parse_args(argv)


def summary(seconds: list[float]) -> dict:
    ms = [1e3 * s for s in seconds]
    return {"ms_per_step_median": statistics.median(ms), "ms_per_step_mean": statistics.fmean(ms),
            "ms_per_step_min": min(ms), "steps": len(ms)}


# -- prepare_inputs ---------------------------------------------------------------------------
def decoding_engine(args, params_of=None):
    """A scheduler whose B sequences have their prompts in the cache, and a runner on the CPU (forward: `forward`);
    `params_of(i)`: request i's SamplingParams (greedy by default)."""
    from atom_aot.runtime.scheduling.block_manager import BlockManager
    from atom_aot.runtime.execution.forwards import Forwards
    from atom_aot.runtime.execution.model_runner import ModelRunner
    from atom_aot.runtime.sampling.sampler import Sampler
    from atom_aot.runtime.sampling_params import SamplingParams
    from atom_aot.runtime.scheduling.scheduler import Scheduler, SchedulerConfig
    from atom_aot.runtime.scheduling.sequence import Sequence
    max_len = args.input_len + args.warm_steps + args.steps + 8
    blocks = args.batch * -(-max_len // BLOCK_SIZE)
    config = SchedulerConfig(max_num_seqs=args.batch, max_num_batched_tokens=args.batch * args.input_len,
                             max_model_len=max_len, scheduler_delay_factor=0.0)
    scheduler = Scheduler(config, BlockManager(blocks, BLOCK_SIZE, enable_prefix_caching=False))
    g = torch.Generator().manual_seed(0)
    for i in range(args.batch):
        prompt = torch.randint(100, 30000, (args.input_len,), generator=g).tolist()
        params = params_of(i) if params_of else SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
        scheduler.add(Sequence(str(i), prompt, len(prompt), params, BLOCK_SIZE))
    device = torch.device("cpu")
    kv_cache = torch.zeros(1, 2, 1, BLOCK_SIZE, 1, 1)   # referenced by the inputs, never read here
    runner = ModelRunner(Forwards(lambda inputs: None), kv_cache, BLOCK_SIZE, device, Sampler(device))
    prefill = scheduler.schedule()
    assert prefill.is_prefill and len(prefill.seqs) == args.batch, "every prompt in one prefill batch"
    scheduler.update(prefill, [TOKEN] * args.batch)
    return scheduler, runner


def bench_prepare_inputs(args, async_order: bool = False) -> dict:
    """prepare_inputs per decode step; async_order: each step's results are read one step later and
    its decode tokens come from the previous step's sampled tensor, as with async scheduling."""
    scheduler, runner = decoding_engine(args)
    sampled = torch.full((args.batch,), TOKEN, dtype=torch.int64)
    previous, seconds = None, []
    for step in range(args.warm_steps + args.steps):
        batch = scheduler.schedule()
        assert not batch.is_prefill and len(batch.seqs) == args.batch
        start = time.perf_counter()
        runner.prepare_inputs(batch)
        if step >= args.warm_steps:
            seconds.append(time.perf_counter() - start)
        if not async_order:
            scheduler.update(batch, [TOKEN] * args.batch)
            continue
        runner.inputs.remember_sampled(sampled)      # what launching the step leaves for the next
        if previous is not None:
            scheduler.update(previous, [TOKEN] * args.batch)
        previous = batch
    return {"batch": args.batch, "context": args.input_len, "block_size": BLOCK_SIZE, **summary(seconds)}


def sampled_params(i: int):
    from atom_aot.runtime.sampling_params import SamplingParams
    return SamplingParams(temperature=0.8, top_p=0.95, top_k=40 if i % 4 == 0 else -1, max_tokens=None,
                          ignore_eos=True, seed=i if i % 8 == 0 else None)


def bench_sampled_step(args) -> dict:
    """ModelRunner.launch of B sampling decodes: a forward that hands back ready logits [B, vocab]."""
    scheduler, runner = decoding_engine(args, sampled_params)
    for seq in scheduler.running:
        if seq.params.seed is not None:
            seq.generator = runner.sampler.new_request_generator(seq.params.seed)
    logits = torch.randn(args.batch, args.vocab, generator=torch.Generator().manual_seed(1))
    runner.forwards = type(runner.forwards)(lambda inputs: logits)
    seconds = []
    for step in range(args.warm_steps + args.steps):
        batch = scheduler.schedule()
        start = time.perf_counter()
        launched = runner.launch(batch)
        if step >= args.warm_steps:
            seconds.append(time.perf_counter() - start)
        scheduler.update(batch, runner.complete(launched).sampled)
    return {"batch": args.batch, "vocab": args.vocab, "params": "temperature 0.8, top-p 0.95, 1/4 top-k 40, "
            "1/8 seeded", **summary(seconds)}


# -- output processing ------------------------------------------------------------------------
def text_token_streams(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` streams of `length` token ids, each from its own place in a natural-text corpus."""
    corpus = "\n".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    corpus += MULTI_BYTE * 20
    ids = tokenizer(corpus, add_special_tokens=False).input_ids
    stride = max(1, (len(ids) - length) // count)
    return [(ids * 2)[i * stride:i * stride + length] for i in range(count)]


def bench_output_processing(args) -> dict:
    from atom_aot.runtime.text.output_processor import OutputProcessor
    from atom_aot.runtime.outputs import CoreOutput
    from atom_aot.runtime.sampling_params import SamplingParams
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(args.tokenizer)
    total = args.warm_steps + args.steps
    streams = text_token_streams(tokenizer, args.batch, total)
    processor = OutputProcessor(tokenizer, abort_in_core=lambda request_ids: None)
    params = SamplingParams(max_tokens=total)
    for i, stream in enumerate(streams):
        processor.add_request(str(i), stream[:8], params)
    seconds, chars = [], 0
    for step in range(total):
        outputs = [CoreOutput(str(i), [stream[step]], num_prompt_tokens=8) for i, stream in enumerate(streams)]
        start = time.perf_counter()
        updates = processor.process(outputs)
        if step >= args.warm_steps:
            seconds.append(time.perf_counter() - start)
            chars += sum(len(u.delta_text) for u in updates)
    return {"batch": args.batch, "tokenizer": str(args.tokenizer.name), "chars_per_step": chars / args.steps,
            **summary(seconds)}


def main(argv=None) -> None:
    args = parse_args(argv)
    sections = {"prepare_inputs": bench_prepare_inputs,
                "prepare_inputs_async": lambda a: bench_prepare_inputs(a, async_order=True),
                "sampled_step": bench_sampled_step,
                "output_processing": bench_output_processing}
    result = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    for name in args.sections.split(","):
        result[name] = sections[name](args)
        print(name, json.dumps(result[name]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
