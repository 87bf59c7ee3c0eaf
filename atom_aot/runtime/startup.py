"""From an artifact path to a running EngineCore, with the startup breakdown `atom-run` prints."""
from __future__ import annotations

import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, TypeVar

import torch

from atom_aot.artifact.graph_plan import StepMemory
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.distributed.group import RankGroup, join, leave
from atom_aot.errors import StartupError
from atom_aot.runtime.parallel.attention_dp import AlignedForwards, Lockstep, attention_dp_place
from atom_aot.runtime.engine.block_manager import BlockManager
from atom_aot.runtime.loading.bytecode import warn_if_torch_uncached
from atom_aot.runtime.loading.compile_counter import TRITON
from atom_aot.runtime.config import DEFAULT_CPU_KV_BYTES, RuntimeConfig, max_scored_prompt_rows
from atom_aot.runtime.engine.engine_core import EngineCore
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.execution.kv_cache import allocate_kv_cache, bytes_per_block
from atom_aot.runtime.loading.loader import LoadedArtifact, load_artifact
from atom_aot.runtime.execution.model_runner import ModelRunner
from atom_aot.runtime.parallel.rank_load import meet_beside_load
from atom_aot.runtime.sampling.sampler import Sampler
from atom_aot.runtime.engine.scheduler import Scheduler, SchedulerConfig
from atom_aot.runtime.sampling.structured_output import Grammars
from atom_aot.runtime.parallel.tp_lead import LeadRank, start_other_ranks
from atom_aot.runtime.threads import set_torch_threads
from atom_aot.runtime.execution.verify_graphs import MAX_GRAPH_TOKENS, verify_capture_sizes
from atom_aot.runtime.spec.setup import draft_kv_blocks, load_draft, no_verify_graphs_reason, start_speculation

log = logging.getLogger("atom_aot")
T = TypeVar("T")


def eos_token_ids(loaded: LoadedArtifact) -> frozenset[int]:
    eos = loaded.generation_config.get("eos_token_id")
    if eos is None:
        eos = loaded.hf_config.get("eos_token_id")
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


def kv_block_count(loaded: LoadedArtifact, config: RuntimeConfig, draft: LoadedArtifact | None = None) -> int:
    """The target's KV blocks. On a GPU the memory share left after the weights (a --method draft model's
    included: it is loaded by then) and the reserves holds the target's pool and, with `draft`, the draft's
    pool of as many tokens (split_kv_budget). On the CPU kv_cache_memory_bytes is the target's pool."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = bytes_per_block(loaded.rank_config, loaded.block_size, loaded.kv_dtype)
    if loaded.device.type == "cpu":
        budget = config.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES
        return max(0, budget // per_block)
    # Blocks the allocator caches from the load's temporaries are free for the KV cache too: 2.6 GiB of Llama-3.1-8B's
    # load, which counted as in use shortened its pool by 1,381 blocks.
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(loaded.device)
    used = total - free
    graph_pool = loaded.graph_plan.pool_bytes if uses_graphs(loaded, config) else 0
    activations, verify_graphs = activation_reserve(loaded, config), verify_graph_reserve(loaded, config)
    budget = int(total * config.gpu_memory_utilization) - used - activations - graph_pool - verify_graphs
    log.info("KV budget: %.2f GiB = %.2f share of %.2f GiB - %.2f in use - %.2f activations (%s) - %.2f graphs%s",
             max(budget, 0) / 2**30, config.gpu_memory_utilization, total / 2**30, used / 2**30, activations / 2**30,
             "measured at build" if loaded.graph_plan.step_memory else "a bound: the artifact has no measurement",
             graph_pool / 2**30, f" - {verify_graphs / 2**30:.2f} verify graphs" if verify_graphs else "")
    if draft is None:
        return max(0, budget // per_block)
    draft_per_block = bytes_per_block(draft.rank_config, draft.block_size, draft.kv_dtype)
    return split_kv_budget(budget, per_block, loaded.block_size, draft_per_block, draft.block_size,
                           config.max_num_seqs)


def split_kv_budget(budget: int, per_block: int, block_size: int, draft_per_block: int, draft_block_size: int,
                    max_num_seqs: int) -> int:
    """The most target blocks n such that n blocks plus the draft pool for n * block_size tokens
    (runtime/spec/setup.py draft_kv_blocks) fit in `budget` bytes."""
    def total(n: int) -> int:
        return n * per_block + draft_kv_blocks(draft_block_size, n * block_size, max_num_seqs) * draft_per_block
    n = max(0, (budget - max_num_seqs * draft_per_block) // (per_block + block_size * draft_per_block // draft_block_size))
    while n > 0 and total(n) > budget:
        n -= 1
    return n


def verify_graph_reserve(loaded: LoadedArtifact, config: RuntimeConfig) -> int:
    """Bytes the speculative CUDA graphs' pools keep, each bounded like activation_reserve's at its largest
    token count: the mixed package's verify graphs (runtime/execution/verify_graphs.py) and the MTP step's
    (runtime/spec/mtp_graphs.py), where they are captured; 0 without them."""
    if config.method is None or not uses_graphs(loaded, config):
        return 0
    mtp = max(loaded.graph_plan.capture_sizes) * widest_row_bytes(loaded) if config.method == "mtp" else 0
    sizes = verify_capture_sizes(loaded.graph_plan.capture_sizes, config.num_speculative_tokens)
    if no_verify_graphs_reason(loaded, config, sizes) is not None:     # the same decision start_speculation makes
        return mtp
    return MAX_GRAPH_TOKENS * widest_row_bytes(loaded) + mtp


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


def uses_graphs(loaded: LoadedArtifact, config: RuntimeConfig) -> bool:
    return (loaded.device.type == "cuda" and Phase.DECODE in loaded.forwards and not config.enforce_eager
            and bool(loaded.graph_plan.capture_sizes))


def make_forwards(loaded: LoadedArtifact, config: RuntimeConfig, kv_cache, max_model_len: int) -> Forwards:
    """The mixed forward, and the decode package replayed as CUDA graphs (captured here) or as it is."""
    mixed, decode = loaded.forwards[Phase.MIXED], loaded.forwards.get(Phase.DECODE)
    if not uses_graphs(loaded, config):
        log.info("decode steps: %s", "the decode package" if decode is not None else "the same path as prefill")
        return Forwards(mixed, decode)
    from atom_aot.runtime.execution.cuda_graphs import DecodeGraphs
    start = time.perf_counter()
    # a package that also returns the hidden states (MTP layers) keeps them in its graphs, for MTP's verify rows
    forward = decode.logits_and_hidden if getattr(decode, "returns_hidden", False) else decode
    graphs = DecodeGraphs(forward, kv_cache, loaded.graph_plan.capture_sizes, -(-max_model_len // loaded.block_size))
    graphs.capture()
    loaded.timings["graph capture"] = time.perf_counter() - start
    log.info("decode steps: CUDA graphs of the decode package, %d sizes up to %d captured in %.2fs",
             len(graphs.sizes), graphs.max_batch_size, loaded.timings["graph capture"])
    return Forwards(mixed, graphs, decode_max_seqs=graphs.max_batch_size)


def prepare_model(loaded: LoadedArtifact, config: RuntimeConfig, num_blocks: int) -> tuple[torch.Tensor, Forwards]:
    """This rank's KV cache and forwards (every tensor-parallel rank runs this, rank 0 and the others alike)."""
    max_model_len = config.served_max_model_len(loaded.max_model_len)
    blocks_per_seq = -(-max_model_len // loaded.block_size)
    if num_blocks < blocks_per_seq:
        raise StartupError(
            f"the KV cache holds {num_blocks} blocks of {loaded.block_size} tokens, fewer than the "
            f"{blocks_per_seq} that one sequence of max_model_len={max_model_len} needs. Give the cache more "
            f"memory (kv_cache_memory_bytes / gpu_memory_utilization) or lower max_model_len.")
    kv_cache = allocate_kv_cache(loaded.rank_config, num_blocks, loaded.block_size, loaded.kv_dtype, loaded.device)
    log.info("KV cache: %d blocks x %d tokens (%.1f MiB, %s)", num_blocks, loaded.block_size,
             kv_cache.numel() * kv_cache.element_size() / 2**20, str(loaded.kv_dtype).removeprefix("torch."))
    return kv_cache, make_forwards(loaded, config, kv_cache, max_model_len)


def start_engine_core(loaded: LoadedArtifact, config: RuntimeConfig, ranks: LeadRank | None = None,
                      dp_group: RankGroup | None = None) -> EngineCore:
    """`ranks`: rank 0's link to the other tensor-parallel ranks (None: the model has one rank);
    `dp_group`: this engine is one rank of a data-parallel-attention artifact (runtime/parallel/attention_dp.py)."""
    max_model_len = config.served_max_model_len(loaded.max_model_len)
    if dp_group is not None and config.method is not None:
        raise StartupError(f"speculative decoding (--method {config.method}) is not supported with data-parallel "
                           f"attention yet (every rank's verify steps would have to agree): serve without --method")
    draft = load_draft(loaded, config, max_model_len)
    num_blocks = kv_block_count(loaded, config, draft)
    if ranks is not None:
        num_blocks = ranks.agree_num_blocks(num_blocks)
    kv_cache, forwards = prepare_model(loaded, config, num_blocks)
    if ranks is not None:
        forwards = ranks.lead(forwards)
    lockstep = None
    if dp_group is not None:
        forwards = AlignedForwards(forwards, dp_group, kv_cache)
        lockstep = Lockstep(forwards)
        log.info("data-parallel attention: rank %d of %d, stepping with the others", dp_group.rank,
                 dp_group.world_size)
    sampler = Sampler.for_artifact(loaded.forwards, loaded.device, config.seed)
    runner = ModelRunner(forwards, kv_cache, loaded.block_size, loaded.device, sampler)
    speculation = start_speculation(loaded, config, runner, max_model_len, num_blocks, config.max_num_seqs, draft)
    scheduler = Scheduler(
        SchedulerConfig.from_runtime(config, max_model_len),
        BlockManager(num_blocks, loaded.block_size, config.enable_prefix_caching),
        proposer=speculation.proposer if speculation else None)
    eos = eos_token_ids(loaded)
    grammars = Grammars(loaded.tokenizer_dir, loaded.model_config.vocab_size, eos, config.grammar_compile_timeout,
                        config.grammar_compile_workers)
    on_close = ranks.close if ranks is not None else lockstep.close if lockstep is not None else lambda: None
    if speculation is None:
        return EngineCore(scheduler, runner, eos, loaded.block_size, config.async_scheduling, grammars, on_close,
                          lockstep=lockstep, vocab_size=loaded.model_config.vocab_size)
    return EngineCore(scheduler, speculation.runner, eos, loaded.block_size, grammars=grammars, on_close=on_close,
                      spec_counters=speculation.runner.counters, vocab_size=loaded.model_config.vocab_size)


def load_and_start(artifact_path, config: RuntimeConfig,
                   beside: Callable[[], None] | None = None) -> tuple[LoadedArtifact, EngineCore]:
    """This process's engine core: rank 0 leading the other tensor-parallel ranks (if any), or one rank of a
    data-parallel-attention artifact stepping with the others (runtime/parallel/attention_dp.py). Over several ranks,
    this rank's weights load while the ranks meet (runtime/parallel/rank_load.py).

    `beside`: work for a thread beside the load (the offline engine's tokenizer), started once the ranks this
    process forks are forked: a thread running before then makes them new interpreters (rank_processes.py),
    seconds slower to start (every -tp 2 start measured on GPUs was)."""
    TRITON.install()       # every load counts Triton JIT compilations (the runtime must do none)
    warn_if_torch_uncached()
    set_torch_threads(config.num_threads)
    artifact = Artifact.open(artifact_path, config.trusted_keys)     # origin first: nothing starts for a refused one
    config = config.for_target(artifact.manifest.target.arch)    # the target's step budget unless one was asked for
    starting = time.perf_counter()
    if artifact.manifest.layout.attention_data_parallel:
        place, device = attention_dp_place(artifact)
        rank, meet, link, release = place.rank, partial(join, place, device), "dp_group", lambda group: leave()
        start_timings = {}
    else:
        ranks = start_other_ranks(artifact, config)     # started (forked, spawned or placed elsewhere), not met
        rank, link, release = 0, "ranks", LeadRank.abort
        meet, device = (ranks.join, ranks.device) if ranks is not None else (None, None)
        start_timings = ranks.timings if ranks is not None else {}
    load = partial(load_artifact, artifact_path, enforce_eager=config.enforce_eager, rank=rank,
                   trusted_keys=config.trusted_keys)
    met = []                                            # what to release if the start fails after the meet

    def load_and_start_core() -> tuple[LoadedArtifact, EngineCore]:
        if meet is None:
            loaded, links = load(), {}
        else:
            before = time.perf_counter() - starting     # the ranks' start (fork or spawn)
            ready = meet_beside_load(meet, load, device, release)
            met.append(ready.met)
            loaded, links = ready.loaded, {link: ready.met}
            loaded.timings = {"ranks start + join": before + ready.join_s, **start_timings, **ready.met.join_timings,
                              "join + load (wall)": ready.wall_s, **loaded.timings}
        start = time.perf_counter()
        core = start_engine_core(loaded, config, **links)
        loaded.timings["kv cache"] = time.perf_counter() - start - loaded.timings.get("graph capture", 0.0)
        return loaded, core
    try:
        started = alongside(beside, load_and_start_core)
    except BaseException:
        for group in met:
            release(group)
        raise
    freeze_startup_heap()
    space_out_full_collections()
    return started


def freeze_startup_heap() -> None:
    """Move every object the start made out of the cyclic collector's view (gc.freeze), as vLLM does: the
    collections of the oldest generation that the step loop's garbage triggers then scan only what was made since.
    Tracing Llama-3.1-8B's throughput run on an H100 found 0.20 s of such pauses in 18.8 s, 0.06 s
    with the heap frozen. Without a collection first (a full one took ~0.1 s on this repo's 2-core CPU machine with
    the engine's modules imported, and would sit on the first token's path): what the start left in reference
    cycles stays until the engine closes (release_device_memory unfreezes)."""
    gc.freeze()
    log.debug("startup heap frozen: %d objects", gc.get_freeze_count())


PYTHON_FULL_COLLECTION_AFTER = 10   # Python's default: a full collection after this many generation-1 ones
FULL_COLLECTION_AFTER = 1000        # the engine's: 100x rarer


class _FullCollections:
    """The collector's thresholds before this process's first running engine spaced them out, and how many engines
    run (the last one's close puts them back)."""
    before: tuple[int, int, int] | None = None
    engines = 0


def space_out_full_collections() -> None:
    """Make Python's full (generation-2) collections 100x rarer while the engine runs: each walks every object made
    since the start and stalls the step loop, and the device idles once the one step queued ahead has run.
    Llama-3.1-8B FP8, 1000 prompts x 1000 in / 1000 out on an H100 (scripts/trace_run.py): 25 full
    collections of 46 ms each (1.15 s of 83.7 s), the run 0.76 s shorter with the collector off (12,064 against
    11,955 tok/s; through sbs.py 12,067 against 11,795-11,877); with this setting, a 2-layer cut of that model on an
    H100 ran no full collection instead of 22 (62,336 against 54,757 tok/s). Young collections (0.15-0.4 ms) run
    while the device computes, and stay. Cyclic garbage that reached the oldest generation waits longer (non-cyclic garbage
    is freed by reference counting, collector or not). A threshold the process set itself (not Python's default)
    is kept."""
    if _FullCollections.engines == 0:
        young, middle, full = gc.get_threshold()
        if full == PYTHON_FULL_COLLECTION_AFTER:
            _FullCollections.before = (young, middle, full)
            gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
            log.debug("python gc: full collections after %d generation-1 ones (Python's default %d)",
                      FULL_COLLECTION_AFTER, PYTHON_FULL_COLLECTION_AFTER)
        else:
            log.info("python gc: full collections after %d generation-1 ones, as this process set them (kept)", full)
    _FullCollections.engines += 1


def restore_full_collections() -> None:
    """An engine closed: the last one puts back the thresholds the first one changed."""
    _FullCollections.engines = max(_FullCollections.engines - 1, 0)
    if _FullCollections.engines == 0 and _FullCollections.before is not None:
        gc.set_threshold(*_FullCollections.before)
        _FullCollections.before = None


def alongside(beside: Callable[[], None] | None, work: Callable[[], T]) -> T:
    """work(), with `beside` running in a thread next to it (its error, if any, raised after)."""
    with ThreadPoolExecutor(1, thread_name_prefix="atom-beside") as pool:
        aside = pool.submit(beside) if beside is not None else None
        result = work()
        if aside is not None:
            aside.result()
    return result
