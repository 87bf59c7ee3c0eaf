"""The torch profiler on demand, for the offline engine (`LLMEngine.start_profile()`) and the
server's engine process (`/start_profile`): one trace per start/stop, written gzipped to
`<dir>/rank_0/` by the engine process; tensor-parallel workers are not profiled (open with Perfetto or chrome://tracing, or `scripts/analyze_trace.py`).

`more=True` (ATOM's `ATOM_PROFILER_MORE=1`) also records shapes, Python stacks and memory.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

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


class ProfilerError(Exception):
    """Profiling was asked for in a state that does not allow it; the message says why."""


@dataclass(frozen=True)
class ProfilerVerbs:
    """How the caller's user turns profiling on, starts and stops it (the errors name them)."""
    enable: str = "pass torch_profiler_dir=DIR to LLMEngine (or set ATOM_TORCH_PROFILER_DIR)"
    start: str = "start_profile()"
    stop: str = "stop_profile()"


class TorchProfiler:
    def __init__(self, out_dir: str | None, rank: int = 0, more: bool = False,
                 verbs: ProfilerVerbs = ProfilerVerbs()):
        self.out_dir = Path(out_dir) / f"rank_{rank}" if out_dir else None
        self.more = more
        self.verbs = verbs
        self._profile = None

    @property
    def enabled(self) -> bool:
        return self.out_dir is not None

    def start(self) -> str:
        """Starts tracing; returns the folder the trace will go to."""
        if not self.enabled:
            raise ProfilerError(f"profiling is off: {self.verbs.enable}")
        if self._profile is not None:
            raise ProfilerError(f"the profiler is already running: {self.verbs.stop} first")
        self._profile = torch_profile(self.more)
        self._profile.start()
        return str(self.out_dir)

    def stop(self) -> str:
        """Stops tracing; returns the gzipped trace file written."""
        if self._profile is None:
            raise ProfilerError(f"the profiler is not running: {self.verbs.start} first")
        profile, self._profile = self._profile, None
        profile.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"trace-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}.json.gz"
        profile.export_chrome_trace(str(trace))
        return str(trace)
