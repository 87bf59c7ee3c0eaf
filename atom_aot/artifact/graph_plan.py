"""graphs.json: the CUDA-graph capture sizes and the graph-pool bytes the build measured for them,
so the runtime sets that memory aside before sizing the KV cache and captures without trial."""
from __future__ import annotations

import json
from dataclasses import dataclass

from atom_aot.artifact.fields import Reader
from atom_aot.errors import ArtifactError

GRAPHS = "graphs.json"


@dataclass(frozen=True)
class GraphPlan:
    capture_sizes: tuple[int, ...]    # decode batch sizes captured, increasing; () for no graphs
    pool_bytes: int                   # memory reserved by capturing every size into one pool
    note: str                         # why there are no graphs, or how pool_bytes was measured

    @classmethod
    def none(cls, why: str) -> "GraphPlan":
        return cls((), 0, why)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps({"capture_sizes": list(self.capture_sizes), "pool_bytes": self.pool_bytes,
                           "note": self.note}, indent=indent)

    @classmethod
    def from_json(cls, raw: bytes | str, where: str = GRAPHS) -> "GraphPlan":
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ArtifactError(f"{where} is not valid JSON ({e}). Rebuild the artifact with atom-build.") from None
        r = Reader(data, where)
        sizes = r.ints("capture_sizes")
        if not all(s >= 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise r.error("capture_sizes", f"must be increasing positive integers, got {list(sizes)!r:.60}")
        return cls(sizes, r.int("pool_bytes", minimum=0), r.str("note"))
