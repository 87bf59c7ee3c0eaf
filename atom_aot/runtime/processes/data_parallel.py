"""Data parallelism: N engine processes, each with a whole replica of the model, behind one front end.

`DataParallelClient` has `EngineClient`'s interface, so the server runs on it unchanged. It sends
each API call's requests (`AddRequests`) to the replica holding the longest known prefix of its
prompt unless that one is much busier (`--dp-routing prefix`, the default: prefix_routing.py), or to
the replica with the fewest requests in flight (`--dp-routing load`), and an abort to whichever
replica runs each request; their outputs come back through the one router. A
replica that dies takes the server down, as a single engine's death does. Calls other than adding
requests (profiling) go to every replica; the first one's answer is returned. Each engine profiles
under its own ranks: replica i of N ranks each writes rank_<i*N + r>/, rank r of a data-parallel-
attention artifact rank_<r>/ (runtime/profiler.py).

On GPUs each replica sees its own GPUs (CUDA_VISIBLE_DEVICES, `world_size` of them per replica).

An artifact built with data-parallel attention (`atom-build -dp N --ep`) is served the same way by
its N ranks: each engine process is one rank (torchrun's variables set at its spawn; on GPUs rank r
uses GPU r), the ranks step together (runtime/parallel/attention_dp.py), and a call's requests wake every
rank, not only the one that runs them.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
from typing import Callable, Iterator, TypeVar

from atom_aot.distributed.group import RankPlace
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.outputs import CoreOutput, CoreStats
from atom_aot.runtime.processes.client import EngineClient, EngineStatus
from atom_aot.runtime.processes.messages import Abort, AddRequests, EngineInfo, EngineRequest, EngineStats, Heartbeat, Wake
from atom_aot.runtime.processes.prefix_routing import ROUTINGS, PrefixRouter
from atom_aot.runtime.profiler import TraceDir

R = TypeVar("R")


def attention_dp_client(artifact_path: str, config: RuntimeConfig, world_size: int, profiler_dir: str | None,
                        log_level: str, routing: str = "prefix") -> "DataParallelClient":
    """The engine processes of a data-parallel-attention artifact's ranks, placed on this machine (rank r on
    GPU r, meeting on a free port of 127.0.0.1), behind one client (the server's, and the offline engine's)."""
    leader = RankPlace.local_leader(world_size)
    ranks = [EngineClient(artifact_path, config, trace_dir(profiler_dir, r), log_level) for r in range(world_size)]
    return DataParallelClient(ranks, rank_places=[leader.peer(r) for r in range(world_size)], routing=routing)


def trace_dir(root: str | None, first_rank: int) -> TraceDir | None:
    """Where one data-parallel engine's ranks write their traces (None: profiling is off)."""
    return TraceDir(root, first_rank) if root else None


class DataParallelClient:
    def __init__(self, replicas: list[EngineClient], gpus_per_replica: int | None = None,
                 rank_places: list[RankPlace] | None = None, routing: str = "prefix"):
        """`gpus_per_replica`: GPUs each replica takes (None on the CPU, where replicas share the cores).
        `rank_places`: the replicas are the ranks of one data-parallel-attention world, placed so.
        `routing`: "prefix" (prefix-cache-aware, once the engines' block size is known) or "load"."""
        if routing not in ROUTINGS:
            raise ValueError(f"--dp-routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        self.routing = routing
        self.router: PrefixRouter | None = None
        self.replicas = replicas
        self.gpus_per_replica = gpus_per_replica
        self.rank_places = rank_places
        self.artifact_path = replicas[0].artifact_path
        self.in_flight: list[set[str]] = [set() for _ in replicas]   # replica -> request ids it runs
        self.exited = asyncio.Event()
        self._on_outputs: Callable[[list[CoreOutput]], None] = lambda outputs: None
        self._on_death: Callable[[], None] = lambda: None
        self._exit_watch: list[asyncio.Future] = []

    @property
    def dead(self) -> bool:
        return any(replica.dead for replica in self.replicas)

    async def start(self, timeout: float = 600.0) -> EngineInfo:
        """Start every replica (they load the model side by side); the info of the first, with the KV
        blocks of all."""
        starting = []
        for i, replica in enumerate(self.replicas):
            with self._spawn_environment(i):
                starting.append(asyncio.ensure_future(replica.start(timeout)))
                await asyncio.sleep(0)      # runs start() up to its first wait: the process is spawned by then
        infos = await asyncio.gather(*starting)
        if self.routing == "prefix":
            self.router = PrefixRouter(len(self.replicas), infos[0].block_size)
        for i, replica in enumerate(self.replicas):
            replica.listen(self._outputs_of(i), lambda: self._on_death())
        self._exit_watch = [asyncio.ensure_future(self._watch_exit(replica)) for replica in self.replicas]
        return dataclasses.replace(infos[0], num_kv_blocks=sum(info.num_kv_blocks for info in infos))

    def listen(self, on_outputs: Callable[[list[CoreOutput]], None], on_death: Callable[[], None]) -> None:
        self._on_outputs, self._on_death = on_outputs, on_death

    def status(self) -> EngineStatus:
        statuses = [replica.status() for replica in self.replicas]
        beats = [s.heartbeat for s in statuses]
        if any(beat is None for beat in beats):
            return EngineStatus(all(s.alive for s in statuses), None, None)
        return EngineStatus(all(s.alive for s in statuses), _summed(beats),
                            max(s.heartbeat_age_s for s in statuses))

    async def shutdown(self) -> None:
        await asyncio.gather(*(replica.shutdown() for replica in self.replicas))

    def send(self, message) -> bool:
        if not isinstance(message, Abort):
            return all([replica.send(message) for replica in self.replicas])
        sent = True
        for i, replica in enumerate(self.replicas):
            mine = [request_id for request_id in message.request_ids if request_id in self.in_flight[i]]
            self.in_flight[i].difference_update(mine)
            sent &= not mine or replica.send(dataclasses.replace(message, request_ids=mine))
        return sent

    async def call(self, request: EngineRequest[R], timeout: float | None = None) -> R:
        if not isinstance(request, AddRequests):
            results = await asyncio.gather(*(replica.call(request, timeout) for replica in self.replicas))
            return results[0]
        i = self.route(request)
        ids = {new.request_id for new in request.requests}
        self.in_flight[i] |= ids
        if self.rank_places is not None:
            for j, replica in enumerate(self.replicas):
                if j != i:
                    replica.send(Wake())
        try:
            return await self.replicas[i].call(request, timeout)
        except BaseException:
            self.in_flight[i] -= ids
            raise

    def route(self, request: AddRequests) -> int:
        """The replica for a call's requests (one call's requests stay together: n > 1 shares a prompt)."""
        if self.router is None or not request.requests:
            return self.least_loaded()
        first = request.requests[0]
        return self.router.choose(first.prompt_token_ids, [len(ids) for ids in self.in_flight],
                                  first.params.cache_salt)

    def least_loaded(self) -> int:
        """The replica with the fewest requests in flight (the first of equals)."""
        return min(range(len(self.replicas)), key=lambda i: len(self.in_flight[i]))

    def _outputs_of(self, i: int) -> Callable[[list[CoreOutput]], None]:
        def on_outputs(outputs: list[CoreOutput]) -> None:
            self.in_flight[i].difference_update(o.request_id for o in outputs if o.finish_reason is not None)
            self._on_outputs(outputs)
        return on_outputs

    async def _watch_exit(self, replica: EngineClient) -> None:
        await replica.exited.wait()
        self.exited.set()

    @contextlib.contextmanager
    def _spawn_environment(self, i: int) -> Iterator[None]:
        """Replica i's GPUs, or rank i's place, as the spawned engine process's environment (it copies
        os.environ)."""
        changes = {}
        if self.rank_places is not None:
            changes = self.rank_places[i].environment()
        elif self.gpus_per_replica is not None:
            first = i * self.gpus_per_replica
            changes = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(first, first + self.gpus_per_replica))}
        before = {name: os.environ.get(name) for name in changes}
        os.environ.update(changes)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value


def _summed(beats: list[Heartbeat]) -> Heartbeat:
    """One heartbeat whose numbers are the replicas' added up."""
    core = CoreStats(*(_added([getattr(b.stats.core, f.name) for b in beats]) for f in dataclasses.fields(CoreStats)))
    counts: dict[str, int] = {}
    for beat in beats:
        for name, n in beat.stats.compile_counts.items():
            counts[name] = counts.get(name, 0) + n
    return Heartbeat(sum(b.steps for b in beats), EngineStats(core, counts))


def _added(values: list):
    """Counts add up; speculative-decoding counters (None where speculation is off) merge."""
    if all(isinstance(v, int) for v in values):
        return sum(values)
    present = [v for v in values if v is not None]
    return functools.reduce(lambda a, b: a.plus(b), present) if present else None
