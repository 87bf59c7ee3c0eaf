"""How many KV blocks an engine's memory holds: the GPU's share left after the weights, the activations of the
largest step (as measured at build), the CUDA-graph pools, and a draft model's pool beside the target's."""
from __future__ import annotations

import logging

import torch

from atom_aot.artifact.graph_plan import StepMemory
from atom_aot.artifact.phase import Phase
from atom_aot.runtime.config import DEFAULT_CPU_KV_BYTES, RuntimeConfig, max_scored_prompt_rows
from atom_aot.runtime.loading.loader import LoadedArtifact

log = logging.getLogger("atom_aot")


def kv_block_count(loaded: LoadedArtifact, config: RuntimeConfig, draft: LoadedArtifact | None = None,
                   verify_graphs: int = 0) -> int:
    """The target's KV blocks. On a GPU the memory share left after the weights (a --method draft model's
    included: it is loaded by then) and the reserves holds the target's pool and, with `draft`, the draft's
    pool of as many tokens (split_kv_budget). `verify_graphs`: the bytes speculative decoding's CUDA graphs
    keep (runtime/spec/setup.py verify_graph_reserve). On the CPU kv_cache_memory_bytes is the target's pool."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = loaded.kv_cache.bytes_per_block(loaded.block_size)
    if loaded.device.type == "cpu":
        budget = config.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES
        return max(0, budget // per_block)
    # Blocks the allocator caches from the load's temporaries are free for the KV cache too: 2.6 GiB of Llama-3.1-8B's
    # load, which counted as in use shortened its pool by 1,381 blocks.
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(loaded.device)
    used = total - free
    graph_pool = loaded.graph_plan.pool_bytes if uses_graphs(loaded, config) else 0
    activations = activation_reserve(loaded, config)
    budget = int(total * config.gpu_memory_utilization) - used - activations - graph_pool - verify_graphs
    log.info("KV budget: %.2f GiB = %.2f share of %.2f GiB - %.2f in use - %.2f activations (%s) - %.2f graphs%s",
             max(budget, 0) / 2**30, config.gpu_memory_utilization, total / 2**30, used / 2**30, activations / 2**30,
             "measured at build" if loaded.graph_plan.step_memory else "a bound: the artifact has no measurement",
             graph_pool / 2**30, f" - {verify_graphs / 2**30:.2f} verify graphs" if verify_graphs else "")
    if draft is None:
        return max(0, budget // per_block)
    draft_per_block = draft.kv_cache.bytes_per_block(draft.block_size)
    return split_kv_budget(budget, per_block, loaded.block_size, draft_per_block, draft.block_size,
                           config.max_num_seqs)


def split_kv_budget(budget: int, per_block: int, block_size: int, draft_per_block: int, draft_block_size: int,
                    max_num_seqs: int) -> int:
    """The most target blocks n such that n blocks plus the draft pool for n * block_size tokens
    (draft_kv_blocks) fit in `budget` bytes."""
    def total(n: int) -> int:
        return n * per_block + draft_kv_blocks(draft_block_size, n * block_size, max_num_seqs) * draft_per_block
    n = max(0, (budget - max_num_seqs * draft_per_block) // (per_block + block_size * draft_per_block // draft_block_size))
    while n > 0 and total(n) > budget:
        n -= 1
    return n


RESERVE_SLACK_BYTES = 256 << 20     # beside the activations: the allocator's rounding, small tensors of a step


def activation_reserve(loaded: LoadedArtifact, config: RuntimeConfig) -> int:
    """Bytes kept free for the activations of the largest step outside the decode graphs: as measured at build
    (graphs.json step_memory) where the artifact has it, else activation_bound."""
    measured = loaded.graph_plan.step_memory
    if measured is None:
        return activation_bound(loaded, config)
    return measured_reserve(measured, config, loaded.model_config.vocab_size)


def measured_reserve(measured: StepMemory, config: RuntimeConfig, vocab_size: int) -> int:
    """The larger of the mixed forward's bytes per token times this engine's token budget and the sampler's bytes
    per row times the rows a step samples (the sampler runs once the forward's buffers are freed, in the same pool),
    and the float32 logits of the prompt positions a step may score (the scheduler's cap), which live through both."""
    return (max(config.max_num_batched_tokens * measured.bytes_per_token,
                sampled_rows(config) * measured.bytes_per_logits_row)
            + max_scored_prompt_rows(config.max_num_seqs) * vocab_size * 4 + RESERVE_SLACK_BYTES)


def sampled_rows(config: RuntimeConfig) -> int:
    """Logits rows one step samples at most: a row per sequence, or with speculative decoding a row per sequence
    and draft token (a verify step scores each draft against the target's distribution)."""
    return config.max_num_seqs * (1 + (config.num_speculative_tokens or 0))


def activation_bound(loaded: LoadedArtifact, config: RuntimeConfig) -> int:
    """Without a measurement (an artifact built before step_memory, or without graphs): every token of the
    largest step as wide as its widest float32 row, the vocabulary's included."""
    return config.max_num_batched_tokens * widest_row_bytes(loaded) + RESERVE_SLACK_BYTES


def widest_row_bytes(loaded: LoadedArtifact) -> int:
    """float32 bytes of one token's widest activation row (the logits, or the MLP's inner row)."""
    cfg = loaded.model_config
    return max(cfg.hidden_size * 4, cfg.intermediate_size * 3, cfg.vocab_size) * 4


def draft_kv_blocks(draft_block_size: int, target_tokens: int, max_num_seqs: int) -> int:
    """Blocks of a draft pool that holds every token the target's does (plus one block per sequence
    for a different block size's rounding)."""
    return -(-target_tokens // draft_block_size) + max_num_seqs


def uses_graphs(loaded: LoadedArtifact, config: RuntimeConfig) -> bool:
    return (loaded.device.type == "cuda" and Phase.DECODE in loaded.forwards and not config.enforce_eager
            and bool(loaded.graph_plan.capture_sizes))
