"""Data parallelism: `-dp N` serves N engine processes, each a whole replica, behind one front end
that sends each call to the replica with the fewest requests in flight."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from test_server_support import ServerProcess

from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.server.dp_client import DataParallelClient
from atom_aot.server.messages import Abort, AddRequests, NewRequest


class FakeReplica:
    """Stands in for an EngineClient: records what it was sent and takes every call."""

    def __init__(self):
        self.artifact_path, self.dead, self.sent, self.added = "a.atom", False, [], []
        self.exited = asyncio.Event()

    def send(self, message) -> bool:
        self.sent.append(message)
        return True

    async def call(self, request, timeout=None):
        self.added += [new.request_id for new in request.requests]
        return len(request.requests)


def add(client: DataParallelClient, *request_ids: str) -> None:
    news = [NewRequest(i, [1, 2], SamplingParams(), 0.0) for i in request_ids]
    asyncio.run(client.call(AddRequests(news)))


def finished(request_id: str) -> CoreOutput:
    return CoreOutput(request_id=request_id, new_token_ids=[3], finish_reason="stop", logprobs=[],
                      prompt_logprobs=None, num_prompt_tokens=2, num_cached_tokens=0, arrival_time=0.0,
                      first_token_time=0.0, finish_time=0.0)


class TestRouting:
    def test_each_call_goes_to_the_replica_with_the_fewest_requests_in_flight(self):
        replicas = [FakeReplica(), FakeReplica()]
        client = DataParallelClient(replicas)
        add(client, "a", "b")
        add(client, "c")
        add(client, "d")
        assert replicas[0].added == ["a", "b"] and replicas[1].added == ["c", "d"]

    def test_a_finished_request_frees_its_replica(self):
        replicas = [FakeReplica(), FakeReplica()]
        client = DataParallelClient(replicas)
        routed = []
        client.listen(routed.extend, lambda: None)
        add(client, "a", "b")
        add(client, "c")
        client._outputs_of(0)([finished("a"), finished("b")])
        add(client, "d")
        assert replicas[0].added == ["a", "b", "d"] and [o.request_id for o in routed] == ["a", "b"]

    def test_an_abort_reaches_only_the_replica_running_each_request(self):
        replicas = [FakeReplica(), FakeReplica()]
        client = DataParallelClient(replicas)
        add(client, "a")
        add(client, "b")
        client.send(Abort(["b", "a", "gone"]))
        assert replicas[0].sent == [Abort(["a"])] and replicas[1].sent == [Abort(["b"])]
        assert client.in_flight == [set(), set()]


@pytest.fixture
def dp2_server(tiny_llama_eager_artifact, tmp_path):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path, "-dp", "2", api_key=None)
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


def engine_processes(server: ServerProcess) -> list[str]:
    """The server's spawned engine processes (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    return [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_two_replicas_answer_concurrent_requests_alike(dp2_server, tiny_llama_eager_artifact):
    from atom_aot.artifact.reader import Artifact
    model = Artifact.open(tiny_llama_eager_artifact).manifest.model.name
    body = {"model": model, "prompt": "Hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": True}

    def complete(_):
        response = httpx.post(f"{dp2_server.url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"], response.json()["usage"]["prompt_tokens"]

    assert len(engine_processes(dp2_server)) == 2
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(complete, range(8)))
    assert len(set(answers)) == 1
    expected = f"atom_prompt_tokens_total {8 * answers[0][1]}.0"     # the replicas' counters, added up
    deadline = time.monotonic() + 10
    while expected not in httpx.get(f"{dp2_server.url}/metrics").text:
        assert time.monotonic() < deadline, httpx.get(f"{dp2_server.url}/metrics").text
        time.sleep(0.2)


def test_replica_heartbeats_add_up_counts_and_speculation_counters():
    from atom_aot.runtime.outputs import CoreStats
    from atom_aot.server.dp_client import _summed
    from atom_aot.server.messages import EngineStats, Heartbeat
    from atom_aot.spec.stats import SpecCounters

    def beat(steps, running, spec):
        core = CoreStats(num_running=running, num_waiting=1, kv_blocks_total=10, kv_blocks_free=4,
                         prefix_cache_queries=3, prefix_cache_hits=2, num_preemptions=0, prompt_tokens_total=7,
                         generation_tokens_total=5, synchronous_steps_total=1, spec=spec)
        return Heartbeat(steps, EngineStats(core, {"triton_jit": 0}))

    a = SpecCounters("ngram", 2, num_verified=3, proposed=[3, 2], accepted=[2, 1])
    b = SpecCounters("ngram", 2, num_verified=1, proposed=[1, 1], accepted=[1, 0])
    total = _summed([beat(4, 2, a), beat(6, 3, b)])
    assert total.steps == 10 and total.stats.core.num_running == 5 and total.stats.core.kv_blocks_free == 8
    assert total.stats.core.spec == SpecCounters("ngram", 2, 4, [4, 3], [3, 1])
    assert _summed([beat(1, 1, None), beat(1, 1, None)]).stats.core.spec is None
