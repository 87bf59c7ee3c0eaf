"""graphs.json: the CUDA-graph capture sizes and the graph-pool bytes the build measured for them, and the
activation memory of a mixed step and of the sampler, so the runtime sets that memory aside before sizing the
KV cache (instead of a bound) and captures without trial."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from atom_aot.artifact.fields import Reader
from atom_aot.errors import ArtifactError

GRAPHS = "graphs.json"


@dataclass(frozen=True)
class StepMemory:
    """Peak memory a step allocates beside the weights, KV cache and graphs, measured at build on the target
    (entrypoints/graph_probe.py): per token of a mixed (prefill) forward, and per logits row of sampling (the
    logits, the sampler's passes with every option on, logprobs). The runtime scales both by its own
    max_num_batched_tokens and logits rows."""
    bytes_per_token: int
    bytes_per_logits_row: int
    tokens: int                       # the mixed step measured: this many tokens ...
    rows: int                         # ... and this many logits rows sampled


@dataclass(frozen=True)
class GraphPlan:
    capture_sizes: tuple[int, ...]    # decode batch sizes captured, increasing; () for no graphs
    pool_bytes: int                   # memory reserved by capturing every size into one pool
    note: str                         # why there are no graphs, or how pool_bytes was measured
    step_memory: StepMemory | None = None   # None: not measured (CPU builds, no graphs, older artifacts)

    @classmethod
    def none(cls, why: str) -> "GraphPlan":
        return cls((), 0, why)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps({"capture_sizes": list(self.capture_sizes), "pool_bytes": self.pool_bytes,
                           "note": self.note,
                           "step_memory": asdict(self.step_memory) if self.step_memory else None}, indent=indent)

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
        return cls(sizes, r.int("pool_bytes", minimum=0), r.str("note"), read_step_memory(r))


def read_step_memory(r: Reader) -> StepMemory | None:
    """graphs.json's step_memory: absent or null in artifacts built before it was measured."""
    raw = r.raw("step_memory", None)
    if raw is None:
        return None
    m = Reader(raw, f"{r.where}.step_memory")
    return StepMemory(m.int("bytes_per_token", minimum=0), m.int("bytes_per_logits_row", minimum=0),
                      m.int("tokens", minimum=1), m.int("rows", minimum=1))
