"""The torch profiler on demand, for the offline engine (`LLMEngine.start_profile()`) and the
server's engine process (`/start_profile`): one trace per start/stop and rank, written gzipped to
`<dir>/rank_<r>/` (open with Perfetto or chrome://tracing, or `scripts/analyze_trace.py`).

Every rank writes its own: the engine (rank 0) starts and stops the tensor-parallel ranks it leads
with it (runtime/parallel/tp_lead.py registers them here and tells them over the step channel), and each
data-parallel engine writes under its own ranks: rank r of a data-parallel-attention artifact as
rank_<r>, tensor-parallel rank t of replica i (of N ranks each) as rank_<i*N + t>.

`more=True` (ATOM's `ATOM_PROFILER_MORE=1`) also records shapes, Python stacks and memory.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DIR_ENV = "ATOM_TORCH_PROFILER_DIR"
MORE_ENV = "ATOM_PROFILER_MORE"


def dir_from_env() -> str | None:
    """ATOM's variable for the trace folder (the default of --torch-profiler-dir / torch_profiler_dir)."""
    return os.environ.get(DIR_ENV) or None


def more_from_env() -> bool:
    return os.environ.get(MORE_ENV, "0") == "1"


def torch_profile(more: bool, record_shapes: bool = True):
    """A torch.profiler.profile of the CPU and, where there is one, the GPU; `more` adds Python stacks
    and memory."""
    import torch
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=record_shapes, with_stack=more,
                                  profile_memory=more)


class OtherRanks(Protocol):
    """The tensor-parallel ranks an engine leads, as its profiler drives theirs (runtime/tp_lead.LeadRank)."""

    def start_profile(self, root: str, first_rank: int, more: bool) -> list[int]:
        """Start theirs (traces under root/rank_<first_rank + r>/); the ranks that could not."""

    def send_profile_stop(self) -> None:
        """Tell them to stop and write their traces."""

    def profile_stopped(self) -> list[int]:
        """Wait until they have; the ranks that could not."""


# The ranks this process leads as rank 0, while it does: one group per process at most, as
# torch.distributed holds one default group.
_others: OtherRanks | None = None


def profile_others(ranks: OtherRanks) -> None:
    """From now on the profiler of this process starts and stops `ranks`' with its own."""
    global _others
    _others = ranks


def stop_profiling_others(ranks: OtherRanks) -> None:
    """`ranks` are gone (closed): the profiler no longer drives them."""
    global _others
    if _others is ranks:
        _others = None


class ProfilerError(Exception):
    """Profiling was asked for in a state that does not allow it; the message says why."""


@dataclass(frozen=True)
class ProfilerVerbs:
    """How the caller's user turns profiling on, starts and stops it (the errors name them)."""
    enable: str = "pass torch_profiler_dir=DIR to LLMEngine (or set ATOM_TORCH_PROFILER_DIR)"
    start: str = "start_profile()"
    stop: str = "stop_profile()"


@dataclass(frozen=True)
class TraceDir:
    """Where one engine's ranks write: `root`/rank_<first_rank + r>/ for its tensor-parallel rank r
    (first_rank: where a data-parallel engine's ranks start among all ranks)."""
    root: str
    first_rank: int = 0


class TorchProfiler:
    def __init__(self, out_dir: str | TraceDir | None, rank: int = 0, more: bool = False,
                 verbs: ProfilerVerbs = ProfilerVerbs()):
        """rank: this process's rank in its engine (a TraceDir adds its first_rank): its folder."""
        self.root = (out_dir.root if isinstance(out_dir, TraceDir) else out_dir) or None
        self.rank = rank + (out_dir.first_rank if isinstance(out_dir, TraceDir) else 0)
        self.out_dir = Path(self.root) / f"rank_{self.rank}" if self.root else None
        self.more = more
        self.verbs = verbs
        self._profile = None

    @property
    def enabled(self) -> bool:
        return self.out_dir is not None

    def start(self) -> str:
        """Starts tracing here and on the ranks this process leads; returns this rank's trace folder."""
        if not self.enabled:
            raise ProfilerError(f"profiling is off: {self.verbs.enable}")
        if self._profile is not None:
            raise ProfilerError(f"the profiler is already running: {self.verbs.stop} first")
        self._profile = torch_profile(self.more)
        self._profile.start()
        others = _others
        failed = others.start_profile(self.root, self.rank, self.more) if others is not None else []
        if failed:
            self._profile.stop()
            self._profile = None
            raise ProfilerError(f"tensor-parallel rank(s) {_listed(failed)} could not start the profiler (their "
                                f"log says why); no rank is profiling")
        return str(self.out_dir)

    def stop(self) -> str:
        """Stops tracing; returns this rank's gzipped trace file (the ranks it leads have written theirs
        under their own rank_<r>/ when this returns)."""
        if self._profile is None:
            raise ProfilerError(f"the profiler is not running: {self.verbs.start} first")
        profile, self._profile = self._profile, None
        profile.stop()
        others = _others
        if others is not None:                 # they write theirs while this one writes
            others.send_profile_stop()
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            trace = self.out_dir / f"trace-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}.json.gz"
            profile.export_chrome_trace(str(trace))
        finally:
            # always heard, or the next step would meet their answers
            failed = others.profile_stopped() if others is not None else []
        if failed:
            raise ProfilerError(f"tensor-parallel rank(s) {_listed(failed)} could not write a trace (their log "
                                f"says why); this rank's is {trace}")
        return str(trace)


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
