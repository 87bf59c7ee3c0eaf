"""The backend registry: for each op the model calls through a backend, the implementations by name.

tuning.json holds, per phase, a `BackendChoice` for each op (e.g. attention -> "triton" with its
launch params); an arch differs only by the names and params in its rows. Adding a backend (amd
aiter's attention, an MLA attention) is adding an entry here and a module implementing the op's
protocol (base.py): model code never branches on a backend. Modules are imported only when a row
names them, so the CPU path never imports triton.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.errors import ArtifactError


@dataclass(frozen=True)
class BackendEntry:
    module: str         # imported on first use
    factory: str        # in that module: BackendChoice -> the backend (a callable of the op's protocol)


REGISTRY: dict[str, dict[str, BackendEntry]] = {
    "attention": {
        "reference": BackendEntry("atom_aot.ops.backends.reference", "ReferenceAttention"),
        "triton": BackendEntry("atom_aot.ops.backends.triton", "TritonAttention"),
    },
    "mla_attention": {
        "reference": BackendEntry("atom_aot.ops.backends.mla", "ReferenceMLA"),
        "triton": BackendEntry("atom_aot.ops.backends.mla_mixed", "triton_mla"),
    },
    "moe": {
        "reference": BackendEntry("atom_aot.ops.backends.moe", "ReferenceMoE"),
        "triton": BackendEntry("atom_aot.ops.backends.moe", "TritonMoE"),
    },
    "fp8_linear": {
        "aten": BackendEntry("atom_aot.ops.backends.fp8_linear", "AtenFp8Linear"),
        "triton": BackendEntry("atom_aot.ops.backends.fp8_linear", "TritonFp8Linear"),
        "small_m+aten": BackendEntry("atom_aot.ops.backends.fp8_linear", "small_m_over_aten"),
        "small_m+triton": BackendEntry("atom_aot.ops.backends.fp8_linear", "small_m_over_triton"),
    },
    "silu_mul_quant": {
        "inductor": BackendEntry("atom_aot.ops.backends.silu_mul_quant", "InductorSiluMulQuant"),
        "triton": BackendEntry("atom_aot.ops.backends.silu_mul_quant", "TritonSiluMulQuant"),
    },
    "rms_norm_quant": {
        "inductor": BackendEntry("atom_aot.ops.backends.rms_norm_quant", "InductorRmsNormQuant"),
        "triton": BackendEntry("atom_aot.ops.backends.rms_norm_quant", "TritonRmsNormQuant"),
    },
    "int8_linear": {
        "aten": BackendEntry("atom_aot.ops.backends.int8_linear", "AtenInt8Linear"),
        "small_m+aten": BackendEntry("atom_aot.ops.backends.int8_linear", "SmallMInt8Linear"),
    },
    "int4_linear": {
        "aten": BackendEntry("atom_aot.ops.backends.int4_linear", "AtenInt4Linear"),
        "triton": BackendEntry("atom_aot.ops.backends.int4_linear", "TritonInt4Linear"),
        "small_m+aten": BackendEntry("atom_aot.ops.backends.int4_linear", "small_m_over_aten"),
        "small_m+triton": BackendEntry("atom_aot.ops.backends.int4_linear", "small_m_over_triton"),
    },
}


def make_backend(op: str, choice: BackendChoice):
    """The backend `choice` names for `op`, configured with its params."""
    entries = REGISTRY[op]
    entry = entries.get(choice.backend)
    if entry is None:
        raise ArtifactError(f"tuning.json names the {op} backend {choice.backend!r}, which this atom-aot does not "
                            f"have (it has {', '.join(entries)}). Rebuild the artifact with this atom-aot's "
                            f"atom-build.")
    return getattr(importlib.import_module(entry.module), entry.factory)(choice)
