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
from atom_aot.runtime.processes.data_parallel import DataParallelClient
from atom_aot.runtime.processes.messages import Abort, AddRequests, NewRequest
from atom_aot.runtime.sampling_params import SamplingParams


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
    from atom_aot.runtime.processes.data_parallel import _summed
    from atom_aot.runtime.processes.messages import EngineStats, Heartbeat
    from atom_aot.runtime.outputs import SpecCounters

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


class TestPrefixRouting:
    def test_a_known_prefix_goes_back_to_its_engine(self):
        from atom_aot.runtime.processes.prefix_routing import PrefixRouter
        router = PrefixRouter(2, block_size=4)
        shared = list(range(10, 22))                               # three full blocks
        assert router.choose(shared + [1], [0, 0]) == 0
        assert router.choose(list(range(50, 62)), [1, 0]) == 1     # unknown: the least loaded
        assert router.choose(shared + [2, 3], [3, 0]) == 0          # known: its engine, though busier
        assert router.choose(shared[:8] + [99] * 4, [1, 0]) == 0    # two of its blocks: still there
        assert router.routed_by_prefix == 2

    def test_an_engine_much_busier_than_the_least_loaded_is_passed_over(self):
        from atom_aot.runtime.processes.prefix_routing import PrefixRouter
        router = PrefixRouter(2, block_size=4, slack=2)
        prompt = list(range(16))
        assert router.choose(prompt, [0, 0]) == 0
        assert router.choose(prompt, [2, 0]) == 0
        assert router.choose(prompt, [3, 0]) == 1                   # more than `slack` over: the idle one
        assert router.choose(prompt, [3, 3]) == 1                   # and the prefix now lives there too

    def test_memory_is_bounded_oldest_first(self):
        from atom_aot.runtime.processes.prefix_routing import PrefixRouter
        router = PrefixRouter(2, block_size=2, max_entries=4)
        router.choose([1, 2, 3, 4], [0, 0])
        router.choose([5, 6, 7, 8, 9, 10, 11, 12], [0, 1])            # 4 blocks: the first two go
        assert len(router.owner) == 4
        assert router.choose([1, 2, 3, 4], [1, 0]) == 1            # forgotten: least loaded

    def test_the_client_routes_a_call_by_its_first_prompt(self):
        from atom_aot.runtime.processes.prefix_routing import PrefixRouter
        replicas = [FakeReplica(), FakeReplica()]
        client = DataParallelClient(replicas)
        client.router = PrefixRouter(2, block_size=2)
        news = [NewRequest("a", [7, 8, 9, 10], SamplingParams(), 0.0)]
        asyncio.run(client.call(AddRequests(news)))
        asyncio.run(client.call(AddRequests([NewRequest("b", [1, 2], SamplingParams(), 0.0)])))
        asyncio.run(client.call(AddRequests([NewRequest("c", [7, 8, 9, 10, 11], SamplingParams(), 0.0)])))
        assert replicas[0].added == ["a", "c"] and replicas[1].added == ["b"]


@pytest.mark.parametrize("routing, expected_hits", [("prefix", 3 * 4 * 4), ("load", 3 * 4 * 4 - 2 * 4)])
def test_prefix_routing_keeps_each_prefix_where_it_is_cached(tiny_llama_eager_artifact, tmp_path, routing,
                                                             expected_hits):
    """Four 64-token prefixes (4 blocks each) are seeded by long requests started 0.1 s apart, so each is
    routed while the others run: two on each replica. Then three follow-ups per prefix, one at a time.
    Routed by load, every follow-up goes to replica 0 (both idle: the first), so the first follow-up of
    each prefix seeded on replica 1 misses its 4 blocks; routed by prefix, every follow-up finds them.
    The counts are the replicas' prefix-cache hits, summed in /metrics."""
    from test_server_support import metric
    from atom_aot.artifact.reader import Artifact
    server = ServerProcess(tiny_llama_eager_artifact, tmp_path, "-dp", "2", "--dp-routing", routing,
                           api_key=None).wait_healthy()
    try:
        model = Artifact.open(tiny_llama_eager_artifact).manifest.model.name
        prefixes = [[(p * 37 + i) % 200 + 3 for i in range(64)] for p in range(4)]

        def complete(prompt, max_tokens=2):
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).status_code == 200
        with ThreadPoolExecutor(4) as pool:
            seeds = []
            for prefix in prefixes:
                seeds.append(pool.submit(complete, prefix + [250, 251, 252], 300))
                time.sleep(0.1)
            [seed.result() for seed in seeds]
        hits_before = _hits(server, metric)
        for k in range(3):
            for p, prefix in enumerate(prefixes):
                complete(prefix + [240 + k, p + 3, 7])
        assert _hits(server, metric) - hits_before == expected_hits
    finally:
        server.stop()


def _hits(server, metric) -> float:
    """The replicas' prefix-cache hits once their heartbeats have caught up (sent when they go idle)."""
    time.sleep(1.0)
    return metric(httpx.get(f"{server.url}/metrics").text, "atom_prefix_cache_hits_total")


def test_dp_routing_with_one_engine_is_refused_by_name(tiny_llama_eager_artifact):
    from atom_aot.artifact.reader import Artifact
    from atom_aot.errors import StartupError
    from atom_aot.server.args import engine_client, parse_args, runtime_config
    manifest = Artifact.open(tiny_llama_eager_artifact).manifest
    args = parse_args([str(tiny_llama_eager_artifact), "--dp-routing", "load"])
    with pytest.raises(StartupError, match="--dp-routing load: this server runs one engine"):
        engine_client(args, runtime_config(args), manifest)
    for argv, routing in ((["-dp", "2", "--dp-routing", "load"], "load"), (["-dp", "2"], "prefix")):
        args = parse_args([str(tiny_llama_eager_artifact), *argv])
        client = engine_client(args, runtime_config(args), manifest)
        try:
            assert client.routing == routing
        finally:
            asyncio.run(client.shutdown())           # never started: releases its sockets and folders
