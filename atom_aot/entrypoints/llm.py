"""The public offline API: `LLMEngine(model=...)`, `generate`, `add_request`, `step`, `is_finished`.

`model` may be an artifact (`.atom` file or folder) or a model (HF folder, GGUF file, or None for
the embedded default); a model is built into the artifact cache first (in a child `atom-build`),
so both run the runtime's artifact engine. Build options (dtype, quant, -tp, ...) apply only to a
model: an artifact's were fixed when it was built. `torch_profiler_dir` (default: ATOM's
`ATOM_TORCH_PROFILER_DIR`) enables `start_profile()` / `stop_profile()`. On a GPU a step computes up to 16384
tokens unless `max_num_batched_tokens` says otherwise (vLLM's offline default; the server's is 8192).
"""
from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path

from atom_aot.arch import detect_arch
from atom_aot.artifact.build_options import DECIDED_AT_SERVE_TIME, BuildOptions
from atom_aot.artifact.reader import Artifact
from atom_aot.config_flags import to_argv
from atom_aot.logging_setup import show_engine_logs
from atom_aot.runtime import profiler
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.llm_engine import ArtifactEngine

log = logging.getLogger("atom_aot")

BUILD_OPTIONS = {f.name for f in fields(BuildOptions)} - set(DECIDED_AT_SERVE_TIME) | {"cache_dir"}


def is_artifact(path: str | Path | None) -> bool:
    if path is None:
        return False
    p = Path(path)
    return p.suffix == ".atom" or (p.is_dir() and (p / "manifest.json").exists())


class LLMEngine(ArtifactEngine):
    def __init__(self, model: str | None = None, torch_profiler_dir: str | None = None, **options):
        show_engine_logs()
        unknown = set(options) - BUILD_OPTIONS - RuntimeConfig.field_names()
        if unknown:
            raise TypeError(f"unknown LLMEngine options: {', '.join(sorted(unknown))}")
        build = {k: v for k, v in options.items() if k in BUILD_OPTIONS}
        config = RuntimeConfig(**{k: v for k, v in options.items() if k in RuntimeConfig.field_names()})
        if is_artifact(model):
            refuse_build_options(model, build)
            artifact = Path(model)
        else:
            result = build_into_cache(model, build, config.max_model_len)
            log.info("artifact %s (%s)", result["path"], "cached" if result["cached"] else "built")
            artifact = result["path"]
        traces = torch_profiler_dir or profiler.dir_from_env()
        manifest = Artifact.open(artifact, config.trusted_keys).manifest
        config, layout = config.for_offline(manifest.target.arch), manifest.layout
        if traces and layout.attention_data_parallel:
            raise ValueError("torch_profiler_dir: the ranks of a data-parallel-attention artifact run in their own "
                             "processes, which the offline engine does not profile; profile them through "
                             "`atom-run ART serve --torch-profiler-dir`")
        super().__init__(artifact, config, profiler.TorchProfiler(traces, more=profiler.more_from_env()))


def refuse_build_options(artifact: str | Path, build: dict) -> None:
    """Build options given with an artifact would be silently ignored: say so instead."""
    if not build:
        return
    options = {k: v for k, v in build.items() if k != "cache_dir"}
    rebuild = ["atom-build", "--model", "MODEL"] + to_argv(BuildOptions(arch=detect_arch(), **options), skip=("arch",))
    raise ValueError(f"{', '.join(sorted(build))}: build options, fixed when {artifact} was built, so they cannot "
                     f"change here. Build an artifact with them ({' '.join(rebuild)}) and pass that, or pass "
                     f"the model folder and LLMEngine builds it.")


def build_into_cache(model: str | None, build: dict, max_model_len: int | None) -> dict:
    """The cached build of `model` for this machine, made first by a child atom-build if missing:
    {"path", "key", "cached", "seconds"}."""
    from atom_aot.build.cache import default_cache_dir
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.isolated import build_cached
    cache_dir = Path(build.pop("cache_dir", None) or default_cache_dir())
    config = BuildConfig(arch=detect_arch(), max_model_len=max_model_len, **build)
    return build_cached(model, config, cache_dir)
