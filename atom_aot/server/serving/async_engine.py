"""Requests as the HTTP handlers see them: submit token ids, read text updates, abort.

Detokenization and stop strings run here, in the front end (the shared `OutputProcessor`), so
the engine process only ever moves token ids. One API call (n choices, several prompts) is a
`RequestGroup`, read as (choice index, update) until all its requests finish.

A group's buffer is bounded: it holds at most one unread update per engine request, and a later
update is merged into it (text, tokens and logprobs appended), so a reader that falls behind
gets bigger pieces, never a longer queue. A reader that takes nothing for
`stalled_stream_timeout` seconds while output waits (a streaming client that stopped reading
blocks its response's sends) is stalled: its requests are aborted in the engine, which frees
their KV blocks, and it reads an error after what was pending.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import AsyncIterator, Protocol

from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.processes.client import EngineClient
from atom_aot.runtime.processes.messages import Abort, AddRequests, NewRequest
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.text.output_processor import OutputProcessor, RequestOutput
from atom_aot.server.protocol.errors import APIError, engine_unavailable, overloaded, stream_stalled

log = logging.getLogger("atom_aot.server")


class RequestObserver(Protocol):
    """Told how requests end (the metrics)."""

    def finished(self, update: RequestOutput) -> None: ...

    def aborted(self, count: int) -> None: ...


def merged(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One update that says what two successive updates of a request say."""
    return dataclasses.replace(
        later, delta_text=earlier.delta_text + later.delta_text,
        new_token_ids=earlier.new_token_ids + later.new_token_ids, logprobs=earlier.logprobs + later.logprobs,
        prompt_logprobs=earlier.prompt_logprobs if earlier.prompt_logprobs is not None else later.prompt_logprobs)


class RequestGroup:
    """The engine requests behind one API call; iterate for (choice index, update) until all finish."""

    def __init__(self, engine: "AsyncEngine", request_ids: list[str]):
        self.engine = engine
        self.request_ids = request_ids
        self.index = {request_id: i for i, request_id in enumerate(request_ids)}
        self.unfinished = set(request_ids)          # still running in the engine
        self._pending: dict[str, RequestOutput] = {}
        self._error: APIError | None = None
        self._ready = asyncio.Event()
        self.unread_since: float | None = None      # monotonic time the oldest unread update came

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        while True:
            if self._pending:
                batch, self._pending, self.unread_since = self._pending, {}, None
                for request_id, update in batch.items():
                    yield self.index[request_id], update
            elif self._error is not None:
                raise self._error
            elif not self.unfinished:
                return
            else:
                self._ready.clear()
                await self._ready.wait()

    def put(self, update: RequestOutput) -> None:
        if update.finished:
            self.unfinished.discard(update.request_id)
        earlier = self._pending.get(update.request_id)
        self._pending[update.request_id] = update if earlier is None else merged(earlier, update)
        if self.unread_since is None:
            self.unread_since = time.monotonic()
        self._ready.set()

    def stalled(self, now: float, timeout: float) -> bool:
        """Output has waited unread for `timeout` seconds while requests still run."""
        return bool(self.unfinished) and self.unread_since is not None and now - self.unread_since > timeout

    def fail(self, error: APIError) -> None:
        """Stop the call: abort what the engine still runs; the reader gets what is pending, then `error`."""
        self._error = error
        self._abort()
        self._ready.set()

    def close(self) -> None:
        """The response ended (or never will start): abort what has not finished. Never blocks."""
        self._abort()
        self.engine.open_groups.discard(self)

    def _abort(self) -> None:
        if self.unfinished:
            self.engine.abort(sorted(self.unfinished))
            self.unfinished.clear()


class AsyncEngine:
    def __init__(self, client: EngineClient, tokenizer, observer: RequestObserver | None = None,
                 max_queued_seqs: int = 4096, stalled_stream_timeout: float = 30.0):
        self.client = client
        self.processor = OutputProcessor(tokenizer, abort_in_core=self._abort_stopped)
        self.observer = observer
        self.max_queued_seqs = max_queued_seqs
        self.stalled_stream_timeout = stalled_stream_timeout
        self._groups: dict[str, RequestGroup] = {}     # engine request id -> its group, until it finishes
        self.open_groups: set[RequestGroup] = set()    # API calls whose response has not ended
        self.refusal: APIError | None = None           # once set (shutting down), why submit refuses
        client.listen(self._route, self._fail_all)

    @property
    def dead(self) -> bool:
        return self.client.dead

    @property
    def num_queued_seqs(self) -> int:
        """Sequences submitted to the engine and not finished (running or waiting there)."""
        return len(self._groups)

    async def submit(self, request_ids: list[str], prompts: list[list[int]], params: list[SamplingParams],
                     arrival_time: float) -> RequestGroup:
        """Queue one engine request per choice; returns once the engine took them all (or raises
        CallRejected with its reason, having queued none). A full engine is an `overloaded` error."""
        if self.refusal is not None:
            raise self.refusal
        if self.dead:
            raise engine_unavailable()
        if self.num_queued_seqs + len(request_ids) > self.max_queued_seqs:
            raise overloaded(self.num_queued_seqs, len(request_ids), self.max_queued_seqs)
        group = RequestGroup(self, request_ids)
        for request_id, prompt, p in zip(request_ids, prompts, params):
            self.processor.add_request(request_id, prompt, p)
            self._groups[request_id] = group
        self.open_groups.add(group)
        news = [NewRequest(i, prompt, p, arrival_time) for i, prompt, p in zip(request_ids, prompts, params)]
        try:
            await self.client.call(AddRequests(news))
        except BaseException:      # rejected, or cancelled while the engine may still add them
            self._forget(request_ids)
            self.client.send(Abort(list(request_ids)))
            group.unfinished.clear()
            self.open_groups.discard(group)
            raise
        return group

    def abort(self, request_ids: list[str]) -> None:
        self._forget(request_ids)
        self.client.send(Abort(list(request_ids)))
        if self.observer is not None:
            self.observer.aborted(len(request_ids))

    def refuse_new(self, error: APIError) -> None:
        """From now on submit raises `error` (the server is shutting down)."""
        self.refusal = error

    def fail_open(self, error: APIError) -> None:
        """Answer every call whose response has not ended with `error`, aborting what still runs."""
        for group in list(self.open_groups):
            group.fail(error)

    def _forget(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.processor.abort(request_id)
            self._groups.pop(request_id, None)

    def _abort_stopped(self, request_ids: list[str]) -> None:
        self.client.send(Abort(request_ids, reason="stop"))

    def _route(self, outputs: list[CoreOutput]) -> None:
        now = time.monotonic()
        for update in self.processor.process(outputs):
            group = self._groups.get(update.request_id)
            if group is None:
                continue
            if update.finished:
                del self._groups[update.request_id]
                if self.observer is not None:
                    self.observer.finished(update)
            group.put(update)
            if group.stalled(now, self.stalled_stream_timeout):
                self._stall(group)

    def _stall(self, group: RequestGroup) -> None:
        log.warning("aborting %d running request(s) of a call (its first: %s): the client left its output unread "
                    "for more than %.0fs (--stalled-stream-timeout)", len(group.unfinished), group.request_ids[0],
                    self.stalled_stream_timeout)
        group.fail(stream_stalled(self.stalled_stream_timeout))

    def _fail_all(self) -> None:
        self.fail_open(engine_unavailable("the engine process exited while this request was running"))
        for request_id in list(self._groups):
            self.processor.abort(request_id)
        self._groups.clear()
