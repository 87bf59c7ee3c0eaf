"""A rank's load beside its join: the artifact's weights go up to the device while the ranks meet.

Why: a tensor-parallel start was two waits in a row. Meeting the other ranks (the process group, NCCL's
communicators, the all-reduce's peer memory) took 3.85 s at -tp 2 and 5.05 s at -tp 4 on H200s,
and only then did each rank upload its weights (1.9 s for Llama-3.1-8B at -tp 2). The load needs nothing from
the other ranks: the compiled model's peer table is refilled in place when the group registers
(distributed/collectives.py), and the KV cache is sized after both, so the two overlap.

The join stays on the calling (main) thread and the load runs in a thread made current on the rank's device:
meeting from a thread was tried once and one CPU CI run hung there (docs/parallelism.md).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

import torch

# The A/B switch for this module: beside (default) | after-join (no overlap). On four H200s at -tp 4
# (Llama-3.1-8B, two starts each) beside reached the first token in 6.1-7.1 s, after-join in 8.2-8.6 s; the load on a
# CUDA stream of its own instead of the thread's default one was tried there too and gained nothing (6.8-7.7 s).
ORDER_VARIABLE = "ATOM_RANK_LOAD"
ORDERS = ("beside", "after-join")

M = TypeVar("M")
L = TypeVar("L")


@dataclass
class MetAndLoaded(Generic[M, L]):
    met: M                  # what the join gave (rank 0's LeadRank, a RankGroup)
    loaded: L               # what the load gave (a LoadedArtifact)
    join_s: float           # the join's own seconds, from its start
    wall_s: float           # from the start of both to the end of the later


def on_device(device: torch.device, work: Callable[[], L]) -> Callable[[], L]:
    """`work` made to run with `device` current (a new thread's current GPU is device 0, whatever this one's)."""
    def run() -> L:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return work()
    return run


def meet_beside_load(meet: Callable[[], M], load: Callable[[], L], device: torch.device,
                     release: Callable[[M], None]) -> MetAndLoaded[M, L]:
    """meet() here while load() runs in a thread on `device` (ATOM_RANK_LOAD=after-join: meet(), then load() here).
    A failed load after a successful meet calls release(met) (the ranks would otherwise wait for this one); a
    failed meet waits for the load to end, drops it, and raises the meet's error (the meet cleans up after
    itself)."""
    order = os.environ.get(ORDER_VARIABLE, "beside")
    if order not in ORDERS:
        raise ValueError(f"{ORDER_VARIABLE}={order!r}: expected one of {', '.join(ORDERS)}")
    start = time.perf_counter()
    if order == "after-join":
        met = meet()
        join_s = time.perf_counter() - start
        loaded = _or_release(on_device(device, load), met, release)
    else:
        with ThreadPoolExecutor(1, thread_name_prefix="atom-rank-load") as pool:
            loading = pool.submit(on_device(device, load))
            met = meet()
            join_s = time.perf_counter() - start
            loaded = _or_release(loading.result, met, release)
    return MetAndLoaded(met, loaded, join_s, time.perf_counter() - start)


def _or_release(finish_load: Callable[[], L], met: M, release: Callable[[M], None]) -> L:
    try:
        return finish_load()
    except BaseException:
        release(met)
        raise
