"""Load an artifact for serving: check it, map its weights, and make the model callable.

Order matters: the manifest and every member hash are checked before anything is
deserialized, and the target (arch, toolchain, format) before any compiled code is touched.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from atom_aot.arch import detect_arch, device_for_arch, toolchain
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import Tuning
from atom_aot.models import ModelConfig, model_class
from atom_aot.errors import ArtifactError
from atom_aot.runtime.artifact import Artifact, rebuild_command
from atom_aot.runtime.safetensors_view import tensors_from_buffer, tensors_on_device

log = logging.getLogger("atom_aot")

WEIGHTS = "weights/rank0.safetensors"
CHECKED_TOOLCHAIN = ("torch", "triton", "cuda", "hip", "cpu_isa")


@dataclass
class LoadedArtifact:
    artifact: Artifact
    model_config: ModelConfig
    weights: dict[str, torch.Tensor]    # the runtime's parameters, on the device
    forwards: dict[Phase, object]       # phase -> callable taking StepInputs
    execution: str                      # which path runs: "aotinductor" or "eager"
    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype
    block_size: int
    max_model_len: int
    graphs: dict                        # graphs.json: capture sizes and pool bytes measured at build
    generation_config: dict
    tokenizer_dir: Path
    tuning: Tuning
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def manifest(self) -> dict:
        return self.artifact.manifest


def check_target(artifact: Artifact) -> None:
    """Refuse an artifact made for another arch or toolchain, saying how to make a matching one."""
    manifest = artifact.manifest
    target = manifest["target"]
    here = {"arch": detect_arch(), **toolchain()}
    for key in ("arch",) + CHECKED_TOOLCHAIN:
        if target.get(key) != here.get(key):
            raise ArtifactError(
                f"{artifact.path} was built for {key} {target.get(key)!r}, but this machine has "
                f"{here.get(key)!r}. Compiled code is tied to the arch and toolchain it was built with, so it "
                f"is not loaded. Make a matching artifact here with: {rebuild_command(manifest, here['arch'])}")


def load_artifact(path: str | Path, enforce_eager: bool = False) -> LoadedArtifact:
    timings = {}
    start = time.perf_counter()
    artifact = Artifact.open(path)
    check_target(artifact)
    artifact.verify()
    timings["verify"] = time.perf_counter() - start

    manifest = artifact.manifest
    build = manifest["build"]
    device = device_for_arch(manifest["target"]["arch"])
    model_config = ModelConfig.from_hf_dict(artifact.read_json("config/config.json"))
    tuning = Tuning.from_dict(artifact.read_json("tuning.json"))
    compiled = manifest["compiled"]["kind"] == "aotinductor" and not enforce_eager
    buffer = artifact.member_buffer(WEIGHTS)
    if compiled:
        weights, forwards = _load_compiled(artifact, buffer, device, timings)
    else:
        start = time.perf_counter()
        weights = _weights(buffer, device)
        timings["weights"] = time.perf_counter() - start
        start = time.perf_counter()
        forwards = {Phase.MIXED: _eager_model(model_config, build, weights, tuning)}
        timings["eager model"] = time.perf_counter() - start
    execution = "aotinductor" if compiled else "eager"
    log.info("model path: %s (%s)", execution,
             "compiled package from the artifact" if compiled else
             "--enforce-eager" if enforce_eager else "the artifact has no compiled code (built with --compile none)")
    return LoadedArtifact(
        artifact=artifact, model_config=model_config, weights=weights, forwards=forwards, execution=execution, device=device,
        dtype=getattr(torch, build["dtype"]), kv_dtype=getattr(torch, build["kv_cache_dtype"]),
        block_size=build["block_size"], max_model_len=build["max_model_len"],
        graphs=artifact.read_json("graphs.json"),
        generation_config=artifact.read_json("config/generation_config.json"),
        tokenizer_dir=artifact.member_dir("tokenizer"), tuning=tuning, timings=timings)


def _weights(buffer: memoryview, device: torch.device) -> dict[str, torch.Tensor]:
    """The weights on the device: views of the mapped file on the CPU, one upload on a GPU."""
    if device.type == "cpu":
        return tensors_from_buffer(buffer)
    weights = tensors_on_device(buffer, device)
    torch.cuda.synchronize(device)
    return weights


def _load_compiled(artifact: Artifact, buffer: memoryview, device: torch.device,
                   timings: dict) -> tuple[dict[str, torch.Tensor], dict[Phase, object]]:
    """Weights and compiled packages, loaded side by side: the weight upload runs in a thread (the
    copy releases the GIL) while this one opens the packages; the weights are bound to them after."""
    from concurrent.futures import ThreadPoolExecutor

    from atom_aot.runtime.compiled import CompiledModel

    def upload():
        start = time.perf_counter()
        weights = _weights(buffer, device)
        return weights, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="atom-weights") as pool:
        pending = pool.submit(upload)
        opened = time.perf_counter()
        forwards = {Phase(phase): CompiledModel(artifact.member_path(path), device)
                    for phase, path in artifact.manifest["compiled"]["packages"].items()}
        timings["compiled load"] = time.perf_counter() - opened
        weights, timings["weights (overlapped)"] = pending.result()
    bind_start = time.perf_counter()
    for forward in forwards.values():
        forward.bind(weights)
    timings["bind weights"] = time.perf_counter() - bind_start
    timings["weights + compiled load (wall)"] = time.perf_counter() - start
    return weights, forwards


def _eager_model(model_config: ModelConfig, build: dict, weights: dict[str, torch.Tensor],
                 tuning: Tuning) -> torch.nn.Module:
    """The model module itself, with the arch's kernels (the `mixed` row serves every batch)."""
    cls = model_class(model_config.architecture)
    with torch.device("meta"):
        model = cls(model_config, getattr(torch, build["dtype"]), build["quant"], build["max_model_len"])
    model.load_state_dict(weights, assign=True)
    return model.use_kernels(tuning.for_phase(Phase.MIXED)).eval()


