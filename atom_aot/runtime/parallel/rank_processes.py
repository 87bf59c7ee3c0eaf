"""How rank 0 starts the other tensor-parallel ranks of its machine: forked from itself, or as new
`atom-run ART worker` interpreters.

A new interpreter imports torch again before it can meet rank 0 (1-2 s with bytecode cached, 3.5-6 s in
images that ship none, docs/gpu.md), and the engine's start waits on it: Llama-3.1-8B at -tp 2 on two H100s
took 13.5-14.8 s to its first token against 7.1-8.6 s for one rank (two H100s). A forked rank starts with
everything rank 0 has imported. A fork is safe only while this process has no CUDA context and runs one
thread (and has never run a process group, whose native threads outlive it), so on GPU machines ranks are
forked when all of that holds and spawned otherwise. CPU ranks are spawned:
a child forked after its parent ran OpenMP regions can hang in its own (libgomp is not fork-safe).
`ATOM_TP_WORKER_START=fork|spawn` decides instead of these rules.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from atom_aot.config_flags import to_argv
from atom_aot.distributed.group import RankPlace, joined_before
from atom_aot.runtime.config import RuntimeConfig

START_VARIABLE = "ATOM_TP_WORKER_START"
START_METHODS = ("fork", "spawn")


def start_method(arch: str) -> tuple[str, str]:
    """("fork" or "spawn", why) for the ranks of an `arch` artifact started from this process."""
    forced = os.environ.get(START_VARIABLE)
    if forced is not None:
        if forced not in START_METHODS:
            raise ValueError(f"{START_VARIABLE}={forced!r}: it must be one of {', '.join(START_METHODS)}")
        return forced, f"{START_VARIABLE}={forced}"
    if arch == "cpu":
        return "spawn", "CPU ranks: a child forked after OpenMP ran here can hang in libgomp"
    if torch.cuda.is_initialized():
        return "spawn", "this process already has a CUDA context, which a forked child cannot use"
    if threading.active_count() > 1:
        return "spawn", f"this process runs {threading.active_count()} threads, and a fork copies only one"
    if joined_before():
        return "spawn", "this process has run a process group, whose native threads may hold locks a fork copies"
    return "fork", "they start with this process's imports"


def start_rank(artifact_path: str | Path, config: RuntimeConfig, place: RankPlace,
               method: str) -> "subprocess.Popen | ForkedRank":
    """Rank `place.rank` as a process of this machine; both kinds answer pid, poll, wait and kill."""
    if method == "fork":
        return ForkedRank(artifact_path, config, place)
    cmd = [sys.executable, "-m", "atom_aot.runtime.cli", str(artifact_path), "worker", *to_argv(config)]
    return subprocess.Popen(cmd, env={**os.environ, **place.environment()})


class ForkedRank:
    """A rank forked from this process, with subprocess.Popen's pid / returncode / poll / wait / kill."""

    def __init__(self, artifact_path: str | Path, config: RuntimeConfig, place: RankPlace):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_forked(artifact_path, config, place)      # never returns
        self.pid = pid
        self.returncode: int | None = None
        self._reaping = threading.Lock()     # rank 0's watcher thread polls while close() waits

    def poll(self) -> int | None:
        with self._reaping:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked rank (pid {self.pid})", timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def _run_forked(artifact_path: str | Path, config: RuntimeConfig, place: RankPlace) -> None:
    """The forked child: run the worker as `atom-run ART worker` would, then leave without running the
    parent's exit handlers (they belong to rank 0)."""
    code = 1
    try:
        os.environ.update(place.environment())
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from atom_aot.runtime.parallel.tp_worker import run_worker
        run_worker(artifact_path, config)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        from atom_aot.runtime.loading.extraction import remove_process_folder
        remove_process_folder()          # the exit handler that would remove it does not run under os._exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
