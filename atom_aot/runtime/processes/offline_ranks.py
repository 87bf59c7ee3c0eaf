"""The offline engine on a data-parallel-attention artifact (`atom-build -dp N --ep`): its N ranks are
engine cores of their own, stepping together (runtime/parallel/attention_dp.py), so they run as the server runs
them, in N engine processes behind the server's `DataParallelClient` (routing included); `RemoteRanks`
drives that client synchronously from an event loop on a background thread, with the interface
`ArtifactEngine` uses of an in-process `EngineCore` (validate, add_checked, abort, step, has_unfinished, close).
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from atom_aot.artifact.reader import Artifact
from atom_aot.errors import ContextLengthError, RankStopped, RequestError
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.engine.engine_core import check_prompt
from atom_aot.runtime.outputs import CoreOutput, SpecCounters
from atom_aot.runtime.processes.client import CallRejected
from atom_aot.runtime.processes.data_parallel import attention_dp_client
from atom_aot.runtime.processes.messages import HEARTBEAT_S, Abort, AddRequests, NewRequest
from atom_aot.runtime.sampling_params import SamplingParams

STEP_WAIT_S = 0.05        # how long `step` waits for the ranks' next outputs before returning none
STARTUP_TIMEOUT_S = 600.0


@dataclass
class RemoteLoaded:
    """What the offline engine reports of a load that happened in the ranks' processes."""
    execution: str
    timings: dict[str, float] = field(default_factory=dict)


class RemoteRanks:
    def __init__(self, artifact_path: str | Path, config: RuntimeConfig, log_level: str = "warning"):
        world = Artifact.open(artifact_path).manifest.layout.world_size
        self.client = attention_dp_client(str(artifact_path), config, world, None, log_level)
        self.outputs: queue.Queue[list[CoreOutput]] = queue.Queue()
        self.unfinished: set[str] = set()
        self.died = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="atom-dp-ranks", daemon=True)
        self.thread.start()
        start = time.perf_counter()
        try:
            self.info = self._run(self.client.start(STARTUP_TIMEOUT_S))
        except BaseException:
            self._run(self.client.shutdown())
            self._stop_loop()
            raise
        self.client.listen(self.outputs.put, self.died.set)
        self.loaded = RemoteLoaded(f"{self.info.execution}, {world} data-parallel ranks in their own processes",
                                   {"ranks started": time.perf_counter() - start})
        self._outputs_at = time.monotonic()      # when the latest outputs came (`spec_counters` waits past it)

    @property
    def spec_counters(self) -> SpecCounters | None:
        """The ranks' speculative-decoding counters added up (None: speculation is off), from the heartbeats (each
        rank sends one when it goes idle, and every HEARTBEAT_S): it waits, a few heartbeats at most, until every
        rank's latest came after the latest outputs, so that the counters include the steps that made them."""
        deadline = time.monotonic() + 4 * HEARTBEAT_S
        while True:
            status = self.client.status()
            beat, now = status.heartbeat, time.monotonic()
            if beat is not None and (now - status.heartbeat_age_s >= self._outputs_at or now > deadline):
                return beat.stats.core.spec
            if now > deadline:
                return None
            time.sleep(HEARTBEAT_S / 5)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """The checks that need no rank (empty, vocabulary, context), so that LLMEngine.add_request refuses a
        call's prompts before queuing any; the ranks check the rest (grammars) as each request arrives."""
        check_prompt(prompt_token_ids, params, self.info.max_model_len, self.info.vocab_size)

    def add_checked(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                    arrival_time: float | None = None) -> str:
        """Send a request `validate` passed to the ranks, whose engine cores check the rest (grammars)."""
        request = AddRequests([NewRequest(request_id, list(prompt_token_ids), params,
                                          arrival_time or time.perf_counter())])
        try:
            self._run(self.client.call(request))
        except CallRejected as e:
            raise (ContextLengthError if e.code == "context_length_exceeded" else RequestError)(str(e)) from None
        self.unfinished.add(request_id)
        return request_id

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self.unfinished.discard(request_id)
        self.loop.call_soon_threadsafe(self.client.send, Abort([request_id], reason))

    def has_unfinished(self) -> bool:
        return bool(self.unfinished)

    def step(self) -> list[CoreOutput]:
        """The outputs the ranks sent since the last call (waiting up to STEP_WAIT_S for the first)."""
        if self.died.is_set():
            raise RankStopped("an engine process of the data-parallel ranks exited; the engine cannot go on")
        try:
            outputs = list(self.outputs.get(timeout=STEP_WAIT_S))
        except queue.Empty:
            return []
        while not self.outputs.empty():
            outputs += self.outputs.get_nowait()
        self._outputs_at = time.monotonic()
        self.unfinished.difference_update(o.request_id for o in outputs if o.finish_reason is not None)
        return outputs

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self._run(self.client.shutdown())
        self._stop_loop()

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
