"""Requests as the HTTP handlers see them: submit token ids, read text updates, abort.

Detokenization and stop strings run here, in the front end (the shared `OutputProcessor`), so
the engine process only ever moves token ids. One API call (n choices, several prompts) is a
`RequestGroup`: its engine requests feed one queue, read as (choice index, update).
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Protocol

from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.output_processor import OutputProcessor, RequestOutput
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.server.engine_client import EngineClient, EngineDeadError
from atom_aot.server.messages import Abort, AddRequests, NewRequest


class RequestObserver(Protocol):
    """Told how requests end (the metrics)."""

    def finished(self, update: RequestOutput) -> None: ...

    def aborted(self, count: int) -> None: ...


class RequestGroup:
    """The engine requests behind one API call; iterate for (choice index, update) until all finish."""

    def __init__(self, engine: "AsyncEngine", request_ids: list[str]):
        self.engine = engine
        self.request_ids = request_ids
        self.index = {request_id: i for i, request_id in enumerate(request_ids)}
        self.unfinished = set(request_ids)
        self.queue: asyncio.Queue = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        while self.unfinished:
            item = await self.queue.get()
            if isinstance(item, Exception):
                raise item
            if item.finished:
                self.unfinished.discard(item.request_id)
            yield self.index[item.request_id], item

    def close(self) -> None:
        """Abort what has not finished (the client went away, or the handler failed). Never blocks."""
        if self.unfinished:
            self.engine.abort(sorted(self.unfinished))
            self.unfinished.clear()


class AsyncEngine:
    def __init__(self, client: EngineClient, tokenizer, observer: RequestObserver | None = None):
        self.client = client
        self.processor = OutputProcessor(tokenizer, abort_in_core=self._abort_stopped)
        self.observer = observer
        self._groups: dict[str, RequestGroup] = {}
        client.listen(self._route, self._fail_all)

    @property
    def dead(self) -> bool:
        return self.client.dead

    async def submit(self, request_ids: list[str], prompts: list[list[int]], params: list[SamplingParams],
                     arrival_time: float) -> RequestGroup:
        """Queue one engine request per choice; returns once the engine took them all (or raises
        CallRejected with its reason, having queued none)."""
        group = RequestGroup(self, request_ids)
        for request_id, prompt, p in zip(request_ids, prompts, params):
            self.processor.add_request(request_id, prompt, p)
            self._groups[request_id] = group
        news = [NewRequest(i, prompt, p, arrival_time) for i, prompt, p in zip(request_ids, prompts, params)]
        try:
            await self.client.call(AddRequests(news))
        except BaseException:      # rejected, or cancelled while the engine may still add them
            self._forget(request_ids)
            self.client.send(Abort(list(request_ids)))
            group.unfinished.clear()
            raise
        return group

    def abort(self, request_ids: list[str]) -> None:
        self._forget(request_ids)
        self.client.send(Abort(list(request_ids)))
        if self.observer is not None:
            self.observer.aborted(len(request_ids))

    def _forget(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.processor.abort(request_id)
            self._groups.pop(request_id, None)

    def _abort_stopped(self, request_ids: list[str]) -> None:
        self.client.send(Abort(request_ids, reason="stop"))

    def _route(self, outputs: list[CoreOutput]) -> None:
        for update in self.processor.process(outputs):
            group = self._groups.get(update.request_id)
            if group is None:
                continue
            if update.finished:
                del self._groups[update.request_id]
                if self.observer is not None:
                    self.observer.finished(update)
            group.queue.put_nowait(update)

    def _fail_all(self) -> None:
        error = EngineDeadError("the engine process exited while this request was running")
        for group in set(self._groups.values()):
            group.queue.put_nowait(error)
        for request_id in list(self._groups):
            self.processor.abort(request_id)
        self._groups.clear()
