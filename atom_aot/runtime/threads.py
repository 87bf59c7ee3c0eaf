"""How many threads torch's CPU kernels use, and how idle ones wait: chosen from what this process
may run on, not from the machine's core count.

torch sizes its pool from the machine, not from the CPUs this process is allowed (taskset, a
container's cpuset or CPU quota), and OpenMP's idle threads spin. On a shared host a spinning
thread holds the core another thread of the same pool needs. Measured on a 2-CPU host with other
work running (tiny model, 64 decode steps): 2 spinning threads 4.4-10.5 s, 1 thread 0.4-1.3 s,
2 passive threads 0.2-0.4 s.

Torch-free at import: the wait policy is read once, when torch loads OpenMP, so the engine
process sets it before its first torch import.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("atom_aot")

WAIT_POLICY = "OMP_WAIT_POLICY"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


@dataclass(frozen=True)
class ThreadChoice:
    count: int | None      # None: keep torch's own choice (it read OMP_NUM_THREADS)
    reason: str


def prefer_passive_openmp_wait() -> None:
    """Idle OpenMP threads sleep instead of spinning, unless the user chose a policy. Call before
    torch is first imported in this process."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota_cpus()
    return max(1, min(cpus, quota) if quota else cpus)


def _cgroup_quota_cpus() -> int | None:
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return math.ceil(int(quota) / int(period))


def choose_threads(requested: int | None, environ=os.environ) -> ThreadChoice:
    """num_threads (--num-threads) first, then OMP_NUM_THREADS, then the usable CPUs."""
    if requested is not None:
        return ThreadChoice(requested, "num_threads (--num-threads)")
    if environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(None, f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']}")
    cpus = usable_cpus()
    return ThreadChoice(cpus, f"{cpus} usable CPU(s): this process's affinity, capped by a cgroup quota")


def set_torch_threads(requested: int | None) -> int:
    """Set torch's intra-op threads (see `choose_threads`) and log the choice; returns the count."""
    import torch
    choice = choose_threads(requested)
    if choice.count is not None:
        torch.set_num_threads(choice.count)
    policy = os.environ.get(WAIT_POLICY)
    waiting = (f"{WAIT_POLICY}={policy}" if policy else
               f"idle OpenMP threads spin; on a shared host start with {WAIT_POLICY}=PASSIVE")
    log.info("torch threads: %d (%s; %s)", torch.get_num_threads(), choice.reason, waiting)
    return torch.get_num_threads()
