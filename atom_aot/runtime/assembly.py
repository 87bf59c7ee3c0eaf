"""This process's engine core, assembled from its parts: the artifact loaded (beside the other ranks' meeting),
the KV cache sized and allocated, the forwards (CUDA graphs), the sampler, the speculative proposer, the scheduler
and the grammar pool, wired into an EngineCore; with the startup breakdown `atom-run` prints. Reached only through
the composition root (runtime/launch.py) and the engine process (runtime/processes/engine_process.py)."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, TypeVar

from atom_aot.artifact.reader import Artifact
from atom_aot.distributed.group import RankGroup, join, leave
from atom_aot.errors import StartupError
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.engine.engine_core import EngineCore
from atom_aot.runtime.execution.memory import kv_block_count
from atom_aot.runtime.execution.model_runner import ModelRunner
from atom_aot.runtime.execution.model_setup import prepare_model
from atom_aot.runtime.heap import freeze_startup_heap, space_out_full_collections
from atom_aot.runtime.loading.bytecode import warn_if_torch_uncached
from atom_aot.runtime.loading.compile_counter import TRITON
from atom_aot.runtime.loading.loader import LoadedArtifact, load_artifact
from atom_aot.runtime.parallel.attention_dp import AlignedForwards, Lockstep, attention_dp_place
from atom_aot.runtime.parallel.rank_load import meet_beside_load
from atom_aot.runtime.parallel.tp_lead import LeadRank, start_other_ranks
from atom_aot.runtime.sampling.sampler import Sampler
from atom_aot.runtime.sampling.structured_output import Grammars
from atom_aot.runtime.scheduling.block_manager import BlockManager
from atom_aot.runtime.scheduling.scheduler import Scheduler, SchedulerConfig
from atom_aot.runtime.spec.setup import load_draft, start_speculation, tap_hidden, verify_graph_reserve
from atom_aot.runtime.threads import set_torch_threads

log = logging.getLogger("atom_aot")
T = TypeVar("T")


def start_core(artifact_path, config: RuntimeConfig,
               beside: Callable[[], None] | None = None) -> tuple[LoadedArtifact, EngineCore]:
    """This process's engine core: rank 0 leading the other tensor-parallel ranks (if any), or one rank of a
    data-parallel-attention artifact stepping with the others (runtime/parallel/attention_dp.py). Over several ranks,
    this rank's weights load while the ranks meet (runtime/parallel/rank_load.py).

    `beside`: work for a thread beside the load (the offline engine's tokenizer), started once the ranks this
    process forks are forked: a thread running before then makes them new interpreters (runtime/parallel/rank_processes.py),
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

    def load_then_assemble() -> tuple[LoadedArtifact, EngineCore]:
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
        started = alongside(beside, load_then_assemble)
    except BaseException:
        for group in met:
            release(group)
        raise
    freeze_startup_heap()
    space_out_full_collections()
    return started


def start_engine_core(loaded: LoadedArtifact, config: RuntimeConfig, ranks: LeadRank | None = None,
                      dp_group: RankGroup | None = None) -> EngineCore:
    """`ranks`: rank 0's link to the other tensor-parallel ranks (None: the model has one rank);
    `dp_group`: this engine is one rank of a data-parallel-attention artifact (runtime/parallel/attention_dp.py)."""
    max_model_len = config.served_max_model_len(loaded.max_model_len)
    if dp_group is not None and config.method == "draft":
        raise StartupError("--method draft is not supported with data-parallel attention yet (each rank would load "
                           "the draft model on its own device; not built): use --method mtp or --method ngram")
    draft = load_draft(loaded, config, max_model_len)
    num_blocks = kv_block_count(loaded, config, draft, verify_graph_reserve(loaded, config))
    if ranks is not None:
        num_blocks = ranks.agree_num_blocks(num_blocks)
    kv_cache, forwards = prepare_model(loaded, config, num_blocks)
    forwards, tap = tap_hidden(loaded, config, forwards)
    peers_mtp, lockstep = None, None
    if ranks is not None:
        forwards, peers_mtp = ranks.lead(forwards), ranks.leading_mtp
    if dp_group is not None:
        forwards = AlignedForwards(forwards, dp_group, kv_cache)
        lockstep = Lockstep(forwards)
        peers_mtp = partial(lockstep.align_mtp, hidden_size=loaded.model_config.hidden_size, dtype=loaded.dtype,
                            calls_per_step=config.num_speculative_tokens)
        log.info("data-parallel attention: rank %d of %d, stepping with the others", dp_group.rank,
                 dp_group.world_size)
    sampler = Sampler.for_artifact(loaded.forwards, loaded.device, config.seed)
    runner = ModelRunner(forwards, kv_cache, loaded.block_size, loaded.device, sampler)
    speculation = start_speculation(loaded, config, runner, max_model_len, num_blocks, config.max_num_seqs, draft,
                                    tap, peers_mtp)
    scheduler = Scheduler(
        SchedulerConfig.from_runtime(config, max_model_len, speculation.shape if speculation else None),
        BlockManager(num_blocks, loaded.block_size, config.enable_prefix_caching))
    eos = eos_token_ids(loaded)
    grammars = Grammars(loaded.tokenizer_dir, loaded.model_config.vocab_size, eos, config.grammar_compile_timeout,
                        config.grammar_compile_workers)
    on_close = ranks.close if ranks is not None else lockstep.close if lockstep is not None else lambda: None
    if speculation is None:
        return EngineCore(scheduler, runner, eos, loaded.block_size, config.async_scheduling, grammars, on_close,
                          lockstep=lockstep, vocab_size=loaded.model_config.vocab_size)
    return EngineCore(scheduler, speculation.runner, eos, loaded.block_size, grammars=grammars, on_close=on_close,
                      spec_counters=speculation.runner.counters, lockstep=lockstep,
                      vocab_size=loaded.model_config.vocab_size)


def eos_token_ids(loaded: LoadedArtifact) -> frozenset[int]:
    eos = loaded.generation_config.get("eos_token_id")
    if eos is None:
        eos = loaded.hf_config.get("eos_token_id")
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


def alongside(beside: Callable[[], None] | None, work: Callable[[], T]) -> T:
    """work(), with `beside` running in a thread next to it (its error, if any, raised after)."""
    with ThreadPoolExecutor(1, thread_name_prefix="atom-beside") as pool:
        aside = pool.submit(beside) if beside is not None else None
        result = work()
        if aside is not None:
            aside.result()
    return result
