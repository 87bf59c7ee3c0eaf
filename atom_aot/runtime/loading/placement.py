"""Whether this machine can hold an artifact's ranks: its manifest's Layout decides.

On the CPU a rank is a process, so any world fits. On GPUs each rank takes one GPU: the ranks this
machine starts itself (no torchrun variables) need world-size GPUs here; a rank placed by torchrun's
variables needs its LOCAL_RANK's GPU.
"""
from __future__ import annotations

import dataclasses

import torch

from atom_aot.artifact.manifest import Manifest
from atom_aot.distributed.group import RankPlace


def gpus_here() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def placement_problem(manifest: Manifest, gpus: int | None = None) -> str | None:
    """Why the ranks of `manifest`'s layout cannot run here (None: they can), with the build that fits."""
    world = manifest.layout.world_size
    if manifest.target.arch == "cpu" or world == 1:
        return None
    gpus = gpus_here() if gpus is None else gpus
    place = RankPlace.from_env()
    needed = world if place is None else place.local_rank + 1
    if gpus >= needed:
        return None
    if manifest.layout.attention_data_parallel:
        fitting = dataclasses.replace(manifest.options, data_parallel_size=max(1, gpus),
                                      enable_expert_parallel=gpus > 1)
    else:
        fitting = dataclasses.replace(manifest.options, tensor_parallel_size=max(1, gpus))
    where = (f"its {world} ranks need one GPU each" if place is None else
             f"this rank (LOCAL_RANK {place.local_rank}) needs GPU {place.local_rank}")
    across = ("" if manifest.layout.attention_data_parallel       # its ranks are started by one front end
              else ", or run its ranks across nodes")
    return (f"{where}, and this machine has {gpus}. Build an artifact for {gpus or 1} GPU(s) with: "
            f"{fitting.rebuild_command(manifest.model.source)}{across} (docs/parallelism.md)")
