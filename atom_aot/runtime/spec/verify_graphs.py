"""Verify steps of speculative decoding replayed as CUDA graphs of the mixed package.

A verify batch holds n sequences with 1 .. K+1 query tokens each (the newest token and its drafts;
fewer where a proposer found nothing or max_tokens caps the run). It runs as the graph of the
smallest capture size s >= n, whose static inputs give every sequence exactly K+1 rows:

    row i*(K+1) + j   = sequence i's token j, for j < count_i (copied from the batch's inputs)
    the rest of i's   = padding: slot -1 (nothing written), the position and token id of i's last
                        real row (valid rope and embedding indices)
    seq_lens[i]       = context_i + K+1: attention places a sequence's queries at its last seq_len
                        positions, so real row j still sees keys 0 .. context_i + j; padding rows see
                        further keys (stale, within the table) and their outputs are dropped
    sequences n .. s  = padding: slot -1, seq_len K+1 over an earlier batch's block-table row

The block tables get spare columns for the K positions a padding row may reach past the max model
len. The outputs (float32 logits [s*(K+1), V], and hidden states [s*(K+1), hidden] where the forward
returns them) are gathered back at the real rows, in the batch's order. Staging is device copies and
gathers from small host-made index arrays: no host sync. The recording is apart from the staging, so
the CPU tests run the real mixed forward through the same buffers (`record` = a plain call).
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
import torch

from atom_aot.models.step_inputs import StepInputs, input_dtype
from atom_aot.runtime.execution.cuda_graphs import Outputs, Replay, graph_view, record_sizes, smallest_size, static_buffer
from atom_aot.runtime.transfer import to_device

MixedForward = Callable[[StepInputs], Outputs]
# The widest verify graph: sizes whose s * (K+1) rows pass this are not captured (their logits alone are
# s * (K+1) x vocab float32: 0.6 GiB at 1024 rows of a 150k vocabulary); such batches run uncaptured.
MAX_GRAPH_TOKENS = 1024


def verify_capture_sizes(decode_sizes: Sequence[int], num_speculative_tokens: int,
                         max_tokens: int = MAX_GRAPH_TOKENS) -> tuple[int, ...]:
    """The decode capture sizes whose verify batches (K+1 rows per sequence) stay within max_tokens."""
    return tuple(s for s in sorted(decode_sizes) if s * (num_speculative_tokens + 1) <= max_tokens)


class VerifyGraphs:
    def __init__(self, forward: MixedForward, kv_cache: torch.Tensor, capture_sizes: Sequence[int],
                 num_speculative_tokens: int, max_blocks_per_seq: int, block_size: int):
        if not capture_sizes:
            raise ValueError("verify graphs need at least one capture size")
        self.forward = forward
        self.sizes = sorted(capture_sizes)
        self.rows = num_speculative_tokens + 1              # rows per sequence
        self.device = kv_cache.device
        biggest, width = self.sizes[-1], max_blocks_per_seq + -(-num_speculative_tokens // block_size) + 1
        tokens = biggest * self.rows
        buffer = functools.partial(static_buffer, kv_cache=kv_cache)
        self.static = StepInputs(
            input_ids=buffer("input_ids", tokens), positions=buffer("positions", tokens), kv_cache=kv_cache,
            slot_mapping=buffer("slot_mapping", tokens, fill=-1), block_tables=buffer("block_tables", biggest, width),
            seq_lens=buffer("seq_lens", biggest, fill=self.rows),
            query_start_loc=torch.arange(0, (biggest + 1) * self.rows, self.rows,
                                         dtype=input_dtype("query_start_loc", kv_cache.dtype), device=self.device),
            logits_indices=torch.arange(tokens, dtype=input_dtype("logits_indices", kv_cache.dtype), device=self.device))
        self.replays: dict[int, Replay] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def size_for(self, num_seqs: int) -> int:
        return smallest_size(self.sizes, num_seqs)

    def view(self, size: int) -> StepInputs:
        """The static inputs of the graph of `size` sequences (size * (K+1) token rows)."""
        return graph_view(self.static, size, self.rows)

    def forward_at(self, size: int) -> Outputs:
        return self.forward(self.view(size))

    @torch.inference_mode()
    def capture(self, record: Callable[[Replay], Replay] | None = None) -> None:
        """Records every size, largest first; `record` turns a call into its replay (default: a CUDA graph)."""
        self.replays = record_sizes(self.sizes, self.forward_at, record)

    def __call__(self, inputs: StepInputs, counts: Sequence[int]) -> Outputs:
        """The forward's outputs at the batch's real rows: inputs as the model runner built them for
        len(counts) sequences of counts[i] query tokens each (1 <= counts[i] <= K+1)."""
        size = self.size_for(len(counts))
        real_rows = self.load(inputs, counts, size)
        out = self.replays[size]()
        return tuple(t[real_rows] for t in out) if isinstance(out, tuple) else out[real_rows]

    def load(self, inputs: StepInputs, counts: Sequence[int], size: int) -> torch.Tensor:
        """Stages the batch into the buffers of `size`; returns the padded rows of its real rows [T] (device)."""
        if inputs.kv_cache is not self.static.kv_cache:
            raise ValueError("the verify graphs were captured on another KV cache than this batch's")
        source, is_real, real_rows = self._layout(counts, size)
        view, n = self.view(size), len(counts)
        view.input_ids.copy_(inputs.input_ids[source])
        view.positions.copy_(inputs.positions[source])
        view.slot_mapping.copy_(torch.where(is_real, inputs.slot_mapping[source], -1))
        view.block_tables[:n, :inputs.block_tables.shape[1]].copy_(inputs.block_tables)
        padding = to_device(self.rows - np.asarray(counts), inputs.seq_lens.dtype, self.device)
        view.seq_lens[:n].copy_(inputs.seq_lens + padding)
        view.seq_lens[n:].fill_(self.rows)
        return real_rows

    def _layout(self, counts: Sequence[int], size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(source [size*(K+1)]: the batch row each static row copies, is_real [size*(K+1)], real_rows [T])."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.min() < 1 or counts.max() > self.rows:
            raise ValueError(f"verify rows per sequence must be 1..{self.rows}, got {counts.tolist()}")
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        j = np.arange(self.rows)
        source = np.zeros((size, self.rows), dtype=np.int64)
        source[:len(counts)] = starts[:, None] + np.minimum(j[None, :], counts[:, None] - 1)
        is_real = np.zeros((size, self.rows), dtype=bool)
        is_real[:len(counts)] = j[None, :] < counts[:, None]
        real_rows = np.flatnonzero(is_real)
        return (to_device(source.ravel(), torch.int64, self.device), to_device(is_real.ravel(), torch.bool, self.device),
                to_device(real_rows, torch.int64, self.device))
