"""Grammar compiles off the engine loop: a small pool of worker processes (grammar_worker.py), each compile
bounded by a time limit, so that one request's grammar never stalls the steps of the others.

Why processes and not threads: xgrammar's compile releases the GIL, so a thread would not stall the loop,
but a thread cannot be stopped, and some inputs compile for minutes (an enum of 20,000 long strings took
352 s): a compile over its limit would hold its thread until it ended. A worker process is killed at the
limit and a fresh one started in its place at once. Each worker sends its compiled grammar back as
xgrammar's JSON; the pool's thread deserializes it (that too releases the GIL). The pool's threads also read
the tokenizer's vocabulary for xgrammar, once, so the engine's thread does none of this work.

The limit counts from the moment a worker takes the compile; a request may first wait for a free worker
(at most the limit per compile queued before it, since each compile ends by its limit).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from atom_aot.errors import RequestError
from atom_aot.runtime.sampling.grammar_errors import SPEC_NAMES
from atom_aot.runtime.sampling_params import GrammarSpec

log = logging.getLogger("atom_aot")

WORKER_START_TIMEOUT_S = 120.0      # importing xgrammar (and torch, which it imports) on a busy host
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class WorkerStopped(RuntimeError):
    """A worker process that ended without answering (the grammar library crashed on an input)."""


@dataclass(frozen=True)
class CompileJob:
    spec: GrammarSpec
    future: Future          # the CompiledGrammar, or a RequestError saying why there is none


class GrammarCompilePool:
    def __init__(self, load_tokenizer_info: Callable[[], Any], workers: int, time_limit_s: float):
        """`load_tokenizer_info() -> xgrammar.TokenizerInfo`, called once, by the first of the pool's threads."""
        self.load_tokenizer_info = load_tokenizer_info
        self.time_limit_s = time_limit_s
        self._info_lock = threading.Lock()
        self._info: tuple[Any, str] | None = None       # (TokenizerInfo, its JSON for the workers)
        self.num_timeouts = 0           # compiles ended at the limit (their worker killed)
        self._jobs: queue.Queue[CompileJob | None] = queue.Queue()
        self._slots = [threading.Thread(target=self._serve, name=f"atom-grammar-{i}", daemon=True)
                       for i in range(workers)]
        for slot in self._slots:
            slot.start()

    def submit(self, spec: GrammarSpec) -> Future:
        future: Future = Future()
        self._jobs.put(CompileJob(spec, future))
        return future

    def close(self) -> None:
        """Stop the workers: each once the compile it runs is done (by its time limit at most)."""
        for _ in self._slots:
            self._jobs.put(None)
        for slot in self._slots:
            slot.join(timeout=5.0)

    @property
    def tokenizer_info(self) -> tuple[Any, str]:
        with self._info_lock:
            if self._info is None:
                info = self.load_tokenizer_info()
                self._info = info, info.serialize_json()
            return self._info

    def _serve(self) -> None:
        """One slot: one worker process at a time, one compile at a time; a worker ended is replaced at once."""
        worker = self._start_worker()
        while (job := self._jobs.get()) is not None:
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                worker = self._run(worker, job) or self._start_worker()
            except Exception:      # a bug here must fail its request, not leave it (and the slot) waiting forever
                log.exception("compiling a %s failed", job.spec.kind)
                job.future.set_exception(RequestError(_unexpected(job.spec)))
                _stop(worker)
                worker = None
        if worker is not None:
            worker.stop()

    def _start_worker(self) -> _Worker | None:
        """A started worker; None if it would not start (said in the log; the next compile tries again)."""
        try:
            return _Worker(self.tokenizer_info[1])
        except Exception as e:     # the next compile tries again, and says why to its request if it fails too
            log.error("a grammar compile worker did not start: %s", e)
            return None

    def _deserialize(self, text: str):
        import xgrammar as xgr
        return xgr.CompiledGrammar.deserialize_json(text, self.tokenizer_info[0])

    def _run(self, worker: _Worker | None, job: CompileJob) -> _Worker | None:
        """`job` done on `worker` (started if None); returns the worker to keep (None: it was ended)."""
        try:
            worker = worker or _Worker(self.tokenizer_info[1])
            answer = worker.compile(job.spec, self.time_limit_s)
        except (WorkerStopped, OSError, EOFError) as e:
            log.error("a grammar compile worker stopped (%s) compiling a %s; a new one takes the next compile",
                      e, job.spec.kind)
            _stop(worker)
            job.future.set_exception(RequestError(
                f"the {SPEC_NAMES[job.spec.kind]} of this request's structured output could not be compiled: the "
                f"grammar compiler stopped (see the server's log)"))
            return None
        if answer is None:
            self.num_timeouts += 1
            worker.kill()
            job.future.set_exception(RequestError(
                f"the {SPEC_NAMES[job.spec.kind]} of this request's structured output did not compile within "
                f"{self.time_limit_s:g} s (--grammar-compile-timeout); make it smaller or simpler"))
            return None
        ok, payload = answer
        if not ok:
            job.future.set_exception(RequestError(payload))
            return worker
        try:
            job.future.set_result(self._deserialize(payload))
        except (RuntimeError, ValueError) as e:
            log.error("a compiled %s could not be read back from its worker: %s", job.spec.kind, e)
            job.future.set_exception(RequestError(_unexpected(job.spec)))
        return worker


class _Worker:
    """One grammar_worker.py process and its two pipes."""

    def __init__(self, tokenizer_info_json: str):
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "atom_aot.runtime.sampling.grammar_worker", str(child_in), str(child_out)],
            pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL, env=env)
        os.close(child_in)
        os.close(child_out)
        self.outbox = Connection(parent_out, readable=False)
        self.inbox = Connection(parent_in, writable=False)
        self.outbox.send_bytes(tokenizer_info_json.encode())
        if not self.inbox.poll(WORKER_START_TIMEOUT_S) or self.inbox.recv_bytes() != b"ready":
            self.kill()
            raise WorkerStopped(f"it did not start within {WORKER_START_TIMEOUT_S:g} s")

    def compile(self, spec: GrammarSpec, time_limit_s: float) -> tuple[bool, str] | None:
        """(True, compiled grammar's JSON) or (False, why not); None: not done within the limit."""
        self.outbox.send_bytes(json.dumps({"kind": spec.kind, "value": spec.value,
                                           "choices": list(spec.choices)}).encode())
        if not self.inbox.poll(time_limit_s):
            return None
        answer = self.inbox.recv_bytes()
        return answer[:2] == b"ok", answer[2:].decode()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._close_pipes()

    def stop(self) -> None:
        """End it: its input closes, so it exits; one still compiling is killed."""
        self._close_pipes()
        try:
            self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.kill()

    def _close_pipes(self) -> None:
        for connection in (self.outbox, self.inbox):
            if not connection.closed:
                connection.close()


def _unexpected(spec: GrammarSpec) -> str:
    return (f"the {SPEC_NAMES[spec.kind]} of this request's structured output could not be compiled (see the "
            f"server's log)")


def _stop(worker: _Worker | None) -> None:
    if worker is not None:
        worker.kill()
