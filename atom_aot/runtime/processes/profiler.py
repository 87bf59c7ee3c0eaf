"""The server's torch profiler (`/start_profile`, `/stop_profile`, inside the engine process):
the runtime's TorchProfiler, its errors phrased for the server's flags and routes, and
`ATOM_PROFILER_MORE=1` honoured as in ATOM."""
from __future__ import annotations

from atom_aot.runtime import profiler as runtime_profiler
from atom_aot.runtime.profiler import ProfilerError, TraceDir

__all__ = ["ProfilerError", "TorchProfiler"]

SERVER_VERBS = runtime_profiler.ProfilerVerbs(
    enable="start the server with --torch-profiler-dir DIR (or set ATOM_TORCH_PROFILER_DIR)",
    start="POST /start_profile", stop="POST /stop_profile")


class TorchProfiler(runtime_profiler.TorchProfiler):
    def __init__(self, out_dir: str | TraceDir | None, rank: int = 0):
        super().__init__(out_dir, rank, more=runtime_profiler.more_from_env(), verbs=SERVER_VERBS)
