"""The build key: a hash of everything that determines an artifact's bytes.

Same inputs give the same key (the build is then a cache hit); changing any one of them (a
weight value, a config field, the tokenizer, the toolchain, a build option, or the engine code
that converts, exports and compiles) gives another.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import xxhash

from atom_aot.arch import toolchain
from atom_aot.build.config import BuildConfig
from atom_aot.build.cxx import wrapper_compiler
from atom_aot.build.source import ModelSource
from atom_aot.version import ARTIFACT_FORMAT_VERSION, __version__

# Engine code whose behaviour shapes the artifact (model definitions, ops, conversion, export, the
# graph-pool probe the build runs, and the artifact format itself), and the random-weight draw, which a
# --load-format dummy-at-load artifact's runtime repeats at every load.
ENGINE_CODE = ("models", "ops", "artifact", "weights", "distributed/collectives.py", "build/export.py", "build/tune.py",
               "build/graphs.py", "build/cxx.py", "build/tune_fp8.py", "entrypoints/graph_probe.py",
               "runtime/execution/cuda_graphs.py", "runtime/loading/drawn_weights.py")


def engine_code_hash() -> str:
    root = Path(__file__).resolve().parents[1]      # the atom_aot package
    h = xxhash.xxh3_128()
    for entry in ENGINE_CODE:
        path = root / entry
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if f.exists():
                h.update(f.relative_to(root).as_posix().encode())
                h.update(f.read_bytes())
    return h.hexdigest()


def key_inputs(source: ModelSource, config: BuildConfig) -> dict:
    return {
        "format_version": ARTIFACT_FORMAT_VERSION,
        "engine": {"version": __version__, "code": engine_code_hash()},
        "weights": source.weights_hash(),
        "config": source.config,
        "generation_config": source.generation_config,
        "tokenizer": source.tokenizer_hash(),
        "toolchain": toolchain(),
        "cxx": wrapper_compiler()["version"] if config.compile == "aoti" else None,
        "build": config.key_fields(),
    }


def build_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
