"""The collectives inside the model's graph: the custom ops `atom::all_reduce`, `atom::all_gather`
and `atom::reduce_scatter`, on the process group registered as the tensor-parallel one (the world
of an attention-data-parallel artifact, whose expert layers gather every rank's tokens).

On GPUs of one host, all-reduce takes peer memory for the sizes NCCL is slow on
(distributed/symmetric_all_reduce.py: which sizes, and why a group has no such path, is logged).
An all-reduce whose sum goes into the residual add and RMSNorm (models/layers.py) is two ops on GPUs:
`atom::all_reduce_unless_fused`, here, then the norm's kernel (ops/triton/all_reduce_norm.py), which sums
small messages over peer memory itself; both read the same peer table (`peer_table` below).

They are registered through the dispatcher (as ops/attention.py registers attention), so
torch.export records them as calls by name and AOTInductor compiles around them; on GPUs the NCCL
call they make is captured by CUDA graphs like any kernel. The build needs no process group at
all: the ops are opaque to it (their fake implementations give the shapes).

Why not torch's functional collectives (`_c10d_functional.all_reduce` + `wait_tensor`), which
export and Inductor support natively: compiled into an AOTInductor package on the CPU, they
deadlock under gloo. The package runs with the GIL held, waiting in C++ for the gloo work, while
gloo's thread, finishing that work, needs the GIL to release a tensor (seen on torch 2.13: rank 1
stuck in `AOTInductorModelContainer::run_single_threaded` -> `Work::wait`, gloo's run loop in
`~AsyncWork` -> `gil_scoped_acquire`). Our ops call torch.distributed from Python, whose wait
releases the GIL.
"""
from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from atom_aot.distributed import peer_table as tables
from atom_aot.distributed.symmetric_all_reduce import PROCESS_GROUP, SymmetricAllReduce

LIBRARY = torch.library.Library("atom", "FRAGMENT")
LIBRARY.define("all_reduce(Tensor x) -> Tensor")
LIBRARY.define("all_reduce_unless_fused(Tensor x) -> Tensor")
LIBRARY.define("all_gather(Tensor x, int world_size) -> Tensor")
LIBRARY.define("reduce_scatter(Tensor x, int world_size) -> Tensor")

# torch 2.13 renames all_gather_into_tensor (deprecated there) all_gather_single; torch 2.11 has only the first
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_scatter_from = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_groups: dict[str, object] = {}
_peer_memory: SymmetricAllReduce | None = None    # the tensor-parallel group's, when its ranks have one
_peer_tables: dict[torch.device, torch.Tensor] = {}   # by device: the one table compiled models read, refilled
_peer_tables_lock = threading.Lock()     # a table made while a group registers (a load beside the join) is not stale
TP_GROUP = "tp"
STAND_IN = "one process standing in for every rank"


def register_tp_group(group: dist.ProcessGroup, symmetric: SymmetricAllReduce | None = None) -> None:
    """Make `group` the one the model's collectives run on (each rank, before its first forward), with its
    peer-memory all-reduce when the ranks have one."""
    global _peer_memory
    _groups[TP_GROUP] = group
    _peer_memory = symmetric
    _refill_peer_tables()


def unregister_tp_group() -> None:
    """Forget the group and free its peer-memory buffer (before the group is destroyed)."""
    global _peer_memory
    _groups.pop(TP_GROUP, None)
    _peer_memory = None
    _refill_peer_tables()


def peer_table(device: torch.device) -> torch.Tensor:
    """The peer table (distributed/peer_table.py) the fused all-reduce + RMSNorm kernel reads on `device`: the
    same tensor for the life of the process, refilled in place as groups come and go, so a package bound to it
    once always agrees with `all_reduce_unless_fused` about which messages it sums itself."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _peer_tables_lock:
        if device not in _peer_tables:
            _peer_tables[device] = torch.tensor(_table_values(), dtype=torch.int64, device=device)
        return _peer_tables[device]


def _table_values() -> list[int]:
    return _peer_memory.peer_table if _peer_memory is not None else tables.empty_table()


def _refill_peer_tables() -> None:
    with _peer_tables_lock:
        values = _table_values()
        for table in _peer_tables.values():
            table.copy_(torch.tensor(values, dtype=torch.int64))


def all_reduce_path(x: torch.Tensor) -> str:
    """The path `all_reduce(x)` takes on this rank: "one_shot" / "two_shot" (peer memory) or "process_group"
    (the group's own all-reduce: NCCL's on GPUs, gloo's on the CPU)."""
    return _peer_memory.path(x) if _peer_memory is not None else PROCESS_GROUP


def register_stand_in() -> None:
    """Let one process run a rank's graph with no other ranks (the build's CUDA-graph memory probe):
    all_reduce returns its input, all_gather repeats it and reduce_scatter keeps the first part. Shapes and allocations are a rank's; the
    values are not any rank's, so nothing but memory may be measured this way."""
    global _peer_memory
    _groups[TP_GROUP] = STAND_IN
    _peer_memory = None
    _refill_peer_tables()


def _tp_group():
    try:
        return _groups[TP_GROUP]
    except KeyError:
        raise RuntimeError("a tensor-parallel model ran before its process group was registered "
                           "(atom_aot.distributed.group.join does it)") from None


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    group = _tp_group()
    path = all_reduce_path(x)
    if path != PROCESS_GROUP:
        return _peer_memory(x, path)
    out = x.clone()
    if group is not STAND_IN:
        dist.all_reduce(out, group=group)
    return out


def summed_in_norm_kernel(x: torch.Tensor) -> bool:
    """Whether the norm's kernel sums `x` [T, hidden] over peer memory itself (peer_table.peer_path_taken with
    this rank's table)."""
    slab = _peer_memory.plan.norm_slab_bytes if _peer_memory is not None else 0
    return x.is_cuda and tables.peer_path_taken(x.shape[0], x.shape[-1] * x.element_size(), slab)


def _all_reduce_unless_fused(x: torch.Tensor) -> torch.Tensor:
    # not written where the kernel after it sums x itself: that kernel then never reads it
    return torch.empty_like(x) if summed_in_norm_kernel(x) else _all_reduce(x)


def _all_gather(x: torch.Tensor, world_size: int) -> torch.Tensor:
    group = _tp_group()
    if group is STAND_IN:
        return x.repeat(world_size, *([1] * (x.dim() - 1)))
    out = x.new_empty((world_size * x.shape[0], *x.shape[1:]))
    _gather_into(out, x.contiguous(), group=group)
    return out


def _reduce_scatter(x: torch.Tensor, world_size: int) -> torch.Tensor:
    group = _tp_group()
    if group is STAND_IN:
        return x[:x.shape[0] // world_size].clone()
    out = x.new_empty((x.shape[0] // world_size, *x.shape[1:]))
    _scatter_from(out, x.contiguous(), group=group)
    return out


for _device in ("CPU", "CUDA"):
    LIBRARY.impl("all_reduce", _all_reduce, _device)
    LIBRARY.impl("all_reduce_unless_fused", _all_reduce_unless_fused, _device)
    LIBRARY.impl("all_gather", _all_gather, _device)
    LIBRARY.impl("reduce_scatter", _reduce_scatter, _device)


@torch.library.register_fake("atom::all_reduce", lib=LIBRARY)
def _(x):
    return torch.empty_like(x)


@torch.library.register_fake("atom::all_reduce_unless_fused", lib=LIBRARY)
def _(x):
    return torch.empty_like(x)


@torch.library.register_fake("atom::all_gather", lib=LIBRARY)
def _(x, world_size):
    return x.new_empty((world_size * x.shape[0], *x.shape[1:]))


@torch.library.register_fake("atom::reduce_scatter", lib=LIBRARY)
def _(x, world_size):
    return x.new_empty((x.shape[0] // world_size, *x.shape[1:]))


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of `x` over the tensor-parallel ranks (a new tensor; `x` is left alone)."""
    return torch.ops.atom.all_reduce(x)


def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                            peers: torch.Tensor | None, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + sum of x over the ranks), residual + that sum), x [T, hidden] this rank's partial sums
    on a GPU: one Triton kernel after `all_reduce_unless_fused` (`peers`: the model's peer table). The CPU has no
    such kernel: RMSNorm all-reduces first there (models/layers.py)."""
    if not x.is_cuda:
        raise ValueError(f"all_reduce_add_rms_norm runs on GPUs; x is on {x.device}")
    if peers is None:
        raise RuntimeError("a tensor-parallel model ran on a GPU without its peer table "
                           "(DecoderForCausalLM.use_kernels attaches it)")
    from atom_aot.ops.triton import all_reduce_norm  # noqa: F401  (registers atom_triton::all_reduce_add_rms_norm)
    reduced = torch.ops.atom.all_reduce_unless_fused(x)
    return torch.ops.atom_triton.all_reduce_add_rms_norm(x, reduced, residual, weight, peers, eps, world_size)


def all_gather_columns(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """[N, C] on each rank -> [N, world_size * C], rank r's columns at r * C (every rank gets all)."""
    gathered = torch.ops.atom.all_gather(x, world_size)                      # [W * N, C]
    return gathered.unflatten(0, (world_size, -1)).transpose(0, 1).flatten(1)  # [N, W * C]


def all_gather_rows(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """[T, C] on each rank -> [world_size * T, C], rank r's rows at r * T (every rank gets all)."""
    return torch.ops.atom.all_gather(x, world_size)


def reduce_scatter_rows(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """[world_size * T, C] on each rank -> [T, C]: rank r gets rows r * T.. summed over the ranks."""
    return torch.ops.atom.reduce_scatter(x, world_size)
