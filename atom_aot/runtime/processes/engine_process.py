"""The engine process: loads the artifact, then loops intake -> step -> send outputs.

It owns the EngineCore and nothing else: no HTTP, no tokenizer. While requests are running it
drains its inbox without waiting between steps; when idle it blocks on the inbox, waking every
heartbeat to send one (the front end's liveness and /metrics read them) and to notice a front
end that went away, and exit with it.

One rank of a data-parallel-attention artifact steps with the other ranks (runtime/parallel/attention_dp.py):
every turn of its loop agrees with them whether any has work and whether any stops, and it runs a
step of padding when others have work and it has none. The front end wakes every rank when it
sends one of them requests (`Wake`), so idle ranks do not sleep through a heartbeat first.

This module does not import torch: the process sets how OpenMP threads wait before torch
loads (runtime/threads.py says why).
"""
from __future__ import annotations

import functools
import logging
import multiprocessing
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import zmq

from atom_aot.errors import ContextLengthError, RankStopped, RequestError
from atom_aot.logging_setup import DATE_FORMAT, FORMAT, seconds_listed
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.processes.messages import (HEARTBEAT_S, Abort, Added, AddRequests, Call, EngineInfo, EngineStats, Failure,
                                      Heartbeat, Outputs, ProfileStarted, ProfileStopped, Ready, Reply, Shutdown,
                                      StartProfile, StartupFailed, StopProfile, Wake, decode, encode)
from atom_aot.runtime.processes.profiler import ProfilerError, TorchProfiler
from atom_aot.runtime.profiler import TraceDir
from atom_aot.runtime.threads import prefer_passive_openmp_wait

if TYPE_CHECKING:
    from atom_aot.runtime.engine.engine_core import EngineCore

log = logging.getLogger("atom_aot.engine")

PARENT_CHECK_S = 1.0


def run_engine_process(artifact_path: str, config: RuntimeConfig, inputs_addr: str, outputs_addr: str,
                       profiler_dir: str | TraceDir | None, log_level: str = "info") -> None:
    """Entry point of the spawned process. profiler_dir: where /start_profile's traces go (a TraceDir: this
    engine's ranks are rank_<first_rank + r>, one data-parallel engine among others)."""
    prefer_passive_openmp_wait()
    _install_signal_handlers()
    logging.basicConfig(level=log_level.upper(), format=FORMAT, datefmt=DATE_FORMAT)
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    inbox.connect(inputs_addr)
    outbox = context.socket(zmq.PUSH)
    outbox.setsockopt(zmq.SNDHWM, 0)
    outbox.connect(outputs_addr)
    try:
        core, info = _start(artifact_path, config)
    except Exception as e:   # any failure is reported to the front end, which prints it and exits
        log.debug("startup failed", exc_info=True)
        outbox.send(encode(StartupFailed(_startup_message(e))))
        _close(context, outbox, inbox)
        return
    outbox.send(encode(Ready(info)))
    try:
        EngineLoop(core, inbox, outbox, TorchProfiler(profiler_dir)).run()
    except RankStopped as e:          # said in one line: the traceback adds nothing
        log.error("%s", e)
        raise SystemExit(1) from None
    finally:
        _close(context, outbox, inbox)


def _install_signal_handlers() -> None:
    """Ctrl-C reaches the whole process group: the front end decides when the engine stops (it
    sends Shutdown), so the engine ignores SIGINT. SIGTERM ends it quietly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))


def _start(artifact_path: str, config: RuntimeConfig) -> tuple[EngineCore, EngineInfo]:
    from atom_aot.runtime.loading.compile_counter import compile_counts
    from atom_aot.runtime.assembly import start_core
    loaded, core = start_core(artifact_path, config)
    counts = compile_counts()
    log.info("engine ready (%s, %d KV blocks); startup %s; runtime compilations: %s", loaded.execution,
             core.block_manager.num_blocks, seconds_listed(loaded.timings), counts)
    info = EngineInfo(max_model_len=core.scheduler.config.max_model_len, vocab_size=loaded.model_config.vocab_size,
                      block_size=loaded.block_size, num_kv_blocks=core.block_manager.num_blocks,
                      execution=loaded.execution, build_key=loaded.manifest.build_key,
                      compile_counts=counts)
    return core, info


def _startup_message(error: Exception) -> str:
    from atom_aot.errors import USER_ERRORS
    if isinstance(error, USER_ERRORS):
        return str(error)
    return f"the engine failed to start: {type(error).__name__}: {error}\n{traceback.format_exc()}"


def _close(context: zmq.Context, *sockets: zmq.Socket) -> None:
    for sock in sockets:
        sock.close(linger=1000)
    context.term()


class Alone:
    """The pace of an engine that steps on its own: it agrees with itself (attention_dp.Lockstep's interface)."""

    @staticmethod
    def agree(busy: bool, stop: bool) -> tuple[bool, bool]:
        return busy, stop

    @staticmethod
    def step(step, has_work: bool) -> list:
        return step() if has_work else []


ALONE = Alone()


@dataclass
class PendingAdd:
    """An AddRequests call whose reply waits for its requests' grammars."""
    call_id: int
    waiting: set[str]                                   # request ids not admitted or refused yet
    admitted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    answered: bool = False


class EngineLoop:
    def __init__(self, core: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket, profiler: TorchProfiler):
        self.core = core
        self.inbox = inbox
        self.outbox = outbox
        self.profiler = profiler
        self.running = True
        self.steps = 0
        self._parent_checked = time.monotonic()
        self._last_heartbeat = 0.0
        # request type -> handler returning that type's reply (AddRequests, whose reply may come later: `_add`;
        # tests/test_engine_messages.py: every type is answered)
        self._handlers = {StartProfile: lambda _: ProfileStarted(self.profiler.start()),
                          StopProfile: lambda _: ProfileStopped(self.profiler.stop())}

    def run(self) -> None:
        import torch
        with torch.inference_mode():      # serving never needs autograd
            self._loop()

    def _loop(self) -> None:
        """Take messages (waiting for them only while no engine the pace knows of has work), agree on whether
        to step and whether to stop, step. An engine on its own agrees with itself; the ranks of a
        data-parallel-attention artifact agree with each other (runtime/attention_dp.Lockstep): they leave
        together, and step together while any of them has work."""
        self._heartbeat()                 # the first, right after Ready
        pace, anyone_busy = self.core.lockstep or ALONE, False
        while True:
            busy = self.core.has_unfinished()
            self._intake(block=not busy and not anyone_busy)
            anyone_busy, anyone_stops = pace.agree(self.core.has_unfinished(), not self.running)
            if anyone_stops:
                self.running = False
                return
            if anyone_busy:
                outputs = pace.step(self.core.step, self.core.has_unfinished())
                self.steps += 1
                if outputs:
                    self.outbox.send(encode(Outputs(outputs)))
            self._heartbeat(went_idle=busy and not self.core.has_unfinished())

    def _heartbeat(self, went_idle: bool = False) -> None:
        """Every HEARTBEAT_S, and at once when the engine goes idle (so idle numbers are exact)."""
        now = time.monotonic()
        if went_idle or now - self._last_heartbeat >= HEARTBEAT_S:
            self._last_heartbeat = now
            self.outbox.send(encode(Heartbeat(self.steps, self._stats())))

    def _intake(self, block: bool) -> None:
        if not self.inbox.poll(int(HEARTBEAT_S * 1000) if block else 0):
            self._check_parent()
            return
        while self.running:
            try:
                data = self.inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._handle(decode(data))
        self._check_parent()

    def _handle(self, message) -> None:
        if isinstance(message, Abort):
            for request_id in message.request_ids:
                self.core.abort(request_id, message.reason)
        elif isinstance(message, Call):
            reply = self._answer(message)
            if reply is not None:           # None: it is sent later (requests waiting for their grammars)
                self.outbox.send(encode(reply))
        elif isinstance(message, Shutdown):
            self.running = False
        elif not isinstance(message, Wake):
            log.warning("the engine ignores a message it does not know: %s", type(message).__name__)

    def _answer(self, call: Call) -> Reply | None:
        request = call.request
        try:
            if isinstance(request, AddRequests):
                return self._add(call.call_id, request)
            return Reply(call.call_id, result=self._handlers[type(request)](request))
        except (RequestError, ProfilerError) as e:      # the caller's fault: told, not logged
            code = "context_length_exceeded" if isinstance(e, ContextLengthError) else None
            return Reply(call.call_id, failure=Failure(str(e), rejected=True, code=code))
        except Exception as e:   # a bug in one request must not take the engine down
            log.exception("engine request %s failed", type(request).__name__)
            return Reply(call.call_id, failure=Failure(f"{type(e).__name__}: {e}"))

    def _add(self, call_id: int, request: AddRequests) -> Reply | None:
        """All or none: every request is checked before any is queued. One whose grammar is compiling is queued
        once it compiled (the engine steps meanwhile), and the reply waits for all of the call's requests: if a
        grammar does not compile, the call is refused and its other requests aborted. None: replied later."""
        for r in request.requests:
            self.core.check(r.prompt_token_ids, r.params)
        pending = PendingAdd(call_id, {r.request_id for r in request.requests})
        try:
            for r in request.requests:
                self.core.add_checked(r.prompt_token_ids, r.params, r.request_id, r.arrival_time,
                                      on_admitted=functools.partial(self._admitted, pending, r.request_id))
        except BaseException:
            pending.answered = True     # the caller answers with the error
            raise
        return None

    def _admitted(self, pending: PendingAdd, request_id: str, error: str | None) -> None:
        pending.waiting.discard(request_id)
        if error is None:
            pending.admitted.append(request_id)
        else:
            pending.errors.append(error)
        if pending.waiting or pending.answered:
            return
        pending.answered = True
        if not pending.errors:
            self.outbox.send(encode(Reply(pending.call_id, result=Added(len(pending.admitted)))))
            return
        for admitted in pending.admitted:
            self.core.abort(admitted)
        self.outbox.send(encode(Reply(pending.call_id, failure=Failure(pending.errors[0], rejected=True))))

    def _stats(self) -> EngineStats:
        from atom_aot.runtime.loading.compile_counter import compile_counts
        return EngineStats(self.core.stats(), compile_counts())

    def _check_parent(self) -> None:
        now = time.monotonic()
        if now - self._parent_checked < PARENT_CHECK_S:
            return
        self._parent_checked = now
        parent = multiprocessing.parent_process()
        if parent is not None and not parent.is_alive():
            log.warning("the front end went away; the engine stops")
            self.running = False
