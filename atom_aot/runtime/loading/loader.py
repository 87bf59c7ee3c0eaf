"""Load an artifact for serving: check it, map its weights, and make the model callable.

Order matters: opening the artifact checks the manifest (its checksum, its signature by a trusted
key when `trusted_keys` is given, every field, the fixed member layout); then the target (arch,
toolchain, forward signature) and every member's hash are checked, all before anything is
deserialized or any compiled code is touched.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, TypeVar

import torch

from atom_aot.arch import detect_arch, device_for_arch, toolchain
from atom_aot.artifact.build_options import drawn_at_load, random_weights
from atom_aot.artifact.graph_plan import GraphPlan
from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.artifact.layout import CONFIG, GENERATION_CONFIG, TOKENIZER
from atom_aot.artifact.manifest import Manifest, Target
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.artifact.signature import SIGNATURE_VERSION
from atom_aot.artifact.tuning import Tuning
from atom_aot.dtypes import torch_dtype
from atom_aot.errors import ArtifactError
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.parallel import Split, rank_shapes
from atom_aot.models.registry import kv_cache_layout
from atom_aot.runtime.loading.placement import placement_problem
from atom_aot.runtime.loading.safetensors_view import metadata_of, tensors_from_buffer, tensors_on_device

log = logging.getLogger("atom_aot")
T = TypeVar("T")


@dataclass
class LoadedArtifact:
    path: Path
    manifest: Manifest
    tuning: Tuning
    graph_plan: GraphPlan               # capture sizes and pool bytes measured at build
    model_config: ModelConfig
    hf_config: dict                     # config/config.json as built (its eos_token_id backs generation_config's)
    rank: int                           # tensor-parallel rank whose weights these are
    weights: dict[str, torch.Tensor]    # the runtime's parameters, on the device
    forwards: dict[Phase, Callable]     # phase -> callable with the exported signature (`mtp`: deepseek_mtp.MTPStep's,
                                        # `sample`: compiled.CompiledSampler's)
    execution: str                      # which path runs: "aotinductor" or "eager"
    device: torch.device
    dtype: torch.dtype
    kv_cache: KVCacheSpec               # this rank's cache: dtype, layout, scales
    block_size: int
    max_model_len: int
    generation_config: dict
    tokenizer_dir: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def rank_config(self) -> ModelConfig:
        """The sizes this rank computes (its heads and KV heads): what its KV cache is sized by."""
        return rank_shapes(self.model_config, Split.of(self.manifest.layout))


def machine_target() -> Target:
    return Target(arch=detect_arch(), **toolchain())


def load_problem(manifest: Manifest) -> str | None:
    """Why this machine cannot load an artifact (None: it can), with the atom-build command that fixes it."""
    here = machine_target()
    mismatch = manifest.target.mismatch(here)
    if mismatch:
        name, built, found = mismatch
        return (f"it was built for {name} {built!r}, but this machine has {found!r}. Compiled code is tied to the "
                f"arch and toolchain it was built with. Make a matching artifact here with: "
                f"{manifest.rebuild_command(here.arch)}")
    if manifest.signature_version != SIGNATURE_VERSION:
        return (f"its model takes forward signature {manifest.signature_version}, but this runtime calls signature "
                f"{SIGNATURE_VERSION}. Rebuild it with: {manifest.rebuild_command()}")
    return placement_problem(manifest)


def check_target(artifact: Artifact) -> None:
    """Refuse an artifact this machine cannot load, saying how to make one it can."""
    problem = load_problem(artifact.manifest)
    if problem:
        raise ArtifactError(f"{artifact.path} is not loaded: {problem}")


def load_artifact(path: str | Path, enforce_eager: bool = False, rank: int = 0,
                  trusted_keys: str | Path | None = None) -> LoadedArtifact:
    """The artifact with tensor-parallel rank `rank`'s weights (the ranks share the compiled packages); with
    `trusted_keys` (a folder of public keys), only if one of them signed it."""
    timings = {}
    start = time.perf_counter()
    artifact = Artifact.open(path, trusted_keys)
    check_target(artifact)
    weight_members = artifact.manifest.layout.weight_members()
    artifact.verify(skip=frozenset(weight_members))       # the weights are hashed while they load (_weights_reader)
    timings["verify"] = time.perf_counter() - start

    manifest, numerics = artifact.manifest, artifact.manifest.numerics
    device = _this_rank_device(manifest.target.arch)
    hf_config = artifact.read_json(CONFIG)
    model_config = _model_config(artifact, hf_config)
    tuning = artifact.read_tuning()
    compiled = manifest.compiled.kind == "aotinductor" and not enforce_eager
    read_weights = _weights_reader(artifact, rank, device, timings)
    if compiled:
        weights, forwards = _load_compiled(artifact, read_weights, device, timings)
    else:
        weights, forwards = _load_eager(manifest, model_config, tuning, read_weights, timings)
    execution = "aotinductor" if compiled else "eager"
    if random_weights(manifest.options.load_format):
        log.warning("this artifact's weights are random (built with --load-format %s): for benchmarks only",
                    manifest.options.load_format)
    log.info("model path: %s (%s)", execution,
             "compiled package from the artifact" if compiled else
             "--enforce-eager" if enforce_eager else "the artifact has no compiled code (built with --compile none)")
    for op in model_class(model_config.architecture).ATTENTION_OPS:     # which kernels the phases were built with
        log.info("%s: %s", op, tuning.describe(op))
    return LoadedArtifact(
        path=artifact.path, manifest=manifest, tuning=tuning, graph_plan=artifact.read_graph_plan(),
        model_config=model_config, hf_config=hf_config, rank=rank, weights=weights, forwards=forwards,
        execution=execution,
        device=device, dtype=torch_dtype(numerics.dtype), kv_cache=_kv_cache_spec(manifest, model_config),
        block_size=numerics.block_size, max_model_len=numerics.max_model_len,
        generation_config=artifact.read_json(GENERATION_CONFIG), tokenizer_dir=artifact.member_dir(TOKENIZER),
        timings=timings)


def _kv_cache_spec(manifest: Manifest, model_config: ModelConfig) -> KVCacheSpec:
    """The manifest's KV cache spec with this rank's layout as the model class makes it, which must be the one the
    build recorded (an artifact of format 2 records none: it is derived here)."""
    try:
        return manifest.kv_cache.with_layout(kv_cache_layout(rank_shapes(model_config, Split.of(manifest.layout))))
    except ValueError as e:
        raise ArtifactError(f"{e}: rebuild it with this atom-aot ({manifest.rebuild_command()})") from None


def _this_rank_device(arch: str) -> torch.device:
    """The device with its index: a tensor-parallel rank has set its GPU as the current one."""
    device = device_for_arch(arch)
    return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" else device


def _model_config(artifact: Artifact, hf_config: dict) -> ModelConfig:
    """config.json's model with the MTP layers the manifest says the artifact holds (build/mtp_layers.py)."""
    built_mtp_layers = artifact.manifest.model.mtp_layers
    try:
        cfg = ModelConfig.from_hf_dict(hf_config)
        return cfg if built_mtp_layers is None else cfg.with_mtp_layers(built_mtp_layers)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{artifact.path}: {CONFIG} is not a usable model config ({type(e).__name__}: {e}). "
                            f"Rebuild the artifact with atom-build.") from None


def _weights_reader(artifact: Artifact, rank: int, device: torch.device,
                    timings: dict) -> Callable[[], dict[str, torch.Tensor]]:
    """What gives the rank's weights on the device: its weights member, or, for an artifact built with
    --load-format dummy-at-load, a draw (that member holds only what a draw cannot reproduce).

    The weight members are checked here rather than in load_artifact's verify: on a GPU beside the upload.
    Rank 0 checks every rank's file (a damaged one is refused by the rank whose error the user reads),
    the other ranks their own; a -tp 2 start hashed 16 GB on each rank before (1.65 s)."""
    own, every = artifact.manifest.layout.weights_member(rank), artifact.manifest.layout.weight_members()
    check = partial(artifact.verify, only=every, threads=len(every)) if rank == 0 else \
        partial(artifact.verify, only=[own])
    if not drawn_at_load(artifact.manifest.options.load_format):
        return partial(_weights, artifact.unchecked_member_buffer(own), device, check)
    check()                                # the stored part of a drawn artifact is small

    def draw() -> dict[str, torch.Tensor]:
        from atom_aot.runtime.loading.drawn_weights import draw_artifact_weights
        start = time.perf_counter()
        buffer = artifact.member_buffer(own)
        weights = draw_artifact_weights(artifact, rank, device, tensors_from_buffer(buffer), metadata_of(buffer))
        timings["draw weights"] = time.perf_counter() - start
        return weights
    return draw


def _weights(buffer: memoryview, device: torch.device, check: Callable[[], None]) -> dict[str, torch.Tensor]:
    """The weights on the device, handed out only once `check` has passed: views of the mapped file on the
    CPU (checked first), one upload on a GPU (checked beside it)."""
    if device.type == "cpu":
        check()
        return tensors_from_buffer(buffer)

    def upload() -> dict[str, torch.Tensor]:
        weights = tensors_on_device(buffer, device)
        torch.cuda.synchronize(device)
        return weights
    return checked_beside(check, upload)


def checked_beside(check: Callable[[], None], work: Callable[[], T]) -> T:
    """work()'s result once check() (in a thread beside it) has passed. A failing check's error comes
    first, also when work failed too (a truncated member fails both: the check says why)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1, thread_name_prefix="atom-check") as pool:
        checked = pool.submit(check)
        try:
            result = work()
        except BaseException:
            checked.result()
            raise
        checked.result()
    return result


def _load_compiled(artifact: Artifact, read_weights: Callable[[], dict[str, torch.Tensor]], device: torch.device,
                   timings: dict) -> tuple[dict[str, torch.Tensor], dict[Phase, Callable]]:
    """Weights and compiled packages, loaded side by side: the weight upload (or draw) runs in a thread (the
    copy releases the GIL; a draw's kernels run while Python is elsewhere) while this one opens the
    packages; the weights are bound to them after."""
    from concurrent.futures import ThreadPoolExecutor

    from atom_aot.runtime.loading.compiled import package_class

    def upload():
        start = time.perf_counter()
        weights = read_weights()
        return weights, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="atom-weights") as pool:
        pending = pool.submit(upload)
        opened = time.perf_counter()
        forwards = {phase: package_class(phase)(artifact.member_path(member), device)
                    for phase, member in artifact.manifest.compiled.packages.items()}
        timings["compiled load"] = time.perf_counter() - opened
        weights, timings["weights (overlapped)"] = pending.result()
    bind_start = time.perf_counter()
    for forward in forwards.values():
        forward.bind(weights)
    timings["bind weights"] = time.perf_counter() - bind_start
    timings["weights + compiled load (wall)"] = time.perf_counter() - start
    return weights, forwards


def _load_eager(manifest: Manifest, model_config: ModelConfig, tuning: Tuning,
                read_weights: Callable[[], dict[str, torch.Tensor]],
                timings: dict) -> tuple[dict[str, torch.Tensor], dict[Phase, Callable]]:
    """The model module itself, built on meta and given the mapped (or drawn) weights, with the arch's
    kernels (the `mixed` row serves every batch)."""
    start = time.perf_counter()
    weights = read_weights()
    timings["weights"] = time.perf_counter() - start
    start = time.perf_counter()
    numerics = manifest.numerics
    with torch.device("meta"):
        model = model_class(model_config.architecture)(model_config, torch_dtype(numerics.dtype),
                                                       manifest.quantization.weights, numerics.max_model_len,
                                                       Split.of(manifest.layout))
    model.load_state_dict(weights, assign=True)
    model.use_kernels(tuning.for_phase(Phase.MIXED))
    timings["eager model"] = time.perf_counter() - start
    mtp_step = model.mtp_step()       # the MTP proposer step (DeepSeek), beside the model's own forward
    return weights, {Phase.MIXED: model.eval(), **({Phase.MTP: mtp_step.eval()} if mtp_step is not None else {})}
