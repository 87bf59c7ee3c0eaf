"""`python -m atom_aot.entrypoints.graph_probe ARGS_JSON`: the graph-pool probe the build runs in a
child process (atom_aot/build/graphs.py). It loads a staged tree's decode package and weights as
serving does, captures every decode size into one pool with the runtime's CUDA-graph code, then
runs the largest mixed step and the sampler to measure their activation memory (StepMemory), and
prints the resulting GraphPlan as JSON on its last line. A tensor-parallel build probes rank 0's graph
and shapes on the one GPU the build has, with the collectives stood in for (the pool is per rank; the
ranks' graphs are the same)."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from atom_aot.artifact.fields import Reader
from atom_aot.artifact.graph_plan import GraphPlan, StepMemory
from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.artifact.layout import CONFIG, package_member, weights_member
from atom_aot.artifact.phase import Phase
from atom_aot.dtypes import torch_dtype
from atom_aot.models.parallel import Split, rank_shapes


# The mixed step measured: the runtime's default token budget on a GPU (config.py DEFAULT_STEP_TOKENS_GPU). The
# activations scale with the tokens, so the runtime scales the measured bytes per token by its own budget.
MEASURED_STEP_TOKENS = 8192
# What the sampler is measured with: every option that allocates over the whole vocabulary on.
MEASURED_SAMPLING = dict(temperature=0.8, top_p=0.9, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
                         frequency_penalty=0.5, logprobs=20)


def probe(staging: Path, sizes: list[int], block_size: int, kv_cache: KVCacheSpec, max_model_len: int,
          split: Split, draw: dict | None = None) -> GraphPlan:
    """`draw` ({dtype, quant}): the staged weights member holds only what a draw cannot reproduce
    (--load-format dummy-at-load), so rank 0's weights are drawn here as the loader draws them. `kv_cache`: the
    artifact's spec (its layout counts the MTP layers the artifact holds)."""
    import torch
    from safetensors.torch import load_file

    from atom_aot.distributed.collectives import register_stand_in
    from atom_aot.models import ModelConfig
    from atom_aot.runtime.loading.compiled import CompiledModel
    from atom_aot.runtime.execution.cuda_graphs import DecodeGraphs
    from atom_aot.runtime.execution.kv_cache import allocate_kv_cache
    device = torch.device("cuda")
    cfg = rank_shapes(ModelConfig.from_json(staging / CONFIG), split)
    if split.world_size > 1:
        register_stand_in()
    weights = load_file(str(staging / weights_member(0)), device="cuda")
    if draw is not None:
        from safetensors import safe_open

        from atom_aot.runtime.loading.drawn_weights import draw_weights, recorded_draw_order
        with safe_open(str(staging / weights_member(0)), "pt") as stored:
            shapes = recorded_draw_order(stored.metadata() or {})
        weights = draw_weights(staging / Path(CONFIG).parent, torch_dtype(draw["dtype"]), draw["quant"],
                               max_model_len, split, 0, device, weights, shapes)
    decode = CompiledModel(staging / package_member(Phase.DECODE), device).bind(weights)
    mixed = CompiledModel(staging / package_member(Phase.MIXED), device).bind(weights)
    cache = allocate_kv_cache(kv_cache, sizes[-1] + 1, block_size, device)
    del weights                       # bound into the packages: the loader's dict of them is not needed
    torch.cuda.synchronize()
    # Cached free blocks (the load's, the draw's) are given back first: the capture could reuse them (the pool
    # measured too small) or the allocator could release them under memory pressure mid-capture (a GPU shared
    # with another process), making the difference negative (seen on a shared H100).
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    graphs = DecodeGraphs(decode, cache, tuple(sizes), -(-max_model_len // block_size))
    graphs.capture()
    grown = torch.cuda.memory_reserved() - before
    if grown < 0:
        raise RuntimeError(f"the graph pool measured {grown} bytes: this process's reserved GPU memory shrank during "
                           f"the capture (the allocator freed cached memory under pressure: is another process using "
                           f"this GPU?); build on an idle GPU")
    del cache
    note = "pool_bytes: memory reserved by capturing every size into one pool (static inputs included); "
    try:
        step_memory = measure_step_memory(mixed, cfg, block_size, kv_cache, max_model_len, sizes[-1],
                                          device)
        note += "step_memory: peak bytes of the largest mixed step and of the sampler at the largest size"
    except RuntimeError as e:          # out of memory included: the runtime then reserves a bound, and says so
        step_memory = None
        note += f"step_memory not measured: {type(e).__name__}: {str(e)[:300]}"      # the build logs the note
    return GraphPlan(tuple(sizes), grown, note, step_memory)


def prefill_step_inputs(num_tokens: int, seq_len: int, kv_cache, block_size: int, vocab_size: int):
    """StepInputs of num_tokens // seq_len prompts of seq_len tokens each, computed whole in one step (their KV
    in consecutive blocks of `kv_cache` from block 0), each sampling its last token."""
    import torch

    from atom_aot.models.step_inputs import StepInputs, input_dtype
    device = kv_cache.device
    num_seqs, blocks_per_seq = num_tokens // seq_len, -(-seq_len // block_size)

    def ints(name: str, values) -> torch.Tensor:
        return values.to(dtype=input_dtype(name, kv_cache.dtype), device=device)
    seq_index = torch.arange(num_seqs).repeat_interleave(seq_len)
    position = torch.arange(seq_len).repeat(num_seqs)
    starts = torch.arange(num_seqs + 1) * seq_len
    return StepInputs(
        input_ids=ints("input_ids", torch.randint(0, vocab_size, (num_seqs * seq_len,))),
        positions=ints("positions", position), kv_cache=kv_cache,
        slot_mapping=ints("slot_mapping", seq_index * blocks_per_seq * block_size + position),
        block_tables=ints("block_tables", torch.arange(num_seqs * blocks_per_seq).view(num_seqs, blocks_per_seq)),
        seq_lens=ints("seq_lens", torch.full((num_seqs,), seq_len)),
        query_start_loc=ints("query_start_loc", starts), logits_indices=ints("logits_indices", starts[1:] - 1))


def measured_sequences(rows: int, vocab_size: int, block_size: int) -> list:
    """`rows` requests with MEASURED_SAMPLING and a 64-token prompt each (penalties count over it)."""
    import torch

    from atom_aot.runtime.sampling_params import SamplingParams
    from atom_aot.runtime.scheduling.sequence import Sequence
    params = SamplingParams(**MEASURED_SAMPLING)
    return [Sequence(request_id=str(i), token_ids=torch.randint(0, vocab_size, (64,)).tolist(), num_prompt_tokens=64,
                     params=params, block_size=block_size) for i in range(rows)]


def measure_step_memory(mixed, cfg, block_size: int, kv_cache: KVCacheSpec, max_model_len: int, rows: int, device,
                        peak=None) -> StepMemory:
    """Peak bytes allocated by the largest mixed step (MEASURED_STEP_TOKENS tokens in prompts of up to
    max_model_len tokens: one long prompt is the worst case of any attention that is not tiled) and by sampling
    `rows` logits rows with every option (the sampler the runtime builds, masks by the sort, its penalties'
    per-request token counts allocated in the measurement, then logprobs), each above what was allocated before
    it. `peak(run, device)`: peak_allocated (a CUDA device's allocator statistics) unless a test stands in."""
    import torch

    from atom_aot.runtime.execution.kv_cache import allocate_kv_cache
    from atom_aot.runtime.sampling.sampler import Sampler, logprob_tensors
    peak = peak or peak_allocated
    seq_len = min(max_model_len, MEASURED_STEP_TOKENS)
    tokens = MEASURED_STEP_TOKENS // seq_len * seq_len
    cache = allocate_kv_cache(kv_cache, tokens // block_size + tokens // seq_len, block_size, device)
    inputs = prefill_step_inputs(tokens, seq_len, cache, block_size, cfg.vocab_size)
    step_bytes = peak(functools.partial(mixed, inputs), device)
    del inputs, cache
    sampler = Sampler(device)
    seqs = measured_sequences(rows, cfg.vocab_size, block_size)

    def sample():
        logits = torch.randn(rows, cfg.vocab_size, device=device)
        tokens = sampler(logits, seqs)
        return logprob_tensors(logits, tokens, MEASURED_SAMPLING["logprobs"])
    row_bytes = peak(sample, device)
    return StepMemory(-(-step_bytes // tokens), -(-row_bytes // rows), tokens, rows)


def peak_allocated(run, device) -> int:
    """Peak bytes allocated while `run()` runs, above what was allocated before (its outputs included)."""
    import torch
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return peak


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    spec = KVCacheSpec.from_reader(Reader(a["kv_cache"], "the probe's kv_cache"))
    plan = probe(Path(a["staging"]), a["sizes"], a["block_size"], spec, a["max_model_len"], Split(**a["split"]), a["draw"])
    print(plan.to_json(indent=None))
