"""The build: resolve -> weights -> export -> compile -> tune -> capture-size probe -> pack.

Returns a cached artifact at once when one with the same build key exists.
"""
from __future__ import annotations

import json
import logging
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import save_file

from atom_aot.arch import device_for_arch, detect_arch, toolchain
from atom_aot.build.cache import artifact_name, default_cache_dir, find_cached
from atom_aot.build.config import BuildConfig
from atom_aot.build.export import compile_package, export_model
from atom_aot.build.graphs import probe_capture_sizes
from atom_aot.build.key import build_key, key_inputs
from atom_aot.build.pack import write_artifact
from atom_aot.build.progress import StageProgress
from atom_aot.build.source import ModelSource, resolve_model
from atom_aot.build.tune import tune_kernels
from atom_aot.build.weights import build_meta_model, convert_state_dict
from atom_aot.errors import ArtifactError, BuildError
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import Tuning
from atom_aot.models import ModelConfig, model_class
from atom_aot.version import ARTIFACT_FORMAT_VERSION, __version__

log = logging.getLogger("atom_aot")


@dataclass
class BuildResult:
    path: Path
    key: str
    cached: bool
    seconds: dict[str, float] = field(default_factory=dict)


def check_arch_present(arch: str) -> None:
    here = detect_arch()
    if arch != here:
        raise BuildError(f"cannot build for --arch {arch} on this machine, which is {here}: building needs the "
                         f"target present (kernels are measured on it). Run atom-build on a {arch} machine, "
                         f"or use --arch auto.")


def plan(model: str | None, config: BuildConfig) -> tuple[ModelSource, ModelConfig, str, dict]:
    """Resolve the model and compute the build key, without building."""
    source = resolve_model(model)
    model_config = ModelConfig.from_hf_dict(source.config)
    model_class(model_config.architecture)          # fails early on an unsupported architecture
    if config.tensor_parallel_size != 1 or config.enable_expert_parallel:
        raise BuildError("tensor and expert parallelism are not implemented yet in atom-aot: build with -tp 1")
    inputs = key_inputs(source, config)
    return source, model_config, build_key(inputs), inputs


def build(model: str | None, config: BuildConfig, cache_dir: Path | None = None, out: Path | None = None,
          force: bool = False, show_progress: bool = True) -> BuildResult:
    check_arch_present(config.arch)
    progress = StageProgress(show_progress)
    with progress.stage("resolve"):
        source, model_config, key, inputs = plan(model, config)
    cache_dir = Path(cache_dir or default_cache_dir())
    target = Path(out) if out else cache_dir / artifact_name(source.name, config, key)
    cached = _existing(target, cache_dir, key, explicit_out=out is not None)
    if cached is not None and not force:
        return BuildResult(cached, key, cached=True, seconds=progress.seconds)
    staging = Path(tempfile.mkdtemp(prefix="atom-build-"))
    try:
        phases = _stage_all(staging, source, model_config, config, progress)
        with progress.stage("pack"):
            manifest = _manifest(source, model_config, config, key, inputs, progress.seconds, phases)
            write_artifact(staging, manifest, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BuildResult(target, key, cached=False, seconds=progress.seconds)


def _existing(target: Path, cache_dir: Path, key: str, explicit_out: bool) -> Path | None:
    if not explicit_out:
        return find_cached(cache_dir, key)
    if target.exists():
        from atom_aot.runtime.artifact import Artifact
        try:
            return target if Artifact.open(target).manifest.get("build_key") == key else None
        except ArtifactError:
            return None
    return None


def _stage_all(staging: Path, source: ModelSource, model_config: ModelConfig, config: BuildConfig,
               progress: StageProgress) -> list[Phase]:
    """Writes every member but the manifest; returns the phases compiled."""
    max_len = config.max_model_len or model_config.max_position_embeddings
    model_cls = model_class(model_config.architecture)
    model = build_meta_model(model_cls, model_config, config.torch_dtype, config.quant, max_len)
    num_tensors = len(model.state_dict())
    with progress.stage("weights", total=num_tensors) as bar:
        state = convert_state_dict(source.tensors(), model, model_config, config.quant)
        bar.update(num_tensors)
        (staging / "weights").mkdir()
        save_file(state, str(staging / "weights" / "rank0.safetensors"))
    with progress.stage("tune"):
        tuning = tune_kernels(config, model_config, max_len)
        (staging / "tuning.json").write_text(tuning.to_json())
    phases = []
    if config.compile == "aoti":
        device = device_for_arch(config.arch)
        model.load_state_dict({k: v.to(device) for k, v in state.items()}, assign=True)
        phases = _compile(staging, model.eval(), tuning, config, max_len, progress)
    (staging / "tokenizer").mkdir()
    source.save_tokenizer(staging / "tokenizer")
    (staging / "config").mkdir()
    (staging / "config" / "config.json").write_text(json.dumps(source.config, indent=1, sort_keys=True))
    (staging / "config" / "generation_config.json").write_text(json.dumps(source.generation_config, indent=1))
    with progress.stage("capture-size probe"):
        graphs = probe_capture_sizes(config, staging, max_len)
        (staging / "graphs.json").write_text(json.dumps(graphs, indent=1))
    return phases


def _compile(staging, model, tuning: Tuning, config: BuildConfig, max_len: int, progress: StageProgress) -> list[Phase]:
    """One AOTInductor package per phase: `mixed` everywhere, plus `decode` where graphs replay it."""
    phases = [Phase.MIXED] if config.arch == "cpu" else [Phase.MIXED, Phase.DECODE]
    device = device_for_arch(config.arch)
    for phase in phases:
        model.use_kernels(tuning.for_phase(phase))
        with progress.stage(f"export ({phase})"):
            exported = export_model(model, config.kv_torch_dtype, config.block_size, max_len, device, phase)
        with progress.stage(f"compile ({phase})"):
            compile_package(exported, staging / "compiled" / f"{phase}.pt2")
    return phases


def _manifest(source: ModelSource, model_config: ModelConfig, config: BuildConfig, key: str, inputs: dict,
              seconds: dict, phases: list[Phase]) -> dict:
    return {
        "format_version": ARTIFACT_FORMAT_VERSION,
        "build_key": key,
        "engine_version": __version__,
        "model": {"name": source.name, "source": str(source.path), "architecture": model_config.architecture,
                  "config_hash": build_key({"config": source.config}), "weights_hash": inputs["weights"],
                  "tokenizer_hash": inputs["tokenizer"]},
        "target": {"arch": config.arch, **toolchain()},
        "build_compiler": inputs["cxx"],
        "build": {**config.key_fields(),
                  "max_model_len": config.max_model_len or model_config.max_position_embeddings},
        "compiled": {"kind": "aotinductor", "packages": {p.value: f"compiled/{p}.pt2" for p in phases}} if phases
                    else {"kind": "none"},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_host": socket.gethostname(),
        "build_seconds": dict(seconds),
    }
