"""tuning.json: the kernel choices the build measured on the target, per phase and op.

Each op of a phase names a backend (an entry of the arch's backend registry, e.g. `reference`,
`triton`; later `aiter`, `mla`) and the integer launch parameters that backend was measured
with, grouped by the kernel they configure. The runtime and the export read this; neither ever
measures.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from atom_aot.artifact.fields import Reader
from atom_aot.artifact.phase import Phase
from atom_aot.errors import ArtifactError

TUNING = "tuning.json"


@dataclass(frozen=True)
class BackendChoice:
    backend: str                                              # registry name, e.g. "reference", "triton"
    params: dict[str, tuple[int, ...]] = field(default_factory=dict)   # kernel -> launch parameters

    def to_dict(self) -> dict:
        return {"backend": self.backend, "params": {k: list(v) for k, v in self.params.items()}}

    @classmethod
    def from_reader(cls, r: Reader, _key: str = "") -> "BackendChoice":
        params = r.obj("params", {})
        return cls(r.str("backend"), {k: params.ints(k) for k in params.data})


@dataclass(frozen=True)
class PhaseTuning:
    """One phase's row: op name ("attention", ...) -> the backend that runs it."""
    ops: dict[str, BackendChoice]

    def op(self, name: str) -> BackendChoice:
        try:
            return self.ops[name]
        except KeyError:
            raise ArtifactError(f"tuning.json has no choice for op {name!r} (it has {', '.join(self.ops)}). "
                                f"Rebuild the artifact with this atom-aot's atom-build.") from None

    def to_dict(self) -> dict:
        return {name: choice.to_dict() for name, choice in self.ops.items()}

    @classmethod
    def from_reader(cls, r: Reader, _key: str = "") -> "PhaseTuning":
        return cls({name: BackendChoice.from_reader(r.obj(name)) for name in r.data})


def timings_json(rows: dict) -> dict:
    """{shape: {config tuple: ms}} as tuning.json keeps it: shapes as strings, configs comma-joined (JSON's
    keys are strings; a tuple key fails to serialize)."""
    return {str(shape): {",".join(map(str, c)): ms for c, ms in row.items()} for shape, row in rows.items()}


@dataclass(frozen=True)
class Tuning:
    arch: str
    measured: bool                                   # False: one implementation per op (nothing to time)
    phases: dict[Phase, PhaseTuning]
    kernels: dict[str, str] = field(default_factory=dict)    # op -> what runs it, for `inspect`
    measurements_ms: dict = field(default_factory=dict)      # the timings behind the choices (free-form)

    def __post_init__(self):
        if Phase.MIXED not in self.phases:
            raise ArtifactError("tuning.json must have a row for the mixed phase")

    def describe(self, op: str) -> str:
        """What runs `op`, in words: the build's description, else the backend each phase names."""
        return self.kernels.get(op) or "; ".join(f"{phase.value}: {row.ops[op].backend}"
                                                 for phase, row in self.phases.items() if op in row.ops)

    def for_phase(self, phase: Phase) -> PhaseTuning:
        """The row of `phase`; a phase without its own row uses the mixed one."""
        return self.phases.get(phase, self.phases[Phase.MIXED])

    def to_dict(self) -> dict:
        return {"arch": self.arch, "measured": self.measured,
                "phases": {p.value: row.to_dict() for p, row in self.phases.items()},
                "kernels": dict(self.kernels), "measurements_ms": self.measurements_ms}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data) -> "Tuning":
        r = Reader(data, TUNING)
        rows = r.obj("phases")
        phases = {}
        for name in rows.data:
            if name not in {p.value for p in Phase}:
                raise ArtifactError(f"{TUNING}.phases has an unknown phase {name!r:.40}")
            phases[Phase(name)] = PhaseTuning.from_reader(rows.obj(name))
        return cls(arch=r.str("arch"), measured=r.bool("measured"), phases=phases,
                   kernels=r.str_map("kernels", {}), measurements_ms=r.typed("measurements_ms", dict, {}))
