"""The process group of a tensor-parallel engine: where each rank sits, the rendezvous, and the
two groups every rank joins.

- the world group (gloo on the CPU, NCCL on GPUs): the model's collectives, registered under
  `TP_GROUP` for the compiled packages (with a peer-memory all-reduce on GPUs of one host), with
  `COLLECTIVE_TIMEOUT` so a rank that stops answering mid-step ends the step with an error, never a hang
  (a rank that dies closes its sockets, and its peers' next collective fails at once);
- a control group (gloo, host memory) on which rank 0 tells the others what to run next; ranks wait
  there while the engine is idle, so its timeout is long (`IDLE_TIMEOUT`).

The rendezvous is torch.distributed's: torchrun's variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
RANK, LOCAL_RANK) place a process when they are set (env://), which is how ranks on several nodes
meet; otherwise rank 0 picks a free port on 127.0.0.1, starts the other ranks itself with those variables
set, serves the store there and waits for them to count themselves in (a rank that dies first is named).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from atom_aot.distributed.collectives import register_tp_group, unregister_tp_group
from atom_aot.distributed.symmetric_all_reduce import PeerMemoryAllocation, open_symmetric_all_reduce
from atom_aot.logging_setup import seconds_listed

log = logging.getLogger("atom_aot")

COLLECTIVE_TIMEOUT = timedelta(seconds=300)
IDLE_TIMEOUT = timedelta(days=30)
TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
STARTED_BY_LEADER = "ATOM_STARTED_BY_LEADER"     # set for the ranks a rank 0 starts on its machine
ARRIVED_KEY = "atom/arrived"                       # those ranks count themselves in here before they join
ARRIVAL_POLL_S = 0.05


@dataclass(frozen=True)
class RankPlace:
    """Where one process sits in the world and how it finds the others."""
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int              # the GPU this rank uses on its node
    placed_by_env: bool = False  # placed by torchrun's variables: meet through env:// (torchrun's own store)
    started_by_leader: bool = False   # started by the rank 0 of this machine, which waits for it to arrive

    @classmethod
    def from_env(cls) -> "RankPlace | None":
        """The place torchrun's variables give (None when none is set); a partial set is an error."""
        present = [name for name in TORCHRUN_VARIABLES if name in os.environ]
        if not present:
            return None
        if len(present) != len(TORCHRUN_VARIABLES):
            missing = sorted(set(TORCHRUN_VARIABLES) - set(present))
            raise ValueError(f"{', '.join(present)} set but not {', '.join(missing)}: a rank placed by the environment "
                             f"needs all of {', '.join(TORCHRUN_VARIABLES)} (as torchrun sets them)")
        rank = int(os.environ["RANK"])
        return cls(rank, int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                   int(os.environ.get("LOCAL_RANK", rank)), placed_by_env=True,
                   started_by_leader=os.environ.get(STARTED_BY_LEADER) == "1")

    @classmethod
    def local_leader(cls, world_size: int) -> "RankPlace":
        """Rank 0 of a world whose ranks all run on this machine."""
        return cls(0, world_size, "127.0.0.1", free_port(), 0)

    def environment(self) -> dict[str, str]:
        """torchrun's variables for this place: what from_env reads back in the process started with them."""
        return {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
                "WORLD_SIZE": str(self.world_size), "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank),
                **({STARTED_BY_LEADER: "1"} if self.started_by_leader else {})}

    def peer(self, rank: int, started_by_leader: bool = False) -> "RankPlace":
        """`started_by_leader`: a tensor-parallel rank 0 starts it and waits for it to count itself in (join)."""
        return RankPlace(rank, self.world_size, self.master_addr, self.master_port, rank,
                         started_by_leader=started_by_leader)

    @property
    def init_method(self) -> str:
        """env:// under torchrun (whose agent already serves the store on MASTER_PORT), else a TCP store."""
        return "env://" if self.placed_by_env else f"tcp://{self.master_addr}:{self.master_port}"


@dataclass(frozen=True)
class RankGroup:
    """This process's membership: rank, world size and the control group."""
    rank: int
    world_size: int
    control: dist.ProcessGroup
    join_timings: dict[str, float] = field(default_factory=dict)   # seconds of each part of `join`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(arch: str, local_rank: int) -> torch.device:
    """The device of a rank on an `arch` machine: on GPUs its LOCAL_RANK's, made the current one."""
    if arch == "cpu":
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


_joined_before = False


def joined_before() -> bool:
    """Whether this process has joined a process group (its store's and gloo's native threads may live on
    after it is destroyed: a fork copies locks they hold, runtime/parallel/rank_processes.py)."""
    return _joined_before


def join(place: RankPlace, device: torch.device, waiting: Callable[[], None] | None = None) -> RankGroup:
    """Meet the other ranks (blocks until all arrive, at most COLLECTIVE_TIMEOUT).

    A rank 0 that started the others on this machine serves the store itself and waits there until each has
    counted itself in, calling `waiting()` between looks: it raises when a rank it started has died, so a
    rank that dies before it joins ends the start at once, named, instead of after the rendezvous timeout."""
    global _joined_before
    _joined_before = True
    backend = "nccl" if device.type == "cuda" else "gloo"
    timings, start = {}, time.perf_counter()
    allocation = PeerMemoryAllocation.start(place.world_size, device)    # beside the process group's start
    dist.init_process_group(backend, **_rendezvous(place, waiting),
                            rank=place.rank, world_size=place.world_size, timeout=COLLECTIVE_TIMEOUT,
                            device_id=device if device.type == "cuda" else None)
    timings["join: process group (with the rendezvous)"], start = time.perf_counter() - start, time.perf_counter()
    try:
        parts: dict[str, float] = {}
        register_tp_group(dist.group.WORLD, open_symmetric_all_reduce(dist.group.WORLD, device, parts, allocation))
        timings["join: peer memory"], start = time.perf_counter() - start, time.perf_counter()
        timings.update({f"join: {name}": seconds for name, seconds in parts.items()})
        control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        timings["join: control group"] = time.perf_counter() - start
    except BaseException:                  # met, then failed: leave, so that this process can start another engine
        leave()
        raise
    log.info("rank %d joined %d ranks: %s", place.rank, place.world_size, seconds_listed(timings, strip="join: "))
    return RankGroup(place.rank, place.world_size, control, timings)


def _rendezvous(place: RankPlace, waiting: Callable[[], None] | None) -> dict:
    """init_process_group's way to meet: the store this rank 0 serves once its ranks are in, a store client
    counted in, or torch's own rendezvous (torchrun's env://, the tcp:// of a rank 0 given no way to wait).
    All ranks of a world must take the same form: torch prefixes its rendezvous' keys ("default_pg") and not
    a given store's, so a data-parallel rank counting itself in beside env:// ranks never met them."""
    if place.rank == 0 and not place.placed_by_env and waiting is not None:
        store = dist.TCPStore(place.master_addr, place.master_port, place.world_size, is_master=True,
                              timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False)
        _await_arrivals(store, place, waiting)
        return {"store": store}
    if place.started_by_leader and place.rank != 0:
        store = dist.TCPStore(place.master_addr, place.master_port, place.world_size, is_master=False,
                              timeout=COLLECTIVE_TIMEOUT)
        store.add(ARRIVED_KEY, 1)
        return {"store": store}
    return {"init_method": place.init_method}


def _await_arrivals(store: dist.TCPStore, place: RankPlace, waiting: Callable[[], None]) -> None:
    expected = place.world_size - 1
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT.total_seconds()
    while (arrived := store.add(ARRIVED_KEY, 0)) < expected:
        waiting()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{arrived} of the {expected} ranks started here reached {place.master_addr}:"
                               f"{place.master_port} within {COLLECTIVE_TIMEOUT.total_seconds():.0f} s")
        time.sleep(ARRIVAL_POLL_S)


def agree_min(value: int, group: RankGroup) -> int:
    """The smallest of every rank's `value` (the KV blocks all ranks can hold)."""
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group.control)
    return int(t.item())


_before_leaving: list[Callable[[], None]] = []


def before_leaving(release: Callable[[], None]) -> None:
    """Run `release` whenever this process leaves its process group, before the group is destroyed (what
    holds on to the group's communicators: runtime/execution/cuda_graphs.py frees the graphs that captured them)."""
    if release not in _before_leaving:
        _before_leaving.append(release)


def leave() -> None:
    if dist.is_initialized():
        for release in _before_leaving:
            release()
        unregister_tp_group()
        dist.destroy_process_group()
