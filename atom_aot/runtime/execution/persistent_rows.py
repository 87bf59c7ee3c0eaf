"""The model runner's host state kept between steps: one row per sequence that holds KV blocks, with its
block table and its sampling parameters (runtime/sampling/sampling_rows.py, written when it gets the row).

Building every block table from scratch took O(batch x blocks) Python work each step (most of the
5.4 ms `prepare_inputs` of a batch-256 decode step on an H100 host). While a sequence runs its
table only grows, by appended block ids, so a step copies just those into the sequence's row. The
scheduler says when a sequence's blocks are freed (`ScheduledBatch.freed`: it finished or was
preempted); its row is then cleared and reused, and a preempted sequence gets a new row when it
runs again.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from atom_aot.runtime.sampling.sampling_rows import SamplingBatch, SamplingColumns
from atom_aot.runtime.scheduling.sequence import Sequence


class PersistentRows:
    def __init__(self, num_rows: int = 64, width: int = 16):
        self.block_tables = np.zeros((num_rows, width), dtype=np.int32)   # [rows, width], 0 past a table's end
        self.last_sample = np.full(num_rows, -1, dtype=np.int64)         # [rows] row in the last step's samples
        self.sampling = SamplingColumns(num_rows)                          # each row's sampling parameters
        self._num_blocks = [0] * num_rows                                  # block ids copied into each row
        self._row_of: dict[Sequence, int] = {}
        self._free_rows = list(range(num_rows - 1, -1, -1))

    def release(self, seqs: Iterable[Sequence]) -> None:
        """Clear the rows of sequences whose blocks were freed (those without a row are ignored)."""
        for seq in seqs:
            row = self._row_of.pop(seq, None)
            if row is None:
                continue
            self.block_tables[row, :self._num_blocks[row]] = 0
            self._num_blocks[row] = 0
            self.last_sample[row] = -1
            self.sampling.clear(row)
            self._free_rows.append(row)

    def sampling_batch(self, rows: np.ndarray) -> SamplingBatch:
        """The sampling parameters of these rows (a step's sampling sequences), in their order."""
        return self.sampling.gather(rows)

    def rows_for(self, seqs: Iterable[Sequence]) -> tuple[np.ndarray, int]:
        """Each sequence's row [B] (a new one on first sight), with its block table brought up to
        date; and the most blocks any of them holds."""
        rows, widest = [], 0
        for seq in seqs:
            row = self._row_of.get(seq)
            if row is None:
                row = self._assign(seq)
            num_blocks = len(seq.block_table)
            if num_blocks != self._num_blocks[row]:
                self._copy_new_blocks(seq, row)
            rows.append(row)
            if num_blocks > widest:
                widest = num_blocks
        return np.asarray(rows, dtype=np.int64), widest

    def _copy_new_blocks(self, seq: Sequence, row: int) -> None:
        copied, num_blocks = self._num_blocks[row], len(seq.block_table)
        if num_blocks < copied:
            raise RuntimeError(f"the block table of request {seq.request_id!r} shrank from {copied} to {num_blocks} "
                               f"blocks, but the scheduler did not report its blocks freed")
        if num_blocks > self.block_tables.shape[1]:
            self._widen(num_blocks)
        self.block_tables[row, copied:num_blocks] = seq.block_table[copied:]
        self._num_blocks[row] = num_blocks

    def _assign(self, seq: Sequence) -> int:
        if not self._free_rows:
            self._add_rows()
        row = self._row_of[seq] = self._free_rows.pop()
        self.sampling.write(row, seq.params)
        return row

    def _add_rows(self) -> None:
        """Double the rows (a batch larger than any before)."""
        num_rows = len(self._num_blocks)
        self.block_tables = np.concatenate([self.block_tables, np.zeros_like(self.block_tables)])
        self.last_sample = np.concatenate([self.last_sample, np.full(num_rows, -1, dtype=np.int64)])
        self.sampling.grow(2 * num_rows)
        self._num_blocks += [0] * num_rows
        self._free_rows += range(2 * num_rows - 1, num_rows - 1, -1)

    def _widen(self, num_blocks: int) -> None:
        """At least double the width (a sequence longer than any before)."""
        width = max(num_blocks, 2 * self.block_tables.shape[1])
        wider = np.zeros((self.block_tables.shape[0], width), dtype=np.int32)
        wider[:, :self.block_tables.shape[1]] = self.block_tables
        self.block_tables = wider
