"""The front end's request flow without an engine process: a fake client stands in for it.
Bounded output buffers (a slow reader gets merged updates), stalled readers aborted, the engine's
queue bound (429), shutdown refusals, engine death, and health routes that never ask the engine."""
from __future__ import annotations

import asyncio

import pytest
from factories import make_tokenizer
from fastapi.testclient import TestClient

from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.processes.client import EngineStatus
from atom_aot.runtime.processes.messages import Abort, Added, EngineInfo
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.server.app import build_app
from atom_aot.server.lifecycle.metrics import ServerMetrics
from atom_aot.server.options import ServerOptions
from atom_aot.server.protocol.errors import APIError, shutting_down
from atom_aot.server.serving.async_engine import AsyncEngine
from atom_aot.server.state import ServerState


class FakeClient:
    """The EngineClient surface the front end uses; `call` takes any AddRequests at once."""

    def __init__(self):
        self.dead = False
        self.sent: list = []
        self.calls = 0

    def listen(self, on_outputs, on_death) -> None:
        self.emit, self.die = on_outputs, on_death

    def send(self, message) -> bool:
        self.sent.append(message)
        return True

    async def call(self, request, timeout=None):
        self.calls += 1
        return Added(len(request.requests))

    def status(self) -> EngineStatus:
        return EngineStatus(alive=not self.dead, heartbeat=None, heartbeat_age_s=None)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer(folder)
    return load_tokenizer(folder)


def engine_of(tokenizer, **options) -> tuple[AsyncEngine, FakeClient]:
    client = FakeClient()
    return AsyncEngine(client, tokenizer, **options), client


async def submit(engine: AsyncEngine, *ids: str):
    return await engine.submit(list(ids), [[3, 4]] * len(ids), [SamplingParams(max_tokens=50)] * len(ids), 0.0)


def test_a_reader_that_falls_behind_gets_one_merged_update_per_request(tokenizer):
    tokens = tokenizer("Hello world! How are you", add_special_tokens=False).input_ids

    async def run():
        engine, client = engine_of(tokenizer)
        group = await submit(engine, "a", "b")
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            client.emit([CoreOutput("a", [token], finish_reason="length" if last else None),
                         CoreOutput("b", [token], finish_reason="length" if last else None)])
            assert len(group._pending) <= 2          # the buffer does not grow with the tokens
        return [update async for _, update in group]

    updates = asyncio.run(run())
    assert [u.request_id for u in updates] == ["a", "b"]
    for update in updates:
        assert update.new_token_ids == tokens and update.delta_text == update.text == "Hello world! How are you"
        assert update.finished and update.finish_reason == "length"


def test_a_stalled_reader_has_its_requests_aborted_and_then_reads_an_error(tokenizer):
    async def run():
        engine, client = engine_of(tokenizer, stalled_stream_timeout=0.05)
        group = await submit(engine, "a")
        client.emit([CoreOutput("a", [5])])
        await asyncio.sleep(0.1)                     # nobody reads
        client.emit([CoreOutput("a", [6])])          # the engine is still generating: it is stopped now
        client.emit([CoreOutput("a", [7])])          # already in flight: dropped
        seen = []
        with pytest.raises(APIError) as info:
            async for _, update in group:
                seen.append(update)
        return client.sent, seen, info.value, engine

    sent, seen, error, engine = asyncio.run(run())
    assert [m.request_ids for m in sent if isinstance(m, Abort)] == [["a"]]
    assert len(seen) == 1 and seen[0].new_token_ids == [5, 6]     # what was pending, then the error
    assert error.code == "stream_stalled" and "--stalled-stream-timeout" in error.message
    assert engine.num_queued_seqs == 0


def test_a_full_engine_answers_429_with_retry_after_and_queues_nothing(tokenizer):
    async def run():
        engine, client = engine_of(tokenizer, max_queued_seqs=3)
        await submit(engine, "a", "b")
        with pytest.raises(APIError) as info:
            await submit(engine, "c", "d")
        return info.value, client.calls, engine.num_queued_seqs

    error, calls, queued = asyncio.run(run())
    assert error.status == 429 and error.code == "overloaded" and error.headers == {"Retry-After": "1"}
    assert "--max-queued-seqs" in error.message and (calls, queued) == (1, 2)


def test_at_shutdown_open_calls_get_the_error_and_new_ones_are_refused(tokenizer):
    async def run():
        engine, client = engine_of(tokenizer)
        group = await submit(engine, "a")
        engine.refuse_new(shutting_down())
        engine.fail_open(shutting_down())
        with pytest.raises(APIError) as running:
            [u async for u in group]
        with pytest.raises(APIError) as new:
            await submit(engine, "b")
        group.close()
        return running.value, new.value, client, engine

    running, new, client, engine = asyncio.run(run())
    assert running.code == new.code == "server_shutting_down" and running.status == 503
    assert [m.request_ids for m in client.sent if isinstance(m, Abort)] == [["a"]]
    assert not engine.open_groups


def test_engine_death_answers_every_open_call(tokenizer):
    async def run():
        engine, client = engine_of(tokenizer)
        group = await submit(engine, "a", "b")
        client.emit([CoreOutput("a", [5])])
        client.dead = True
        client.die()
        with pytest.raises(APIError) as info:
            [u async for u in group]
        return info.value

    error = asyncio.run(run())
    assert error.status == 503 and error.code == "engine_unavailable"


@pytest.fixture
def app_state(tokenizer):
    engine, client = engine_of(tokenizer)
    info = EngineInfo(max_model_len=64, vocab_size=100, block_size=16, num_kv_blocks=8, execution="eager",
                      build_key="k")
    return ServerState(engine=engine, tokenizer=tokenizer, info=info, model_name="m", metrics=ServerMetrics(),
                       options=ServerOptions()), client


def test_health_ready_and_metrics_answer_without_asking_the_engine(app_state):
    state, client = app_state
    http = TestClient(build_app(state))
    assert http.get("/health").json() == {"status": "ok"} and http.get("/ping").status_code == 200
    assert http.get("/ready").json()["status"] == "ready"
    assert "atom_engine_alive 1.0" in http.get("/metrics").text
    state.draining = True
    ready = http.get("/ready")
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "server_shutting_down"
    assert http.get("/health").status_code == 200        # draining is not dying
    client.dead = True
    assert http.get("/health").status_code == 503 and "atom_engine_alive 0.0" in http.get("/metrics").text
    assert client.calls == 0


@pytest.mark.parametrize("options, words", [
    (dict(max_n=0), "--max-n must be an integer >= 1"),
    (dict(shutdown_timeout=0), "--shutdown-timeout must be a number of seconds > 0"),
    (dict(max_seqs_per_request=100, max_queued_seqs=10), "must not exceed max_queued_seqs"),
])
def test_bad_server_options_name_their_flag(options, words):
    with pytest.raises(ValueError, match=words):
        ServerOptions(**options)
