"""When the server stops, and with which exit status.

SIGTERM or SIGINT drains: new requests get 503, in-flight ones get `--shutdown-timeout` seconds
to finish, then each is answered with an error (a stream gets an error event and `[DONE]`, a
whole response a JSON error); a second signal skips the wait. The server then exits 0. If the
engine process dies, in-flight requests get an error at once and the server exits with
EXIT_ENGINE_DIED, so a supervisor restarts it instead of keeping a front end that cannot serve.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvicorn

from atom_aot.server.protocol.errors import shutting_down
from atom_aot.server.state import ServerState

log = logging.getLogger("atom_aot.server")

EXIT_OK = 0
EXIT_ENGINE_DIED = 3
RESPONSE_FLUSH_S = 5.0      # after the last answers are given, how long uvicorn waits for them to be sent
# An idle keep-alive connection is closed after this long. Longer than clients' pool expiry (httpx 5 s,
# aiohttp 15 s) and load balancers' idle timeouts (60 s), so the client closes first: a request
# sent on a connection the server is just closing fails in the client (seen under load at uvicorn's 5 s).
KEEP_ALIVE_S = 65
DRAIN_POLL_S = 0.05


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling (it would stop at once, then re-raise the signal
    and end the process with it): `Lifecycle` decides when the server stops."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def uvicorn_config(app, host: str, port: int, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, loop="none", lifespan="off",
                          timeout_graceful_shutdown=RESPONSE_FLUSH_S, timeout_keep_alive=KEEP_ALIVE_S)


class Lifecycle:
    def __init__(self, state: ServerState, server: uvicorn.Server, shutdown_timeout: float):
        self.state = state
        self.server = server
        self.shutdown_timeout = shutdown_timeout
        self.exit_code = EXIT_OK
        self._drain: asyncio.Task | None = None
        self._skip_wait = asyncio.Event()
        self._engine_watch: asyncio.Task | None = None

    @contextlib.contextmanager
    def running(self):
        """Signals drain and a dead engine stops the server, while the block runs."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.on_signal, signum)
        self._engine_watch = asyncio.create_task(self._watch_engine(), name="engine-watch")
        try:
            yield self
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            self._engine_watch.cancel()

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._drain is not None:
            log.warning("%s again: answering the in-flight requests with an error now", name)
            self._skip_wait.set()
            return
        self.state.draining = True
        log.info("%s: draining; new requests get 503, the %d in flight get up to %.0fs to finish "
                 "(--shutdown-timeout)", name, len(self.state.engine.open_groups), self.shutdown_timeout)
        self._drain = asyncio.create_task(self._drain_then_stop(), name="drain")

    async def _drain_then_stop(self) -> None:
        engine = self.state.engine
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout
        while engine.open_groups and loop.time() < deadline and not self._skip_wait.is_set():
            await asyncio.sleep(DRAIN_POLL_S)
        engine.refuse_new(shutting_down())
        if engine.open_groups:
            log.warning("shutting down with %d request(s) unfinished: they are answered with an error",
                        len(engine.open_groups))
            engine.fail_open(shutting_down())
        self.server.should_exit = True

    async def _watch_engine(self) -> None:
        client = self.state.engine.client
        await client.exited.wait()
        self.exit_code = EXIT_ENGINE_DIED
        log.error("the server stops (exit status %d) because its engine process exited; in-flight requests "
                  "were answered with an error. A supervisor should restart it.", EXIT_ENGINE_DIED)
        self.server.should_exit = True
