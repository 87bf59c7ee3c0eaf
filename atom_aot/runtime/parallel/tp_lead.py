"""Rank 0 of a tensor-parallel engine: starts (or meets) the other ranks, leads every step, and
notices a rank that dies.

Rank 0 is the engine: it schedules, sends each step's inputs to the others (step_broadcast.py),
runs its part of the forward and samples. The other ranks run `atom-run ART worker`'s loop: forked
or started here on this machine (rank_processes.py), or by hand / torchrun on other nodes
(docs/parallelism.md).

A rank that dies must take the engine down with a clear error, never a hang: the next collective
with it fails (its sockets closed), and rank 0 says which rank went and how. While the engine is
idle no collective runs, so a watcher thread polls the ranks it started and, when one exits,
interrupts the main thread with SIGTERM: the server's engine process ends on it (and the server
with it); a process that does not handle SIGTERM (offline LLMEngine) is left alone, and its next
step raises instead.

Rank 0 also starts and stops the others' profilers with its own: a process leads at most one group
(it holds one torch.distributed default group), which it registers with runtime/profiler.py.
"""
from __future__ import annotations

import _thread
import atexit
import logging
import signal
import subprocess
import threading
import time
from functools import partial

import torch
import torch.distributed as dist

from atom_aot.artifact.reader import Artifact
from atom_aot.distributed.group import RankGroup, RankPlace, agree_min, join, leave, rank_device
from atom_aot.errors import RankFailure
from atom_aot.runtime import profiler
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.parallel.rank_processes import start_method, start_rank
from atom_aot.runtime.parallel.step_broadcast import (DECODE_FORWARD, MIXED_FORWARD, MTP_FORWARD, LeadingForward,
                                                      StepSender)
from atom_aot.runtime.spec.mtp import MTPForward

log = logging.getLogger("atom_aot")

WATCH_INTERVAL_S = 0.2
DEATH_NOTICE_S = 2.0        # how long a failed collective waits for the watcher to name the rank that died
STOP_GRACE_S = 10.0


def start_other_ranks(artifact: Artifact, config: RuntimeConfig) -> "StartingRanks | None":
    """Ranks 1..N-1 of the artifact's layout, started but not met yet (None for a one-rank artifact).

    Placed by torchrun's variables, this process must be rank 0 and the others are started
    elsewhere; otherwise ranks 1..N-1 are started here as child processes."""
    artifact_path = artifact.path
    world = artifact.manifest.layout.world_size
    place = RankPlace.from_env()
    if world == 1:
        return None
    if place is not None and (place.rank != 0 or place.world_size != world):
        raise ValueError(f"this process is RANK {place.rank} of WORLD_SIZE {place.world_size}, but the engine is rank "
                         f"0 of the artifact's {world} ranks: set WORLD_SIZE={world}, RANK=0 here and start ranks "
                         f"1..{world - 1} with `atom-run {artifact_path} worker` (docs/parallelism.md)")
    if dist.is_initialized():
        raise RuntimeError("this process already has a torch.distributed process group (another tensor-parallel "
                           "engine?): close that engine first (LLMEngine.close())")
    from atom_aot.runtime.loading.loader import check_target
    if place is not None:                  # the other ranks are started elsewhere
        check_target(artifact)
        return StartingRanks(place, rank_device(artifact.manifest.target.arch, place.local_rank), [])
    place = RankPlace.local_leader(world)
    method, why = start_method(artifact.manifest.target.arch)
    if method == "spawn":
        check_target(artifact)             # refuse before anything starts
    log.info("tensor-parallel ranks 1..%d: %s (%s)", world - 1,
             "forked from this process" if method == "fork" else "started as new processes", why)
    start = time.perf_counter()
    children = [start_rank(artifact_path, config, place.peer(rank, started_by_leader=True), method)
                for rank in range(1, world)]
    processes_s = time.perf_counter() - start
    try:
        if method == "fork":               # checked after the fork: the check opens this process's CUDA context
            check_target(artifact)
        device = rank_device(artifact.manifest.target.arch, place.local_rank)
        return StartingRanks(place, device, children, {"ranks start: processes": processes_s,
                                                       "ranks start: target check + device":
                                                       time.perf_counter() - start - processes_s})
    except BaseException:
        _kill(children)
        raise


class StartingRanks:
    """Ranks 1..N-1 started (here, or elsewhere by torchrun), before rank 0 meets them: `join` meets them and
    gives rank 0's LeadRank. Between the two, rank 0 loads its weights (runtime/parallel/rank_load.py)."""

    def __init__(self, place: RankPlace, device: torch.device, children: list, timings: dict[str, float] | None = None):
        self.place, self.device, self.children = place, device, children
        self.timings = timings or {}       # seconds of the parts of the start (the processes, the target check)

    def join(self) -> "LeadRank":
        waiting = partial(_all_alive, self.children) if self.children else None
        try:
            return LeadRank(join(self.place, self.device, waiting=waiting), self.children)
        except BaseException:
            _kill(self.children)
            raise


def _kill(children: list) -> None:
    """Kill the ranks started here after a start that failed before they met (they would wait for this one
    until their rendezvous timeout)."""
    for child in children:
        child.kill()


def _exited(children: list) -> str | None:
    """Which rank started here has exited (ranks 1..N-1, in order), said as the errors say it; None if none."""
    for rank, child in enumerate(children, start=1):
        if child.poll() is not None:
            return f"tensor-parallel rank {rank} (pid {child.pid}) exited with code {child.returncode}"
    return None


def _all_alive(children: list) -> None:
    """Raise RankFailure naming a rank started here that has exited (while the ranks are still meeting)."""
    if (exited := _exited(children)) is not None:
        raise RankFailure(f"{exited} before it joined the others: its own output says why")


class LeadRank:
    def __init__(self, group: RankGroup, children: list[subprocess.Popen]):
        self.group = group
        self.children = children
        self.sender = StepSender(group)
        self.failure: str | None = None
        self._closing = False
        threading.Thread(target=self._watch, name="atom-rank-watch", daemon=True).start()
        atexit.register(self.close)
        profiler.profile_others(self)

    @property
    def join_timings(self) -> dict[str, float]:
        return self.group.join_timings

    def agree_num_blocks(self, num_blocks: int) -> int:
        return agree_min(num_blocks, self.group)

    def lead(self, forwards: Forwards) -> Forwards:
        """`forwards` sending each step to the other ranks first (they run the forward rank 0 picks)."""
        decode = None if forwards.decode is None else LeadingForward(forwards.decode, DECODE_FORWARD, self)
        return Forwards(LeadingForward(forwards.mixed, MIXED_FORWARD, self), decode, forwards.decode_max_seqs)

    def leading_mtp(self, mtp: MTPForward) -> MTPForward:
        """The MTP layer's step (--method mtp) sending its inputs and previous hidden states to the other ranks
        first: they run their shard of the layer (runtime/parallel/tp_worker.py)."""
        return LeadingForward(mtp, MTP_FORWARD, self)

    def start_profile(self, root: str, first_rank: int, more: bool) -> list[int]:
        """Start the other ranks' profilers (traces under root/rank_<first_rank + r>/); returns the ranks that
        could not (then those that did are stopped again, as by a stop)."""
        self._collective(lambda: self.sender.profile_start(root, first_rank, more))
        failed = self._collective(self.sender.failed_ranks)
        if failed:
            self.send_profile_stop()
            self.profile_stopped()
        return failed

    def send_profile_stop(self) -> None:
        """Tell the other ranks to stop profiling and write their traces (`profile_stopped` hears them)."""
        self._collective(self.sender.profile_stop)

    def profile_stopped(self) -> list[int]:
        """Wait until the other ranks have written their traces; returns the ranks that could not."""
        return self._collective(self.sender.failed_ranks)

    def _collective(self, call):
        self.check(None)
        try:
            return call()
        except RuntimeError as e:       # torch.distributed's errors, as in LeadingForward
            self.check(e)
            raise

    def check(self, error: BaseException | None) -> None:
        """Raise RankFailure if a rank is known dead; after a failed collective (`error`), say what failed."""
        deadline = time.monotonic() + (DEATH_NOTICE_S if error is not None and self.children else 0)
        while self.failure is None and time.monotonic() < deadline:
            time.sleep(WATCH_INTERVAL_S / 2)
        if self.failure is not None:
            raise RankFailure(f"{self.failure}: the engine cannot go on without it; restart it") from error
        if error is not None and isinstance(error, dist.DistError):
            raise RankFailure(f"a collective with the other tensor-parallel ranks failed ({error}); a rank has "
                              f"stopped or cannot be reached: the engine cannot go on; restart it") from error

    def _watch(self) -> None:
        while not self._closing:
            exited = _exited(self.children)
            if exited is not None and not self._closing:
                self.failure = exited
                log.error("%s; the engine stops", self.failure)
                _thread.interrupt_main(signal.SIGTERM)
                return
            time.sleep(WATCH_INTERVAL_S)

    def _release(self) -> None:
        profiler.stop_profiling_others(self)
        leave()

    def abort(self) -> None:
        """End a start that failed on this rank. The other ranks may be anywhere in their own start (loading,
        agreeing on the KV cache, capturing graphs), not waiting for a step, so a stop message would meet a
        different collective and wait forever (seen on GPUs: rank 0 ran out of memory for its
        KV cache and hung telling rank 1 to stop). The ranks started here are killed instead; ranks started
        elsewhere see their next collective with this rank fail when it leaves."""
        if self._closing:
            return
        self._closing = True
        for child in self.children:
            child.kill()
            try:
                child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel rank (pid %d) did not end within %.0f s of SIGKILL", child.pid, STOP_GRACE_S)
        self._release()

    def close(self) -> None:
        """Stop the other ranks (they leave their loop) and wait for the ones started here."""
        if self._closing:
            return
        self._closing = True
        if self.failure is None:
            try:
                self.sender.stop()
            except RuntimeError:
                log.warning("the other tensor-parallel ranks could not be told to stop", exc_info=True)
        for child in self.children:
            try:
                child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
        self._release()
