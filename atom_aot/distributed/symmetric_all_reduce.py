"""All-reduce over GPU peer memory (torch's symmetric memory) for the messages NCCL is slow on.

Why: a tensor-parallel decode step all-reduces twice per layer (64 calls per token for Llama-3.1-8B), and at
small batches each message is a few KiB, where NCCL's ring is all latency. With the ranks' buffers mapped
into each other's address space (CUDA IPC over NVLink), one kernel can instead read every peer's copy and
sum it (one-shot), or sum one slice per rank and write it to all (two-shot, less traffic per rank at larger
sizes and world sizes). These are torch's own kernels (`torch.ops.symm_mem`), as vLLM's custom all-reduce
does the same with its own; they use peer loads and stores only, never NVLink multicast (which the GPU
machines keep off), and they sum the ranks in rank order on every rank, so every rank gets the same bits.

Which path a message takes is a plan by size (`AllReducePlan`); what the plan is, and why a group has
none, is logged once per process. Environment:
- `ATOM_ALL_REDUCE=nccl` keeps every all-reduce on NCCL (an A/B switch and a way out); `auto` (default) plans.
- `ATOM_ALL_REDUCE_ONE_SHOT_MAX` / `ATOM_ALL_REDUCE_TWO_SHOT_MAX`: the plan's bounds in bytes.
- `ATOM_ALL_REDUCE_NORM=separate` keeps the all-reduce out of the RMSNorm after it (the A/B switch for the fused
  kernel, ops/triton/all_reduce_norm.py); `fused` (default) sums the messages that fit its slabs inside it,
  one-shot; `fused-two-shot` sums them two-shot from peer_table.two_shot_rows_for rows per program
  (tested on CPUs only: not the default until a GPU run says it pays).
- `ATOM_ALL_REDUCE_NORM_SLAB`: each of the fused kernel's 64 slabs in bytes (whole 16-byte vectors; default
  peer_table.slab_bytes_for the one-shot bound), which sets how many rows it sums itself.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from atom_aot.distributed import peer_table

log = logging.getLogger("atom_aot")

KIB, MIB = 1 << 10, 1 << 20
# Bounds by world size (bytes): one-shot up to the first, two-shot up to the second, NCCL above. One-shot
# reads W-1 peer copies and two-shot 2(W-1)/W of one, so two-shot takes over as messages grow. 2 and 4 ranks:
# where each path was fastest in CUDA graphs on four H200s joined by NV18 NVLink
# (docs/benchmarks/h200x4-collectives-2026-11-26.json; `tp_two_gpus.py plan` reads a table into these bounds);
# 8 ranks: not measured, the 4-rank bounds halved for one-shot.
DEFAULT_BOUNDS = {2: (1 * MIB, 32 * MIB), 4: (256 * KIB, 8 * MIB), 8: (128 * KIB, 8 * MIB)}
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
VECTOR_BYTES = 16                  # the kernels' widest load; two-shot splits the message in such vectors per rank
MODE_VARIABLE, ONE_SHOT_VARIABLE, TWO_SHOT_VARIABLE = ("ATOM_ALL_REDUCE", "ATOM_ALL_REDUCE_ONE_SHOT_MAX",
                                                       "ATOM_ALL_REDUCE_TWO_SHOT_MAX")
MODES = ("auto", "nccl")
NORM_VARIABLE, SLAB_VARIABLE = "ATOM_ALL_REDUCE_NORM", "ATOM_ALL_REDUCE_NORM_SLAB"
NORM_MODES = ("fused", "fused-two-shot", "separate")
ONE_SHOT, TWO_SHOT, PROCESS_GROUP = "one_shot", "two_shot", "process_group"    # the paths (NCCL's is the group's)


@dataclass(frozen=True)
class AllReducePlan:
    """Which all-reduce a message of a given size takes: one-shot, two-shot, else NCCL."""
    one_shot_max_bytes: int
    two_shot_max_bytes: int
    norm_slab_bytes: int = 0        # > 0: an all-reduce before an RMSNorm sums in the norm's kernel, in slabs this big
    norm_two_shot_rows: int = 0     # > 0: that kernel sums two-shot from this many rows per program (peer_table.py)

    @property
    def buffer_bytes(self) -> int:
        return max(self.one_shot_max_bytes, self.two_shot_max_bytes)

    def path(self, nbytes: int, world_size: int) -> str:
        if nbytes <= self.one_shot_max_bytes:
            return ONE_SHOT
        if nbytes <= self.two_shot_max_bytes and nbytes % (VECTOR_BYTES * world_size) == 0:
            return TWO_SHOT
        return PROCESS_GROUP

    def describe(self) -> str:
        two_shot = f", two-shot from {self.norm_two_shot_rows} rows per slab" if self.norm_two_shot_rows else ""
        fused = (f"; before an RMSNorm, summed in the norm's kernel in {peer_table.PROGRAMS} slabs of "
                 f"{_size(self.norm_slab_bytes)}{two_shot}" if self.norm_slab_bytes else "")
        return (f"symmetric-memory one-shot up to {_size(self.one_shot_max_bytes)}, two-shot up to "
                f"{_size(self.two_shot_max_bytes)}, NCCL above{fused}")


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes % MIB == 0 else f"{nbytes // KIB} KiB" if nbytes % KIB == 0 else f"{nbytes} B"


def plan_from_env(world_size: int, environ=os.environ) -> AllReducePlan | None:
    """The plan for `world_size` ranks (None: NCCL for every size, by ATOM_ALL_REDUCE=nccl)."""
    mode = environ.get(MODE_VARIABLE, "auto")
    if mode not in MODES:
        raise ValueError(f"{MODE_VARIABLE}={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "nccl":
        return None
    norm = environ.get(NORM_VARIABLE, "fused")
    if norm not in NORM_MODES:
        raise ValueError(f"{NORM_VARIABLE}={norm!r}: expected one of {', '.join(NORM_MODES)}")
    one, two = DEFAULT_BOUNDS.get(world_size, DEFAULT_BOUNDS[8])
    one, two = _bytes_from_env(environ, ONE_SHOT_VARIABLE, one), _bytes_from_env(environ, TWO_SHOT_VARIABLE, two)
    slab = _bytes_from_env(environ, SLAB_VARIABLE, peer_table.slab_bytes_for(one))
    if slab % peer_table.VECTOR_BYTES:
        raise ValueError(f"{SLAB_VARIABLE}={slab}: expected whole {peer_table.VECTOR_BYTES}-byte vectors")
    if norm == "separate" and SLAB_VARIABLE in environ:
        raise ValueError(f"{SLAB_VARIABLE} sizes the fused kernel's slabs, which {NORM_VARIABLE}=separate turns off")
    if norm == "separate" or world_size > peer_table.MAX_RANKS:
        return AllReducePlan(one, two)
    return AllReducePlan(one, two, slab, peer_table.two_shot_rows_for(world_size) if norm == "fused-two-shot" else 0)


def describe_plan(world_size: int, environ=os.environ) -> str:
    """What all-reduce `world_size` ranks take in this environment (inspect's row; the start log says what ran)."""
    plan = plan_from_env(world_size, environ)
    if plan is None:
        return f"NCCL for every size ({MODE_VARIABLE}=nccl)"
    return f"on GPUs of one host {plan.describe()}; otherwise NCCL (gloo on the CPU)"


def _bytes_from_env(environ, name: str, default: int) -> int:
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={text!r}: expected a byte count (a whole number >= 0)")
    return value


@dataclass(frozen=True)
class PeerMemoryLayout:
    """Where each part lies in the one peer-mapped allocation of a rank (byte offsets, each 16-byte aligned):
    the staged messages of torch's one-shot / two-shot kernels first, then the fused kernel's two buffer halves
    (a slab per program each) and its signal pads (an int64 slot per program and rank).

    Why one allocation: one rendezvous, one place to map. Mapping the three this module used to make (the staged
    buffer, the fused kernel's buffer, its signal pads) took 2.0-3.4 s of a -tp 4 start on four H200s;
    in one allocation it still took 3.0 s: the cost was the process's first allocation of symmetric
    memory, whatever its size, which PeerMemoryAllocation now makes beside the process group's start."""
    staged_bytes: int
    norm_buffer_offset: int
    norm_buffer_bytes: int
    signals_offset: int
    signals_bytes: int

    @classmethod
    def of(cls, plan: AllReducePlan, world_size: int) -> "PeerMemoryLayout":
        norm_buffer_offset = _round_up(plan.buffer_bytes, VECTOR_BYTES)
        norm_buffer_bytes = 2 * peer_table.PROGRAMS * plan.norm_slab_bytes if plan.norm_slab_bytes else 0
        signals_offset = _round_up(norm_buffer_offset + norm_buffer_bytes, VECTOR_BYTES)
        signals_bytes = peer_table.PROGRAMS * world_size * 8 if plan.norm_slab_bytes else 0
        return cls(plan.buffer_bytes, norm_buffer_offset, norm_buffer_bytes, signals_offset, signals_bytes)

    @property
    def total_bytes(self) -> int:
        return self.signals_offset + self.signals_bytes


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class SymmetricAllReduce:
    """One peer-mapped allocation per rank (PeerMemoryLayout): the buffer that the one-shot / two-shot calls stage
    their messages in, sized by the plan; with the plan's `norm_slab_bytes`, also the buffer and signal pads of the
    all-reduce + add + RMSNorm kernel, and the peer table (distributed/peer_table.py) that kernel reads.

    Every call stages its message in the same buffer: the kernels end with a barrier across the ranks, so
    a rank can only start the next call once every peer has finished reading the last one."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, plan: AllReducePlan,
                 memory: torch.Tensor | None = None):
        """`memory`: the allocation made beforehand (PeerMemoryAllocation), else one is made here."""
        import torch.distributed._symmetric_memory as symmetric_memory
        global _mapped_before
        _mapped_before = True
        self.plan = plan
        self.group_name = group.group_name
        self.world_size = group.size()
        layout = PeerMemoryLayout.of(plan, self.world_size)
        if memory is None:
            memory = symmetric_memory.empty(layout.total_bytes, dtype=torch.uint8, device=device)
        if memory.dtype != torch.uint8 or memory.numel() != layout.total_bytes:
            raise ValueError(f"the peer memory made beforehand holds {memory.numel()} x {memory.dtype}; "
                             f"the plan needs {layout.total_bytes} bytes")
        self.memory = memory
        self.buffer = self.memory[:layout.staged_bytes]
        if plan.norm_slab_bytes:
            self.norm_buffer = self.memory[layout.norm_buffer_offset:][:layout.norm_buffer_bytes]
            self.norm_signals = self.memory[layout.signals_offset:][:layout.signals_bytes].view(torch.int64)
            _zero_now(self.norm_signals)    # before any peer can signal into it (after the rendezvous)
        bases = list(symmetric_memory.rendezvous(self.memory, self.group_name).buffer_ptrs)   # collective
        self.backend = symmetric_memory.get_backend(device) if hasattr(symmetric_memory, "get_backend") else "default"
        self.peer_table = peer_table.empty_table()
        if plan.norm_slab_bytes:
            self.peer_table = peer_table.table_values(
                group.rank(), plan.norm_slab_bytes, [base + layout.norm_buffer_offset for base in bases],
                [base + layout.signals_offset for base in bases], plan.norm_two_shot_rows)

    def path(self, x: torch.Tensor) -> str:
        # one-shot wants the input and the buffer equally aligned: the buffer starts 16-byte aligned
        if x.dtype not in SUPPORTED_DTYPES or not x.is_contiguous() or x.data_ptr() % VECTOR_BYTES:
            return PROCESS_GROUP
        return self.plan.path(x.numel() * x.element_size(), self.world_size)

    def __call__(self, x: torch.Tensor, path: str) -> torch.Tensor:
        flat = x.view(-1)
        staged = self.buffer[:flat.numel() * x.element_size()].view(x.dtype)
        out = torch.empty_like(flat)
        if path == ONE_SHOT:
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(staged, flat, "sum", self.group_name, out)
        else:
            staged.copy_(flat)
            torch.ops.symm_mem.two_shot_all_reduce_out(staged, "sum", self.group_name, out)
        return out.view_as(x)


def _zero_now(t: torch.Tensor) -> None:
    """Zeroes `t` and waits for that alone: on GPUs on a stream of its own, since the default stream also carries the
    weights this rank uploads beside the join (a device-wide or default-stream synchronize would wait for them)."""
    if t.device.type != "cuda":
        t.zero_()
        return
    side = torch.cuda.Stream(t.device)
    with torch.cuda.stream(side):
        t.zero_()
    side.synchronize()


def _peer_plan(world_size: int, device: torch.device,
               environ=os.environ) -> tuple[AllReducePlan | None, str | None]:
    """The plan a group of `world_size` on `device` maps peer memory for (what the join allocates beforehand and
    open_symmetric_all_reduce maps), else (None, the setting that chose NCCL; None on the CPU or for one rank)."""
    if device.type != "cuda" or world_size < 2:
        return None, None
    plan = plan_from_env(world_size, environ)
    if plan is None:
        return None, f"{MODE_VARIABLE}=nccl"
    if plan.buffer_bytes == 0:
        return None, f"{ONE_SHOT_VARIABLE} and {TWO_SHOT_VARIABLE} are 0"
    return plan, None


class PeerMemoryAllocation:
    """The allocation SymmetricAllReduce maps, made in a thread of its own, started before the process group.

    Why: a process's first allocation of torch's symmetric memory took 1.84-1.98 s on two H200s whatever its size
    (1 or 36 MiB; the next ones under a millisecond, the rendezvous that maps it milliseconds), and it needs no
    group. Made in a thread while NCCL's communicator started, both were done in 1.87 s against 0.78 + 1.98 s one
    after the other (scripts/gpu/symm_mem_setup_timing.py); in the engine's join it was most of
    `peer memory: buffers mapped` (1.9-3.0 s at -tp 2 and -tp 4)."""

    def __init__(self, nbytes: int, device: torch.device):
        self.nbytes, self.device = nbytes, device
        self.seconds = 0.0
        self._memory: torch.Tensor | None = None
        self._error: BaseException | None = None
        # a daemon: a start that fails before it maps the memory does not wait for it at exit
        self._thread = threading.Thread(target=self._allocate, name="atom-peer-memory", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, world_size: int, device: torch.device,
              environ=os.environ) -> "PeerMemoryAllocation | None":
        """The allocation open_symmetric_all_reduce will map for a group of `world_size` on `device`, or None where
        it will map none for a reason known before the group exists (the CPU, one rank, no plan, mapped before).
        Where the ranks learn later that they cannot map (several hosts, no peer access), it is dropped unused."""
        plan, _ = _peer_plan(world_size, device, environ)
        if plan is None or _mapped_before:
            return None
        return cls(PeerMemoryLayout.of(plan, world_size).total_bytes, device)

    def _allocate(self) -> None:
        import torch.distributed._symmetric_memory as symmetric_memory
        start = time.perf_counter()
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)      # the thread's own current device
            self._memory = symmetric_memory.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        except BaseException as e:         # handed to the thread that maps it (result), which fails the start
            self._error = e
        self.seconds = time.perf_counter() - start

    def result(self) -> torch.Tensor:
        """The allocation, once made (waits for the thread); its error if it failed."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._memory is not None
        return self._memory


def open_symmetric_all_reduce(group: dist.ProcessGroup, device: torch.device,
                              timings: dict[str, float] | None = None,
                              allocation: PeerMemoryAllocation | None = None) -> SymmetricAllReduce | None:
    """The peer-memory all-reduce for `group` on `device`, or None (NCCL for every size) with the reason logged.
    Collective: every rank of the group calls it and takes the same branch (the same environment, and the
    reasons they share through `_peer_access_missing`); a mapping that fails fails the start. `allocation`: the
    memory started before the group (PeerMemoryAllocation.start), else it is allocated here. `timings` gets the
    seconds of its parts (the ranks' places traded, the wait for the allocation, the buffers mapped)."""
    timings = {} if timings is None else timings
    plan, setting = _peer_plan(group.size(), device)
    if plan is None:
        if setting:
            log.info("all-reduce: NCCL for every size (%s)", setting)
        return None
    start = time.perf_counter()
    reason = _peer_access_missing(group, device)
    timings["peer memory: places traded"], start = time.perf_counter() - start, time.perf_counter()
    if reason:
        log.info("all-reduce: NCCL for every size (%s)", reason)
        return None
    try:
        memory = None
        if allocation is not None:
            memory = allocation.result()
            timings["peer memory: allocated (beside the process group)"] = allocation.seconds
            timings["peer memory: waited for the allocation"], start = time.perf_counter() - start, time.perf_counter()
        symmetric = SymmetricAllReduce(group, device, plan, memory)
    except RuntimeError as e:       # not a fallback: a rank that fell back alone would leave the others waiting
        raise RuntimeError(f"the all-reduce's peer memory could not be mapped ({str(e).splitlines()[0]}); "
                           f"{MODE_VARIABLE}=nccl runs every all-reduce on NCCL") from e
    timings["peer memory: buffers mapped"] = time.perf_counter() - start
    log.info("all-reduce over %d GPUs: %s (buffer %s, backend %s)", group.size(), plan.describe(),
             _size(plan.buffer_bytes), symmetric.backend)
    return symmetric


_mapped_before = False      # this process has mapped peer memory for a process group (SymmetricAllReduce)


def _peer_access_missing(group: dist.ProcessGroup, device: torch.device) -> str | None:
    """Why the ranks cannot map each other's memory (None when they can). Collective: the ranks trade where
    they run, so all answer alike."""
    mine = (socket.gethostname(), device.index if device.index is not None else torch.cuda.current_device(),
            _mapped_before)
    places: list = [None] * group.size()
    dist.all_gather_object(places, mine, group=group)
    return peer_memory_problem(places, torch.cuda.can_device_access_peer)


def peer_memory_problem(places: list[tuple[str, int, bool]], can_access) -> str | None:
    """What keeps ranks at `places` (host, GPU index, mapped before; one per rank) from mapping each other's
    memory, with `can_access(gpu, peer)`: None when nothing does."""
    hosts = sorted({host for host, _, _ in places})
    if len(hosts) > 1:
        return f"the ranks run on {len(hosts)} hosts ({', '.join(hosts)}); peer memory spans one"
    again = [rank for rank, (_, _, before) in enumerate(places) if before]
    if again:
        # torch keeps symmetric-memory state by group name for the life of the process, and a process group
        # made after another is destroyed reuses its name ("0" for the world). A -tp 4 engine started after a
        # -tp 2 one in one process hung while its ranks joined (on GPUs; which step waited was not
        # seen): such a process keeps to NCCL
        return (f"rank {', '.join(map(str, again))} mapped peer memory for an earlier process group in its process, "
                f"which torch does not let a later group map again")
    blocked = [(a, b) for _, a, _ in places for _, b, _ in places if a != b and not can_access(a, b)]
    if blocked:
        return "no peer access between GPUs " + ", ".join(f"{a}->{b}" for a, b in blocked)
    return None
