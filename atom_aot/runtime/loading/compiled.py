"""Calls an AOTInductor package from the artifact, with the artifact's weights as its constants.

Uses the package loader directly (not `torch._inductor.aoti_load_package`), so serving never
imports Inductor: nothing at run time can compile. The loader unpacks each package into this
process's folder in the atom-aot cache (extraction.py), not the system's temporary folder.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

import atom_aot.ops  # noqa: F401  (the package calls atom:: custom ops by name)
from atom_aot.distributed.collectives import peer_table  # (a tensor-parallel package calls atom::all_reduce*)
from atom_aot.distributed.peer_table import BUFFER_NAME as PEER_TABLE_BUFFER
from atom_aot.errors import ArtifactError
from atom_aot.models.step_inputs import SERIALIZED_NAME, StepInputs
from atom_aot.runtime.loading.extraction import extracting_into, process_folder


class CompiledModel:
    """Opened first (library load, kernels), bound to the weights after: the two can overlap."""

    INPUT_TYPES: tuple[str, ...] = (SERIALIZED_NAME,)     # the exported forward's arguments, by pytree type

    def __init__(self, package: Path, device: torch.device):
        device_index = -1 if device.type == "cpu" else (device.index or 0)
        # run_single_threaded: the thread-safe entry point queries a CUDA event left by the previous
        # run before each call, which is illegal while a CUDA graph is being captured (it fails
        # with cudaErrorStreamCaptureInvalidated). One engine thread drives each model, so the
        # locking it buys is not needed.
        with extracting_into(process_folder()):
            self._loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", True, 1, device_index)
        self.device = device
        self._constants: dict[str, torch.Tensor] | None = None
        found = input_type_names(self._loader.get_call_spec()[0])
        if found != self.INPUT_TYPES:
            raise ArtifactError(f"{package} was exported for another forward signature ({found or 'positional'}) "
                                f"than this runtime's ({self.INPUT_TYPES}). Rebuild the artifact with this "
                                f"atom-aot's atom-build.")

    def bind(self, constants: dict[str, torch.Tensor]) -> "CompiledModel":
        """Hands the package the artifact's weights (borrowed, not copied), and the process's peer table where a
        tensor-parallel GPU package reads one (distributed/peer_table.py: the runtime's, never stored)."""
        needed = set(self._loader.get_constant_fqns())
        tables = {name for name in needed if name.rsplit(".", 1)[-1] == PEER_TABLE_BUFFER}
        constants = {**constants, **{name: peer_table(self.device) for name in tables}}
        missing = needed - set(constants)
        if missing:
            raise ValueError(f"the compiled model needs weights the artifact lacks: {sorted(missing)[:5]}")
        self._constants = {name: constants[name] for name in needed}   # kept alive: the loader borrows them
        # (constants, use_inactive, check_full_update, user_managed): the four arguments every torch
        # from 2.11 takes. Never call it with a signature it may refuse: pybind's TypeError message
        # prints every tensor passed, which took 2.6 s for Qwen3-0.6B's 454 weights.
        if self._constants:          # a package without weights (`sample`) has nothing to load
            self._loader.load_constants(self._constants, False, True, True)
        return self

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        return self._loader.run(list(inputs))[0]    # flattened in field order, as exported

    @property
    def returns_hidden(self) -> bool:
        """Whether the package also returns the hidden states (a model with MTP layers: deepseek_mtp.LogitsAndHidden)."""
        return output_count(self._loader.get_call_spec()[1]) == 2

    def logits_and_hidden(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 logits [N, vocab], hidden [T, hidden]), from a package that `returns_hidden`."""
        logits, hidden = self._loader.run(list(inputs))
        return logits, hidden


class CompiledMTP(CompiledModel):
    """The `mtp` package (atom_aot/models/deepseek_mtp.py `MTPStep`): (step inputs, previous hidden [T, hidden])
    -> (float32 logits [N, vocab], hidden [T, hidden])."""

    INPUT_TYPES = (SERIALIZED_NAME, None)      # a StepInputs, then a plain tensor

    def __call__(self, inputs: StepInputs, previous_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, hidden = self._loader.run([*inputs, previous_hidden])
        return logits, hidden


class CompiledSampler(CompiledModel):
    """The `sample` package (build/export_sampler.py): (logits [N, V] float32, top_k [N] int64, top_p [N] float32,
    min_p [N] float32) -> each row's mask threshold [N] float32 (ops/sampling.py), by the Triton kernel, no sort."""

    INPUT_TYPES = (None, None, None, None)

    def __call__(self, logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor) -> torch.Tensor:
        return self._loader.run([logits.contiguous(), top_k, top_p, min_p])[0]


def package_class(phase) -> type[CompiledModel]:
    """What calls a phase's package: the model forward's, the MTP step's or the sampler's signature."""
    from atom_aot.artifact.phase import Phase
    return {Phase.MTP: CompiledMTP, Phase.SAMPLE: CompiledSampler}.get(phase, CompiledModel)


def input_type_names(in_spec: str) -> tuple[str | None, ...] | None:
    """The serialized type name (None: a tensor) of each argument of the exported forward: in_spec is the
    JSON pytree spec [version, ((args...), {})]."""
    try:
        args = json.loads(in_spec)[1]["children_spec"][0]["children_spec"]
        return tuple(arg["context"] if arg.get("type") else None for arg in args)
    except (ValueError, LookupError, TypeError, AttributeError):
        return None


def output_count(out_spec: str) -> int | None:
    """How many outputs the exported forward returns (out_spec: its JSON pytree spec; None: unreadable)."""
    try:
        spec = json.loads(out_spec)[1]
        return len(spec["children_spec"]) if spec.get("type") else 1
    except (ValueError, LookupError, TypeError, AttributeError):
        return None
