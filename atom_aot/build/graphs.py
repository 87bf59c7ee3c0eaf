"""CUDA-graph capture sizes and the graph-pool bytes each needs, measured at build (graphs.json)."""
from __future__ import annotations

from atom_aot.build.config import BuildConfig


def probe_capture_sizes(config: BuildConfig) -> dict:
    if config.arch == "cpu":
        return {"capture_sizes": [], "pool_bytes": {}, "note": "no CUDA graphs on the cpu arch"}
    raise ValueError(f"graph capture probing for {config.arch} is not available in this build of atom-aot")
