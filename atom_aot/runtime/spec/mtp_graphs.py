"""The MTP proposer's step replayed as CUDA graphs, at the decode steps' capture sizes.

The `mtp` package takes one query row per sequence (build/export_mtp.py), as the decode package does, so
its graphs are decode graphs (runtime/execution/cuda_graphs.py `DecodeGraphs`: the same staging, rows n .. size are
padding that writes nothing) over a forward that also reads a static buffer of the previous hidden
states, one per row. A step of more rows than the largest size runs the package as it is. On the CPU the
tests record plain calls.
"""
from __future__ import annotations

from typing import Callable

import torch

from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.execution.cuda_graphs import DecodeGraphs, Replay

MTPForward = Callable[[StepInputs, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class MTPGraphs:
    def __init__(self, mtp: MTPForward, kv_cache: torch.Tensor, capture_sizes: tuple[int, ...],
                 max_blocks_per_seq: int, hidden_size: int, hidden_dtype: torch.dtype):
        self.mtp = mtp
        self.previous = torch.zeros(max(capture_sizes), hidden_size, dtype=hidden_dtype, device=kv_cache.device)
        self.graphs = DecodeGraphs(lambda inputs: mtp(inputs, self.previous[:inputs.input_ids.shape[0]]), kv_cache,
                                   capture_sizes, max_blocks_per_seq)

    @property
    def max_batch_size(self) -> int:
        return self.graphs.max_batch_size

    def capture(self, record: Callable[[Replay], Replay] | None = None) -> None:
        """Records every size, largest first; `record` turns a call into its replay (default: a CUDA graph)."""
        self.graphs.capture(record)

    def __call__(self, inputs: StepInputs, previous_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [n, vocab], hidden [n, hidden]) of the n rows of `inputs`, as the package returns them."""
        n = inputs.input_ids.shape[0]
        if n > self.max_batch_size:
            return self.mtp(inputs, previous_hidden)
        self.previous[:n].copy_(previous_hidden)
        return self.graphs.outputs(inputs)
