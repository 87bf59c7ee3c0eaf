"""The one composition root: from an artifact, a RuntimeConfig and a Topology to a running engine.

Every start goes through here. runtime/assembly.py `start_core` makes this process's EngineCore (in an engine
process of the server, an offline engine of one process, or one data-parallel-attention rank); `launch` gives the offline engine
(LLMEngine, `atom-run ART generate`) its core: that one, or for a data-parallel-attention artifact the ranks' engine
processes behind a synchronous client; `launch_served` gives the server's front end its asynchronous client of
one engine process, of `-dp N` replicas, or of the ranks of a data-parallel-attention artifact. Ranks 1..N-1 of a
tensor-parallel engine run runtime/parallel/tp_worker.py, started from here by rank 0.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from atom_aot.artifact.manifest import Manifest
from atom_aot.artifact.reader import Artifact
from atom_aot.errors import StartupError
from atom_aot.runtime.assembly import alongside, start_core
from atom_aot.runtime.config import RuntimeConfig

log = logging.getLogger("atom_aot")


@dataclass(frozen=True)
class Topology:
    """How a served artifact's engines map onto processes beside what its layout fixed at build: `replicas` whole
    copies of the engine (-dp N), and how requests are routed between engines (None: the default routing)."""
    replicas: int = 1
    routing: str | None = None


def launch(artifact_path: str | Path, config: RuntimeConfig, beside: Callable[[], None] | None = None):
    """The offline engine's (loaded, core): this process's EngineCore, or for a data-parallel-attention artifact its
    ranks' engine processes behind a synchronous client with the core's interface (runtime/processes/offline_ranks.py).
    `beside` runs in a thread beside the start."""
    layout = Artifact.open(artifact_path, config.trusted_keys).manifest.layout
    if not layout.attention_data_parallel:
        return start_core(artifact_path, config, beside)
    from atom_aot.runtime.processes.offline_ranks import RemoteRanks
    ranks = alongside(beside, lambda: RemoteRanks(artifact_path, config))
    return ranks.loaded, ranks


def launch_served(artifact_path: str, config: RuntimeConfig, manifest: Manifest, topology: Topology,
                  profiler_dir: str | None, log_level: str):
    """The server's engine client (not started): one engine process, `topology.replicas` replicas behind one client,
    or the ranks of a data-parallel-attention artifact behind one client."""
    from atom_aot.runtime.processes.client import EngineClient
    from atom_aot.runtime.processes.data_parallel import DataParallelClient, attention_dp_client, trace_dir
    from atom_aot.runtime.processes.prefix_routing import ROUTINGS
    layout = manifest.layout
    if layout.attention_data_parallel:
        if topology.replicas != 1:
            raise StartupError(f"-dp {topology.replicas}: this artifact's {layout.world_size} ranks are already "
                               f"data-parallel engines (built with -dp {layout.data_parallel_size} --ep), and "
                               f"replicating the whole group is not supported yet: serve it without -dp")
        return attention_dp_client(artifact_path, config, layout.world_size, profiler_dir, log_level,
                                   topology.routing or ROUTINGS[0])
    if topology.replicas == 1 and topology.routing is not None:
        raise StartupError(f"--dp-routing {topology.routing}: this server runs one engine, so there is nothing to "
                           f"route between; give -dp N (N > 1) or drop --dp-routing")
    replicas = [EngineClient(artifact_path, config, trace_dir(profiler_dir, i * layout.world_size), log_level)
                for i in range(topology.replicas)]
    if len(replicas) == 1:
        return replicas[0]
    return DataParallelClient(replicas, None if manifest.target.arch == "cpu" else layout.world_size,
                              routing=topology.routing or ROUTINGS[0])
