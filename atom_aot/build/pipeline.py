"""The build: resolve -> weights -> tune -> export and compile each phase -> capture-size probe -> pack.

Returns a cached artifact at once when one with the same build key exists. Signing (`signing_key`)
is a step on top: it never enters the build key, a fresh artifact is written signed, and a cached
one is signed where it lies (artifact/resign.py).
"""
from __future__ import annotations

import dataclasses
import gc
import json
import logging
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from safetensors.torch import save_file

from atom_aot.arch import FP8_UNSUPPORTED, device_for_arch, detect_arch, toolchain
from atom_aot.artifact.build_options import BuildOptions, drawn_at_load
from atom_aot.artifact.graph_plan import GRAPHS
from atom_aot.artifact.kv_cache import FP8_KV_CACHE_DTYPE, KVCacheSpec
from atom_aot.artifact.layout import CONFIG, GENERATION_CONFIG, TOKENIZER, package_member
from atom_aot.artifact.manifest import (EXPERT_ONLY_SCHEMES, CompiledPackages, Layout, Manifest, ModelIdentity,
                                        Numerics, Quantization, Target, linear_scheme)
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.artifact.signature import SIGNATURE_VERSION
from atom_aot.artifact.tuning import TUNING, Tuning
from atom_aot.artifact.writer import write_artifact
from atom_aot.build.cache import artifact_name, default_cache_dir, find_cached
from atom_aot.build.config import BuildConfig
from atom_aot.build.export import compile_package, export_model
from atom_aot.build.export_mtp import export_mtp
from atom_aot.build.export_sampler import export_sampler
from atom_aot.build.graphs import probe_capture_sizes
from atom_aot.build.key import build_key, key_inputs
from atom_aot.build.mtp_layers import checkpoint_mtp_layers, held_mtp_layers
from atom_aot.build.progress import StageProgress
from atom_aot.build.resume import StageCheckpoints, build_device_name
from atom_aot.build.source import ModelSource, resolve_model
from atom_aot.build.tune import tune_kernels
from atom_aot.dtypes import dtype_name, torch_dtype
from atom_aot.errors import ArtifactError, BuildError
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.parallel import Split, block_split_problem, check_splittable, rank_shapes
from atom_aot.models.quant_layers import FP8_SCHEMES, INT4_SCHEMES
from atom_aot.models.registry import kv_cache_layout
from atom_aot.version import ARTIFACT_FORMAT_VERSION, __version__
from atom_aot.weights.convert import build_meta_model, convert_state_dict
from atom_aot.weights.experts import check_expert_only_model
from atom_aot.weights.int4_checkpoint import check_int4_model
from atom_aot.weights.kv_scales import calibrate_kv_scales, calibration_prompts, checkpoint_has_kv_scales
from atom_aot.weights.quant_config import QuantPlan, resolve_quant_plan
from atom_aot.weights.random_draw import draw_order_metadata, stored_at_load
from atom_aot.weights.shard import check_like, shard_state_dict

if TYPE_CHECKING:
    from atom_aot.artifact.signing import SigningKey

log = logging.getLogger("atom_aot")


@dataclass
class BuildResult:
    path: Path
    key: str
    cached: bool
    seconds: dict[str, float] = field(default_factory=dict)
    signed_by: str | None = None          # the signing key's fingerprint, when the build signed


def check_arch_present(arch: str) -> None:
    here = detect_arch()
    if arch != here:
        raise BuildError(f"cannot build for --arch {arch} on this machine, which is {here}: building needs the "
                         f"target present (kernels are measured on it). Run atom-build on a {arch} machine, "
                         f"or use --arch auto.")


# the linear schemes a latent-attention (DeepSeek) model is built in: its experts are fp8 in these too
MLA_LINEAR_SCHEMES = ("none", "fp8", "fp8-block")


def plan(model: str | None, config: BuildConfig) -> tuple[ModelSource, ModelConfig, str, dict]:
    """Resolve the model and compute the build key, without building."""
    source = resolve_model(model, config.load_format, device_for_arch(config.arch).type)
    model_config = ModelConfig.from_hf_dict(source.config)
    model_class(model_config.architecture)          # fails early on an unsupported architecture
    model_config = checkpoint_mtp_layers(model_config, source.tensor_names)
    linear_quant = resolve_quant_plan(source.config, config.quant)   # and on a quantization it cannot load
    if (linear_scheme(linear_quant.scheme) not in MLA_LINEAR_SCHEMES
            and "mla_attention" in model_class(model_config.architecture).ATTENTION_OPS):
        raise BuildError(f"{model_config.architecture} with {linear_quant.scheme} linears is not supported yet: "
                         f"latent-attention models take {', '.join(MLA_LINEAR_SCHEMES[1:])} (a block-scaled fp8 "
                         f"checkpoint as DeepSeek ships, or --quant fp8 on a bf16 one)")
    if config.tensor_parallel_size > 1 and linear_quant.scheme == "fp8-block":
        problem = block_split_problem(model_config, config.split)
        if problem:
            raise BuildError(f"block-scaled FP8 (128x128 weight blocks) splits over -tp {config.tensor_parallel_size} "
                             f"only where every rank's part is whole blocks: {problem}. Build this checkpoint with a "
                             f"smaller -tp (or -tp 1, or -dp N --ep)")
    if linear_quant.scheme in INT4_SCHEMES:
        check_int4_model(model_config, config.tensor_parallel_size)
    check_fp8_format(config, linear_quant.scheme)
    try:
        check_splittable(model_config, config.split)
    except ValueError as e:
        raise BuildError(str(e)) from None
    if linear_quant.scheme in EXPERT_ONLY_SCHEMES:
        check_expert_only_model(model_config, config.split, linear_quant.scheme, config.torch_dtype)
    inputs = key_inputs(source, config)
    return source, model_config, build_key(inputs), inputs


def check_fp8_format(config: BuildConfig, scheme: str) -> None:
    """FP8 weights (--quant fp8 or an FP8 checkpoint) or an FP8 KV cache only where the arch computes e4m3fn."""
    uses = [what for what, used in ((f"{scheme} linears", scheme in FP8_SCHEMES),
                                    ("--kv-cache-dtype fp8", config.kv_cache_dtype == "fp8")) if used]
    if uses and config.arch in FP8_UNSUPPORTED:
        raise BuildError(f"{' and '.join(uses)} cannot be built for {config.arch}: {FP8_UNSUPPORTED[config.arch]}. "
                         f"Build this model in bf16 there (a bf16 checkpoint, no --quant fp8, --kv-cache-dtype auto), "
                         f"or for an arch with e4m3fn FP8 (sm89+, gfx950)")


def build(model: str | None, config: BuildConfig, cache_dir: Path | None = None, out: Path | None = None,
          force: bool = False, show_progress: bool = True, signing_key: SigningKey | None = None) -> BuildResult:
    """`signing_key`: sign the artifact, built or found in the cache (the build key does not depend on it)."""
    check_arch_present(config.arch)
    progress = StageProgress(show_progress)
    with progress.stage("resolve"):
        source, model_config, key, inputs = plan(model, config)
    cache_dir = Path(cache_dir or default_cache_dir())
    target = Path(out) if out else cache_dir / artifact_name(source.name, config, key)
    cached = _existing(target, cache_dir, key, explicit_out=out is not None)
    if cached is not None and not force:
        return BuildResult(cached, key, cached=True, seconds=progress.seconds, signed_by=_sign(cached, signing_key))
    checkpoints = StageCheckpoints.for_build(cache_dir, key, build_device_name(config.arch))
    if force:
        checkpoints.discard()
    max_len = config.max_model_len or model_config.max_position_embeddings
    layout = _layout(config)
    fp8_kv = config.kv_cache_element_dtype == FP8_KV_CACHE_DTYPE
    kv_scales_given = fp8_kv and checkpoint_has_kv_scales(source.weight_files)
    quant = resolve_quant_plan(source.config, config.quant, fp8_kv, kv_scales_given)
    kv_cache = config.kv_cache_spec(kv_cache_layout(rank_shapes(model_config, config.split)), quant.kv_scales)
    staging = Path(tempfile.mkdtemp(prefix="atom-build-"))
    try:
        phases = _stage_all(staging, source, model_config, config, quant, kv_cache, layout, max_len, progress,
                            checkpoints)
        with progress.stage("pack"):
            manifest = _manifest(source, model_config, config, quant, kv_cache, key, inputs, progress.seconds,
                                 phases, layout, max_len)
            write_artifact(staging, manifest, target, signing_key)
        checkpoints.discard()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BuildResult(target, key, cached=False, seconds=progress.seconds,
                       signed_by=signing_key.fingerprint if signing_key else None)


def _sign(cached: Path, signing_key: SigningKey | None) -> str | None:
    """The cached artifact signed by `signing_key` (checked and signed in place unless that key signed it already)."""
    if signing_key is None:
        return None
    from atom_aot.artifact.resign import sign_artifact
    signed = sign_artifact(cached, signing_key)
    log.info("%s %s with key %s", "signed" if signed.changed else "already signed:", cached, signed.fingerprint)
    return signed.fingerprint


def _existing(target: Path, cache_dir: Path, key: str, explicit_out: bool) -> Path | None:
    if not explicit_out:
        return find_cached(cache_dir, key)
    if target.exists():
        try:
            return target if Artifact.open(target).manifest.build_key == key else None
        except ArtifactError:
            return None
    return None


def _stage_all(staging: Path, source: ModelSource, model_config: ModelConfig, config: BuildConfig,
               quant: QuantPlan, kv_cache: KVCacheSpec, layout: Layout, max_len: int, progress: StageProgress,
               checkpoints: StageCheckpoints) -> list[Phase]:
    """Writes every member but the manifest; returns the phases compiled. Tuning and packages that an
    earlier, unfinished run of this build kept are reused (resume.py); what this run finishes is kept."""
    model_cls = model_class(model_config.architecture)
    model = build_meta_model(model_cls, model_config, config.torch_dtype, quant.scheme, max_len)
    num_tensors = len(model.state_dict())
    (staging / TOKENIZER).mkdir()
    source.save_tokenizer(staging / TOKENIZER)
    with progress.stage("weights", total=num_tensors) as bar:
        state = convert_state_dict(source.tensors(), model, model_config, quant.scheme,
                                   checkpoint_quant=quant.checkpoint)
        bar.update(num_tensors)
        if quant.kv_scales == "calibrated":
            state.update(_calibrate_kv_scales(model_cls, model_config, config, quant.scheme, state, staging, max_len))
        (staging / layout.weights_member(0)).parent.mkdir()
        stored, metadata = None, None
        if drawn_at_load(config.load_format):
            stored, metadata = partial(stored_at_load, kv_scales=quant.kv_scales), draw_order_metadata(source.path)
        if layout.world_size > 1:
            model = build_meta_model(model_cls, model_config, config.torch_dtype, quant.scheme, max_len, config.split)
            state = write_rank_weights(staging, layout, state, model, model_config, stored, metadata)
        else:
            save_file(stored(state) if stored else state, str(staging / layout.weights_member(0)), metadata)
    tuning = checkpoints.tuning()
    with progress.stage("tune" if tuning is None else "tune (resumed)"):
        if tuning is None:
            tuning = tune_kernels(config, rank_shapes(model_config, config.split), max_len, quant.scheme)
            checkpoints.keep_tuning(tuning)
        (staging / TUNING).write_text(tuning.to_json())
    phases = []
    if config.compile == "aoti":
        device = device_for_arch(config.arch)
        model.load_state_dict({k: v.to(device) for k, v in state.items()}, assign=True)
        phases = _compile(staging, model.eval(), tuning, config, kv_cache, max_len, progress, checkpoints)
        model.to("meta")                 # the probe's child process loads the weights on the device again
        del state
        _release_weights(device)
    (staging / CONFIG).parent.mkdir()
    (staging / CONFIG).write_text(json.dumps(source.config, indent=1, sort_keys=True))
    (staging / GENERATION_CONFIG).write_text(json.dumps(source.generation_config, indent=1))
    with progress.stage("capture-size probe"):
        (staging / GRAPHS).write_text(probe_capture_sizes(config, staging, max_len, quant.scheme, kv_cache).to_json())
    return phases


def _release_weights(device) -> None:
    """Frees the build's copy of the weights before the capture-size probe's child loads them again: the exported
    programs that held them as constants are graph modules in reference cycles, which only a collection frees
    (a 93 GB Mixtral on a 141 GB H200 ran the probe out of memory with them held)."""
    gc.collect()
    if device.type == "cuda":
        import torch
        torch.cuda.empty_cache()
        log.info("build: %.1f GiB of device memory held by the build before the capture-size probe",
                 torch.cuda.memory_allocated(device) / 2**30)


def write_rank_weights(staging: Path, layout: Layout, state: dict, rank_model, model_config: ModelConfig,
                       stored: Callable[[dict], dict] | None = None, metadata: dict[str, str] | None = None) -> dict:
    """weights/rank{r}.safetensors for every rank, from the whole model's `state` (only `stored(rank's)` when
    given, with `metadata`: weights drawn at load); returns rank 0's, which the build exports with (the
    ranks' graphs are the same: models/parallel.py)."""
    expected = rank_model.state_dict()
    for rank in reversed(range(layout.world_size)):     # rank 0 last: its tensors are kept
        rank_state = shard_state_dict(state, model_config, Split.of(layout), rank)
        check_like(rank_state, expected, rank)
        save_file(stored(rank_state) if stored else rank_state, str(staging / layout.weights_member(rank)), metadata)
    return rank_state


def _calibrate_kv_scales(model_cls, model_config: ModelConfig, config: BuildConfig, scheme: str, state: dict,
                         staging: Path, max_len: int) -> dict:
    """The fp8 cache's per-layer (k, v) scales, from an eager run of the model on the build's device."""
    device = device_for_arch(config.arch)
    model = build_meta_model(model_cls, model_config, config.torch_dtype, scheme, max_len)
    model.load_state_dict({k: v.to(device) for k, v in state.items()}, assign=True)
    return calibrate_kv_scales(model.eval(), calibration_prompts(staging / TOKENIZER, max_len))


def _compile(staging: Path, model, tuning: Tuning, config: BuildConfig, kv_cache: KVCacheSpec, max_len: int,
             progress: StageProgress, checkpoints: StageCheckpoints) -> list[Phase]:
    """One AOTInductor package per phase: `mixed` everywhere, plus `decode` where graphs replay it, `mtp` for a
    model with MTP layers, and on GPUs `sample` (the sampler's thresholds, build/export_sampler.py)."""
    phases = [Phase.MIXED] if config.arch == "cpu" else [Phase.MIXED, Phase.DECODE]
    device, kv_dtype = device_for_arch(config.arch), torch_dtype(kv_cache.dtype)
    for phase in phases:
        if not _resumed_package(checkpoints, phase, staging, progress):
            model.use_kernels(tuning.for_phase(phase))
            with progress.stage(f"export ({phase})"):
                exported = export_model(model, kv_dtype, config.block_size, max_len, device, phase)
            with progress.stage(f"compile ({phase})"):
                checkpoints.keep_package(phase, compile_package(exported, staging / package_member(phase)))
    mtp_step = model.mtp_step()
    if mtp_step is not None:       # the MTP proposer's own package, one row per sequence: the decode row's kernels
        if not _resumed_package(checkpoints, Phase.MTP, staging, progress):
            model.use_kernels(tuning.for_phase(Phase.DECODE))
            with progress.stage("export (mtp)"):
                exported = export_mtp(model, mtp_step, kv_dtype, config.block_size, max_len, device)
            with progress.stage("compile (mtp)"):
                checkpoints.keep_package(Phase.MTP, compile_package(exported, staging / package_member(Phase.MTP)))
        phases.append(Phase.MTP)
    if config.arch != "cpu":       # the sampler's thresholds: no vocabulary sort at run time
        if not _resumed_package(checkpoints, Phase.SAMPLE, staging, progress):
            with progress.stage("export (sample)"):
                exported = export_sampler(model.config.vocab_size, device)
            with progress.stage("compile (sample)"):
                package = compile_package(exported, staging / package_member(Phase.SAMPLE))
                checkpoints.keep_package(Phase.SAMPLE, package)
        phases.append(Phase.SAMPLE)
    return phases


def _resumed_package(checkpoints: StageCheckpoints, phase: Phase, staging: Path, progress: StageProgress) -> bool:
    """Copies the package an earlier run of this build kept for `phase` into staging; False if none."""
    kept = checkpoints.package(phase)
    if kept is None:
        return False
    with progress.stage(f"compile ({phase}, resumed)"):
        (staging / package_member(phase)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept, staging / package_member(phase))
    return True


def _layout(config: BuildConfig) -> Layout:
    tp, dp = config.tensor_parallel_size, config.data_parallel_size
    return Layout(tensor_parallel_size=tp, expert_parallel_size=tp * dp if config.enable_expert_parallel else 1,
                  data_parallel_size=dp)


def _options(config: BuildConfig) -> BuildOptions:
    """The build options as given (the torch-free record of the config, what `rebuild_command` reproduces)."""
    return BuildOptions(**{f.name: getattr(config, f.name) for f in dataclasses.fields(BuildOptions)})


def _manifest(source: ModelSource, model_config: ModelConfig, config: BuildConfig, quant: QuantPlan,
              kv_cache: KVCacheSpec, key: str, inputs: dict, seconds: dict, phases: list[Phase], layout: Layout,
              max_len: int) -> Manifest:
    """Everything but the member table, which the writer fills in."""
    compiled = (CompiledPackages("aotinductor", {p: package_member(p) for p in phases}) if phases
                else CompiledPackages("none"))
    return Manifest(
        format_version=ARTIFACT_FORMAT_VERSION, build_key=key, engine_version=__version__,
        model=ModelIdentity(name=source.name, source=str(source.path), architecture=model_config.architecture,
                            config_hash=build_key({"config": source.config}), weights_hash=inputs["weights"],
                            tokenizer_hash=inputs["tokenizer"], mtp_layers=held_mtp_layers(model_config)),
        target=Target(arch=config.arch, **toolchain()), build_compiler=inputs["cxx"], options=_options(config),
        numerics=Numerics(dtype_name(config.torch_dtype), max_len, config.block_size), kv_cache=kv_cache,
        layout=layout, compiled=compiled, quantization=Quantization(quant.scheme, **quant.manifest_details()),
        signature_version=SIGNATURE_VERSION, members={},
        built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), build_host=socket.gethostname(),
        build_seconds=dict(seconds))
