"""The typed requests between the server's front end and its engine process, without a process:
an `EngineClient` whose messages go (pickled, as over ZMQ) to an `EngineLoop` on a fake core."""
from __future__ import annotations

import asyncio
import typing
from pathlib import Path

import pytest
from factories import make_tokenizer

from atom_aot.errors import ContextLengthError, RequestError
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.outputs import CoreOutput, CoreStats
from atom_aot.runtime.processes.client import CallRejected, EngineCallError, EngineClient
from atom_aot.runtime.processes.engine_process import EngineLoop
from atom_aot.runtime.processes.messages import (Added, AddRequests, Call, EngineRequest, Heartbeat, NewRequest, Outputs,
                                      StartProfile, StopProfile, decode, encode)
from atom_aot.runtime.processes.profiler import TorchProfiler
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.server.serving.async_engine import AsyncEngine

MAX_PROMPT = 8


class FakeCore:
    """The EngineCore methods the loop calls: prompts longer than MAX_PROMPT do not fit."""

    def __init__(self):
        self.added: list[str] = []
        self.aborted: list[tuple[str, str]] = []
        self.broken = False

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        num_prompt_tokens = len(prompt_token_ids)
        if num_prompt_tokens == 0:
            raise RequestError("the prompt is empty")
        if num_prompt_tokens > MAX_PROMPT:
            raise ContextLengthError(f"{num_prompt_tokens} tokens do not fit in {MAX_PROMPT}")

    def add_checked(self, prompt_token_ids, params, request_id, arrival_time, on_admitted) -> str:
        if self.broken:
            raise RuntimeError("a bug")
        self.added.append(request_id)
        on_admitted(None)
        return request_id

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self.aborted.append((request_id, reason))

    def stats(self) -> CoreStats:
        return CoreStats(num_running=len(self.added), num_waiting=0, kv_blocks_total=8, kv_blocks_free=8,
                         prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0,
                         prompt_tokens_total=0, generation_tokens_total=0)


class Outbox:
    def __init__(self):
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)


class Loopback:
    """A real EngineClient wired to a real EngineLoop in this process."""

    def __init__(self, profiler_dir=None):
        self.core = FakeCore()
        self.outbox = Outbox()
        self.loop = EngineLoop(self.core, inbox=None, outbox=self.outbox, profiler=TorchProfiler(profiler_dir))
        self.client = EngineClient("unused.atom", RuntimeConfig())
        self.client.send = self.send

    def send(self, message) -> bool:
        self.loop._handle(decode(encode(message)))
        replies, self.outbox.sent = self.outbox.sent, []
        for data in replies:
            asyncio.get_running_loop().call_soon(self.client.receive, decode(data))
        return True

    def emit(self, outputs: list[CoreOutput]) -> None:
        """The engine's step produced these."""
        self.client.receive(decode(encode(Outputs(outputs))))

    async def close(self) -> None:
        await self.client.shutdown()


def request(request_id: str, n_tokens: int) -> NewRequest:
    return NewRequest(request_id, list(range(3, 3 + n_tokens)), SamplingParams(), arrival_time=0.0)


def reply_type(request_type: type) -> type:
    [base] = [b for b in request_type.__orig_bases__ if typing.get_origin(b) is EngineRequest]
    return typing.get_args(base)[0]


def run(coroutine_fn):
    """Run `coroutine_fn(loopback)` on a fresh loopback and event loop."""
    async def main(loopback):
        try:
            return await coroutine_fn(loopback)
        finally:
            await loopback.close()
    return lambda loopback: asyncio.run(main(loopback))


def test_every_request_type_is_answered_with_its_declared_reply(tmp_path):
    requests = [AddRequests([request("a", 2)]), StartProfile(), StopProfile()]
    assert {type(r) for r in requests} == set(EngineRequest.__subclasses__())

    async def ask_all(loopback):
        return [await loopback.client.call(r) for r in requests]

    replies = run(ask_all)(Loopback(tmp_path))
    for r, reply in zip(requests, replies):
        assert isinstance(reply, reply_type(type(r))), (r, reply)
    assert replies[0] == Added(1)
    trace = Path(replies[2].trace)
    assert trace.parent == tmp_path / "rank_0" and trace.stat().st_size > 0


def test_the_heartbeat_carries_the_stats_and_the_client_keeps_the_latest():
    """The engine pushes its numbers; the front end's status never asks for them."""
    loopback = Loopback()

    async def beat(loopback):
        assert loopback.client.status().heartbeat is None
        loopback.loop._handle(decode(encode(Call(0, AddRequests([request("a", 2)])))))
        loopback.loop.steps = 7
        loopback.loop._heartbeat()
        loopback.loop._heartbeat()            # within HEARTBEAT_S of the first: not sent
        [data] = loopback.outbox.sent[1:]
        loopback.client.receive(decode(data))
        return loopback.client.status()

    status = run(beat)(loopback)
    assert isinstance(status.heartbeat, Heartbeat) and status.heartbeat.steps == 7
    assert status.heartbeat.stats.core.num_running == 1 and set(status.heartbeat.stats.compile_counts) >= {"triton_jit"}
    assert 0 <= status.heartbeat_age_s < 5


def test_a_request_that_does_not_fit_is_rejected_with_its_openai_code_and_none_is_queued():
    loopback = Loopback()

    async def add(loopback):
        with pytest.raises(CallRejected) as info:
            await loopback.client.call(AddRequests([request("ok", 2), request("long", MAX_PROMPT + 1)]))
        return info.value

    rejection = run(add)(loopback)
    assert rejection.code == "context_length_exceeded" and "do not fit" in str(rejection)
    assert loopback.core.added == []


def test_other_refusals_have_no_code_and_engine_bugs_are_not_refusals():
    loopback = Loopback()
    loopback.core.broken = True

    async def ask(loopback):
        with pytest.raises(CallRejected) as empty:
            await loopback.client.call(AddRequests([request("empty", 0)]))
        with pytest.raises(CallRejected, match="--torch-profiler-dir"):
            await loopback.client.call(StartProfile())
        with pytest.raises(EngineCallError, match="RuntimeError: a bug"):
            await loopback.client.call(AddRequests([request("breaks", 2)]))
        return empty.value

    assert run(ask)(loopback).code is None


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer(folder)
    return load_tokenizer(folder)


@pytest.mark.parametrize("core_finishes", [False, True], ids=["running", "finished-by-the-core"])
def test_a_stop_string_seen_by_the_front_end_aborts_the_request_in_the_engine(tokenizer, core_finishes):
    loopback = Loopback()
    tokens = tokenizer("Hello world! How", add_special_tokens=False).input_ids

    async def stream(loopback):
        engine = AsyncEngine(loopback.client, tokenizer)
        group = await engine.submit(["r"], [[3, 4]], [SamplingParams(stop_strings=["How"])], arrival_time=0.0)
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            loopback.emit([CoreOutput("r", [token], finish_reason="length" if core_finishes and last else None)])
        return [update async for _, update in group]

    updates = run(stream)(loopback)
    assert (updates[-1].finish_reason, updates[-1].text) == ("stop", "Hello world! ")
    assert loopback.core.aborted == ([] if core_finishes else [("r", "stop")])
