"""`StepInputs`: the flat tensors of one engine step, as the model's forward takes them.

The names, order, dtypes and dynamic dimensions are defined once, torch-free, in
atom_aot/artifact/signature.py; this is their torch form, used by the model, the export (example
inputs, dynamic shapes), the model runner, compiled packages and CUDA graphs alike.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.utils._pytree as pytree

from atom_aot.artifact.signature import INPUT_NAMES, SIGNATURE_VERSION, STEP_INPUTS, InputSpec
from atom_aot.ops.backends.base import AttentionInputs


class StepInputs(NamedTuple):
    input_ids: torch.Tensor        # [T] int64
    positions: torch.Tensor        # [T] int64
    kv_cache: torch.Tensor         # [L, 2, num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor     # [T] int64, -1: padding (not written)
    block_tables: torch.Tensor     # [B, max_blocks] int32
    seq_lens: torch.Tensor         # [B] int32: tokens in context once this step's are written
    query_start_loc: torch.Tensor  # [B + 1] int32
    logits_indices: torch.Tensor   # [N] int64: rows of T whose logits are returned

    def attention_inputs(self) -> AttentionInputs:
        return AttentionInputs(self.kv_cache, self.slot_mapping, self.block_tables, self.seq_lens,
                               self.query_start_loc)


if StepInputs._fields != INPUT_NAMES:
    raise ImportError(f"StepInputs fields {StepInputs._fields} differ from the signature {INPUT_NAMES} "
                      f"(atom_aot/artifact/signature.py): make them the same")

# torch.export stores the input's pytree spec in the package under this name: a package exported
# against another signature version names another type. AOTInductor packages take the inputs
# flattened in field order (`list(inputs)`).
SERIALIZED_NAME = f"atom_aot.StepInputs.v{SIGNATURE_VERSION}"
pytree._register_namedtuple(StepInputs, serialized_type_name=SERIALIZED_NAME)

SPECS: dict[str, InputSpec] = {spec.name: spec for spec in STEP_INPUTS}
INDEX_DTYPES = {"int64": torch.int64, "int32": torch.int32}


def input_dtype(name: str, kv_dtype: torch.dtype) -> torch.dtype:
    dtype = SPECS[name].dtype
    return kv_dtype if dtype == "kv" else INDEX_DTYPES[dtype]
