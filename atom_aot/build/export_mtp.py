"""Export the MTP proposer step (atom_aot/models/deepseek_mtp.py `MTPStep`) as its own package.

Its inputs are the step's `StepInputs` with the decode phase's dynamic dimensions (one query row per
sequence: the proposer runs a position that follows another of the same sequence as a row of its own,
runtime/spec/mtp.py) plus the previous positions' hidden states [num_tokens, hidden], whose first dimension is the
same `num_tokens`. So the step runs the decode row's kernels (on a GPU the MLA decode kernel, which keeps
no host work and can be captured) instead of the mixed row's. Compiled like the phases (build/export.py
`compile_package`), code only; its weights are the artifact's, by the same names.
"""
from __future__ import annotations

import torch

from atom_aot.artifact.phase import Phase
from atom_aot.build.export import dynamic_shapes, example_inputs
from atom_aot.models.decoder import DecoderForCausalLM


def export_mtp(model: DecoderForCausalLM, mtp_step: torch.nn.Module, kv_dtype: torch.dtype, block_size: int,
               max_model_len: int, device: torch.device) -> torch.export.ExportedProgram:
    inputs = example_inputs(model, kv_dtype, block_size, device, Phase.DECODE)
    previous_hidden = torch.randn(inputs.input_ids.shape[0], model.config.hidden_size, device=device,
                                  dtype=model.model.embed_tokens.weight.dtype)
    shapes = dynamic_shapes(max_model_len, block_size, Phase.DECODE)
    shapes["previous_hidden"] = {0: shapes["inputs"].input_ids[0]}
    with torch.no_grad():
        return torch.export.export(mtp_step, (inputs, previous_hidden), dynamic_shapes=shapes)
