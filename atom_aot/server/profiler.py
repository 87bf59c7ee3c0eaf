"""torch profiler on demand (`/start_profile`, `/stop_profile`), inside the engine process.

Traces land in `<dir>/rank_<r>/` as Chrome trace JSON (open with chrome://tracing or Perfetto).
"""
from __future__ import annotations

import time
from pathlib import Path


class ProfilerError(Exception):
    """Profiling was asked for in a state that does not allow it; the message says why."""


class TorchProfiler:
    def __init__(self, out_dir: str | None, rank: int = 0):
        self.out_dir = Path(out_dir) / f"rank_{rank}" if out_dir else None
        self._profile = None

    def start(self) -> str:
        """Starts tracing; returns the folder the trace will go to."""
        if self.out_dir is None:
            raise ProfilerError("profiling is off: start the server with --torch-profiler-dir DIR")
        if self._profile is not None:
            raise ProfilerError("the profiler is already running: POST /stop_profile first")
        import torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(activities=activities, record_shapes=True)
        self._profile.start()
        return str(self.out_dir)

    def stop(self) -> str:
        """Stops tracing; returns the trace file written."""
        if self._profile is None:
            raise ProfilerError("the profiler is not running: POST /start_profile first")
        profile, self._profile = self._profile, None
        profile.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"trace-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}.json"
        profile.export_chrome_trace(str(trace))
        return str(trace)
