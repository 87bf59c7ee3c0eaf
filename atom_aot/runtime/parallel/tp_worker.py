"""Ranks 1..N-1 of a tensor-parallel engine (`atom-run ART worker`): load this rank's weights while meeting
the others (runtime/parallel/rank_load.py), then run whatever forward rank 0 sends, until it says stop or goes away.
Rank 0 also starts and stops this rank's profiler with its own (runtime/profiler.py).

Placed by torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK), set by
rank 0 for the ranks it starts on its machine or by hand / torchrun on other nodes.
"""
from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

import torch

import torch.distributed as dist

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.distributed.group import RankPlace, agree_min, join, leave, rank_device
from atom_aot.errors import RankFailure
from atom_aot.logging_setup import seconds_listed
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.execution.memory import kv_block_count
from atom_aot.runtime.execution.model_setup import prepare_model
from atom_aot.runtime.loading.loader import LoadedArtifact, load_artifact
from atom_aot.runtime.parallel.rank_load import meet_beside_load
from atom_aot.runtime.parallel.step_broadcast import ProfileCommand, StepReceiver
from atom_aot.runtime.profiler import TorchProfiler
from atom_aot.runtime.spec.mtp import MTPForward
from atom_aot.runtime.spec.setup import mtp_forward, verify_graph_reserve
from atom_aot.runtime.threads import set_torch_threads

log = logging.getLogger("atom_aot")


def run_worker(artifact_path: str | Path, config: RuntimeConfig) -> None:
    place = RankPlace.from_env()
    if place is None or place.rank == 0:
        raise ValueError("`atom-run ART worker` runs ranks 1..N-1 of a tensor-parallel engine: set RANK (>= 1), "
                         "WORLD_SIZE, MASTER_ADDR and MASTER_PORT as for torchrun; rank 0 is `atom-run ART serve` "
                         "or `generate` (docs/parallelism.md)")
    set_torch_threads(config.num_threads)
    start = time.perf_counter()
    device = rank_device(Artifact.open(artifact_path, config.trusted_keys).manifest.target.arch, place.local_rank)
    log.info("rank %d: on %s in %.2f s; meets the others while it loads", place.rank, device,
             time.perf_counter() - start)
    load = partial(load_artifact, artifact_path, enforce_eager=config.enforce_eager, rank=place.rank,
                   trusted_keys=config.trusted_keys)
    ready = meet_beside_load(partial(join, place, device), load, device, release=lambda group: leave())
    log.info("rank %d: met the others in %.2f s, loaded beside it (%.2f s both; %s)", place.rank, ready.join_s,
             ready.wall_s, seconds_listed(ready.loaded.timings))
    try:
        loaded, group = ready.loaded, ready.met
        num_blocks = kv_block_count(loaded, config, verify_graphs=verify_graph_reserve(loaded, config))
        kv_cache, forwards = prepare_model(loaded, config, agree_min(num_blocks, group))
        mtp = worker_mtp(loaded, config, kv_cache, forwards)
        hidden = None if mtp is None else (loaded.model_config.hidden_size, loaded.dtype)
        serve_steps(StepReceiver(group, kv_cache, hidden), [forwards.mixed, forwards.decode, mtp])
    except dist.DistError as e:
        raise RankFailure(f"rank {place.rank} lost rank 0 ({type(e).__name__}: {e}); this rank stops") from None
    finally:
        leave()


def worker_mtp(loaded: LoadedArtifact, config: RuntimeConfig, kv_cache: torch.Tensor,
               forwards: Forwards) -> MTPForward | None:
    """This rank's shard of the MTP layer's step for --method mtp (as rank 0 makes its own: CUDA graphs where
    the decode steps have them, captured after them), None otherwise. An artifact without the `mtp` package
    gets none: rank 0 refuses it by name and stops this rank."""
    if config.method != "mtp" or Phase.MTP not in loaded.forwards:
        return None
    max_model_len = config.served_max_model_len(loaded.max_model_len)
    return mtp_forward(loaded, kv_cache, forwards.decode_max_seqs is not None, max_model_len)


@torch.inference_mode()
def serve_steps(receiver: StepReceiver, forwards: list) -> None:
    """Run each step rank 0 sends, and its profiler commands; return when it says stop. If rank 0 goes away
    the receive fails."""
    profile: TorchProfiler | None = None
    while (message := receiver.receive()) is not None:
        if isinstance(message, ProfileCommand):
            profile, ok = follow_profile(message, profile, receiver.group.rank)
            receiver.answer(ok)
            continue
        index, arguments = message
        forwards[index](*arguments)


def follow_profile(command: ProfileCommand, profile: TorchProfiler | None,
                   rank: int) -> tuple[TorchProfiler | None, bool]:
    """Start (or stop and write) this rank's trace as rank 0 says: (the profiler running now, whether it
    did). A failure is logged here and answered to rank 0, which names this rank; the engine goes on."""
    try:
        if command.start:
            started = TorchProfiler(command.root, command.first_rank + rank, more=command.more)
            started.start()
            return started, True
        if profile is not None:
            log.info("rank %d: trace %s", rank, profile.stop())
        return None, True
    except Exception:
        log.exception("rank %d: the profiler failed", rank)
        return None, False
