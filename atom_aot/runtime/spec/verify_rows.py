"""Verify steps of speculative decoding run as decode steps: each query row of a verify batch (a
sequence's newest token or one of its drafts) is a one-token sequence of its own.

A sequence whose step computes positions p .. p + n - 1 has row j at position p + j, which must see
keys 0 .. p + j; every layer writes the whole step's KV before it attends, so those keys are in the
cache by then. As a decode row it carries its sequence's block table and seq_len p + j + 1, and the
decode package (its kernels, its CUDA graphs) computes it as it computes a row of a plain decode step:
verified tokens come from the same kernels as decoding without speculation. The price is that a
sequence's cache is read once per row (n times) where a multi-query kernel reads it once.

runtime/spec/setup.py takes this route where the mixed package cannot be captured (an MLA model whose mixed row is the
reference op, which reads the batch layout on the host), for MLA models whatever their mixed row, or where
ATOM_VERIFY_ROUTE says so.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.execution.cuda_graphs import Outputs
from atom_aot.runtime.transfer import to_device


def as_decode_rows(inputs: StepInputs, counts: Sequence[int]) -> StepInputs:
    """The verify batch `inputs` (len(counts) sequences of counts[i] query rows, every row's logits) as a
    decode batch of sum(counts) one-row sequences, in the same row order."""
    rows = inputs.input_ids.shape[0]
    if sum(counts) != rows or len(counts) != inputs.block_tables.shape[0]:
        raise ValueError(f"a verify batch of {inputs.block_tables.shape[0]} sequences and {rows} rows cannot have "
                         f"{list(counts)} rows per sequence")
    device = inputs.input_ids.device
    owner = to_device(np.repeat(np.arange(len(counts)), counts), torch.int64, device)     # [T] its sequence
    return inputs._replace(
        block_tables=inputs.block_tables[owner],
        seq_lens=(inputs.positions + 1).to(inputs.seq_lens.dtype),
        query_start_loc=torch.arange(rows + 1, dtype=inputs.query_start_loc.dtype, device=device),
        logits_indices=torch.arange(rows, dtype=inputs.logits_indices.dtype, device=device))


class DecodeRowsVerify:
    """A verify forward (inputs, rows per sequence) -> the outputs at every row, through `decode` one row per
    sequence. Batches of more rows than `max_rows` (the decode graphs' largest size; None: no bound) run
    `mixed` on the batch as it is."""

    def __init__(self, decode: Callable[[StepInputs], Outputs], max_rows: int | None,
                 mixed: Callable[[StepInputs], Outputs]):
        self.decode, self.max_rows, self.mixed = decode, max_rows, mixed

    def __call__(self, inputs: StepInputs, counts: Sequence[int]) -> Outputs:
        if self.max_rows is not None and inputs.input_ids.shape[0] > self.max_rows:
            return self.mixed(inputs)
        return self.decode(as_decode_rows(inputs, counts))
