"""The front end's end of the engine process: start it, talk to it, notice when it dies.

Transport only. Requests go out through a plain PUSH socket (sends never block: no high-water
mark, so an abort can be sent from a `finally` of a cancelled task); replies and outputs come
back on an asyncio PULL socket read by one task. A death is seen at once through the
process's sentinel, not by polling; the engine's heartbeats are kept as they come, so what
liveness and /metrics report never waits for the engine.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import zmq
import zmq.asyncio

from atom_aot.errors import StartupError
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.processes.engine_process import run_engine_process
from atom_aot.runtime.processes.messages import (Call, EngineInfo, EngineRequest, Heartbeat, Outputs, Ready, Reply, Shutdown,
                                      StartupFailed, decode, encode)
from atom_aot.runtime.profiler import TraceDir

log = logging.getLogger("atom_aot.server")
R = TypeVar("R")

SHUTDOWN_GRACE_S = 5.0


class EngineDeadError(Exception):
    """The engine process is gone; nothing more can be generated."""


class CallRejected(Exception):
    """The engine refused a request because of what was asked (a prompt too long, say)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class EngineCallError(Exception):
    """The engine failed to answer a request (a bug, not the caller's fault)."""


@dataclass(frozen=True)
class EngineStatus:
    """What the front end knows of the engine right now, without asking it."""
    alive: bool                        # the engine process is running
    heartbeat: Heartbeat | None        # the latest one (None before the first)
    heartbeat_age_s: float | None      # seconds since it came


class EngineClient:
    def __init__(self, artifact_path: str, config: RuntimeConfig, profiler_dir: str | TraceDir | None = None,
                 log_level: str = "info"):
        self.artifact_path = str(artifact_path)
        self.config = config
        self.profiler_dir = profiler_dir
        self.log_level = log_level
        self.process: multiprocessing.Process | None = None
        self.dead = False
        self._closed = False
        self._dir = Path(tempfile.mkdtemp(prefix="atom-ipc-"))
        self._sync_context = zmq.Context()
        self._async_context = zmq.asyncio.Context()
        self._push = self._sync_context.socket(zmq.PUSH)
        self._pull = self._async_context.socket(zmq.PULL)
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._reader: asyncio.Task | None = None
        self._on_outputs: Callable[[list[CoreOutput]], None] = lambda outputs: None
        self._on_death: Callable[[], None] = lambda: None
        self.exited = asyncio.Event()      # set when the engine process is seen to exit
        self._heartbeat: Heartbeat | None = None
        self._heartbeat_at = 0.0

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self, timeout: float = 600.0) -> EngineInfo:
        """Spawn the engine and wait until it has loaded the artifact (or says why it could not)."""
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.bind(f"ipc://{self._dir / 'inputs'}")
        self._pull.bind(f"ipc://{self._dir / 'outputs'}")
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(
            target=run_engine_process, name="atom-engine",
            args=(self.artifact_path, self.config, f"ipc://{self._dir / 'inputs'}",
                  f"ipc://{self._dir / 'outputs'}", self.profiler_dir, self.log_level))
        self.process.start()
        first = await self._first_message(timeout)
        if isinstance(first, StartupFailed):
            await asyncio.to_thread(self.process.join, SHUTDOWN_GRACE_S)
            raise StartupError(first.message)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.process.sentinel, self._engine_exited)
        self._reader = asyncio.create_task(self._read(), name="engine-reader")
        return first.info

    async def _first_message(self, timeout: float) -> Ready | StartupFailed:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self._pull.poll(500):
                return decode(await self._pull.recv())
            if not self.process.is_alive():
                raise StartupError(f"the engine process exited (code {self.process.exitcode}) before it was "
                                   f"ready; its log above says why")
        raise StartupError(f"the engine was not ready after {timeout:.0f}s")

    def listen(self, on_outputs: Callable[[list[CoreOutput]], None], on_death: Callable[[], None]) -> None:
        self._on_outputs, self._on_death = on_outputs, on_death

    def status(self) -> EngineStatus:
        age = None if self._heartbeat is None else time.monotonic() - self._heartbeat_at
        return EngineStatus(alive=self.process is not None and not self.dead, heartbeat=self._heartbeat,
                            heartbeat_age_s=age)

    async def shutdown(self) -> None:
        """Ask the engine to stop, then make sure it did; release sockets and the ipc folder.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.process is not None and self.process.pid is not None:
            self._forget_process()
            if self.process.is_alive():
                self.send(Shutdown())
                await asyncio.to_thread(self.process.join, SHUTDOWN_GRACE_S)
            if self.process.is_alive():
                self.process.kill()
                await asyncio.to_thread(self.process.join, SHUTDOWN_GRACE_S)
        if self._reader is not None:
            self._reader.cancel()
        self._push.close(linger=0)
        self._pull.close(linger=0)
        self._sync_context.term()
        self._async_context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _forget_process(self) -> None:
        try:
            asyncio.get_running_loop().remove_reader(self.process.sentinel)
        except (ValueError, OSError):
            pass

    # -- talking ----------------------------------------------------------------------------
    def send(self, message) -> bool:
        """Queue a message for the engine; never blocks. False if it could not be queued."""
        if self.dead:
            return False
        try:
            self._push.send(encode(message), zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    async def call(self, request: EngineRequest[R], timeout: float | None = None) -> R:
        """Ask the engine something and wait for its reply (the request type's reply type)."""
        if self.dead:
            raise EngineDeadError("the engine process is not running")
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            if not self.send(Call(call_id, request)):
                raise EngineDeadError("the engine process does not take messages")
            reply: Reply = await asyncio.wait_for(future, timeout)
        finally:
            self._calls.pop(call_id, None)
        failure = reply.failure
        if failure is not None:
            raise CallRejected(failure.message, failure.code) if failure.rejected else EngineCallError(failure.message)
        return reply.result

    async def _read(self) -> None:
        while True:
            self.receive(decode(await self._pull.recv()))
            await asyncio.sleep(0)    # a backlog of messages is read without yielding: let HTTP run between

    def receive(self, message: Outputs | Reply | Heartbeat) -> None:
        """Hand one message from the engine to whoever waits for it."""
        try:
            if isinstance(message, Outputs):
                self._on_outputs(message.outputs)
            elif isinstance(message, Heartbeat):
                self._heartbeat, self._heartbeat_at = message, time.monotonic()
            elif isinstance(message, Reply):
                future = self._calls.get(message.call_id)
                if future is not None and not future.done():
                    future.set_result(message)
        except Exception:   # a bug in routing must not stop every other request's outputs
            log.exception("failed to route an engine message")

    def _engine_exited(self) -> None:
        self._forget_process()
        self.dead = True
        self.process.join(1.0)
        log.error("the engine process exited (code %s)", self.process.exitcode)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDeadError("the engine process exited"))
        self._on_death()
        self.exited.set()
