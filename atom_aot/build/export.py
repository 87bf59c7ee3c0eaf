"""Export the model once with torch.export and compile it with AOTInductor.

The package holds code only (`package_constants_in_so=False`): weights live in
`weights/rank{r}.safetensors` and are handed to the compiled model at load, so they are stored
once and memory-mapped. The model takes one `StepInputs`; its dynamic dimensions are the named
ones of atom_aot/artifact/signature.py. One package per phase: `mixed` serves any batch; on GPUs a
`decode` package (one new token per sequence) carries the decode kernel configs and is what the
runtime replays in CUDA graphs. Attention stays calls to registered custom ops, which the runtime
registers before loading.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch.export import Dim

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.signature import DYNAMIC_DIMS, STEP_INPUTS
from atom_aot.models.decoder import DecoderForCausalLM
from atom_aot.models.parallel import rank_shapes
from atom_aot.models.step_inputs import StepInputs, input_dtype

MAX_TOKENS_PER_STEP = 1 << 16
MAX_SEQS = 1 << 12
MAX_KV_BLOCKS = 1 << 24


def example_inputs(model: DecoderForCausalLM, kv_dtype: torch.dtype, block_size: int, device: torch.device,
                   phase: Phase) -> StepInputs:
    """Small inputs whose dynamic sizes are pairwise distinct and >= 2, so none gets specialized.

    `mixed`: 3 sequences computing 5, 4 and 2 tokens (11 in all), 2 of them sampling.
    `decode`: 3 sequences computing one token each, all sampling (tokens = sequences = logits rows).
    """
    cfg = model.config
    num_blocks, max_blocks = 37, 5
    counts, context = ([5, 4, 2], [5, 4, 2]) if phase == Phase.MIXED else ([1, 1, 1], [6, 19, 2])
    block_tables = torch.arange(len(counts) * max_blocks).view(len(counts), -1)
    positions = torch.cat([torch.arange(c - n, c) for n, c in zip(counts, context)])
    rows = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    ends = torch.tensor(list(itertools.accumulate(counts))) - 1
    values = dict(
        input_ids=torch.randint(0, cfg.vocab_size, (sum(counts),)),
        positions=positions,
        kv_cache=torch.zeros(model.kv_cache_layout(rank_shapes(cfg, model.split)).shape(num_blocks, block_size)),
        slot_mapping=block_tables[rows, positions // block_size] * block_size + positions % block_size,
        block_tables=block_tables,
        seq_lens=torch.tensor(context),
        query_start_loc=torch.tensor([0] + list(itertools.accumulate(counts))),
        logits_indices=ends[:2] if phase == Phase.MIXED else ends)
    return StepInputs(**{name: t.to(device, input_dtype(name, kv_dtype)) for name, t in values.items()})


def dynamic_shapes(max_model_len: int, block_size: int, phase: Phase) -> dict:
    """`dynamic_shapes` for export, by input name from the signature's named dimensions."""
    seqs = Dim("num_seqs", min=1, max=MAX_SEQS)
    dims = {"num_seqs": seqs, "num_seqs_plus_1": seqs + 1,
            "num_tokens": Dim("num_tokens", min=1, max=MAX_TOKENS_PER_STEP),
            "num_logits": Dim("num_logits", min=1, max=MAX_TOKENS_PER_STEP),
            "max_blocks_per_seq": Dim("max_blocks_per_seq", min=1, max=max_model_len // block_size + 1),
            "num_kv_blocks": Dim("num_kv_blocks", min=2, max=MAX_KV_BLOCKS)}
    if phase == Phase.DECODE:       # one token per sequence, each sampled
        dims["num_tokens"] = dims["num_logits"] = seqs
    if set(dims) != set(DYNAMIC_DIMS):
        raise ValueError(f"export sizes dims {sorted(dims)}, the signature names {sorted(DYNAMIC_DIMS)}")
    per_input = {spec.name: {axis: dims[name] for axis, name in enumerate(spec.dims) if name in dims}
                 for spec in STEP_INPUTS}
    return {"inputs": StepInputs(**per_input)}


def export_model(model: DecoderForCausalLM, kv_dtype: torch.dtype, block_size: int, max_model_len: int,
                 device: torch.device, phase: Phase) -> torch.export.ExportedProgram:
    """Trace `model` (real weights, on `device`) with the dynamic dimensions of `phase`: its `target_step`
    (the model, or a module that also returns the hidden states for its MTP layers)."""
    inputs = example_inputs(model, kv_dtype, block_size, device, phase)
    with torch.no_grad():
        return torch.export.export(model.target_step(), (inputs,),
                                   dynamic_shapes=dynamic_shapes(max_model_len, block_size, phase))


def compile_package(exported: torch.export.ExportedProgram, out_path: Path) -> Path:
    """AOTInductor-compile the exported program into a code-only package at `out_path`."""
    import torch._inductor
    from atom_aot.build.cxx import wrapper_compiler
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with torch._inductor.config.patch({"cpp.cxx": (wrapper_compiler()["cxx"],)}):
        torch._inductor.aoti_compile_and_package(
            exported, package_path=str(out_path),
            # every weight stays a constant bound at load, none folded into the code: a scalar weight (the
            # vocab-parallel embedding's first row) differs between the ranks that share this package
            inductor_configs={"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True})
    return out_path
