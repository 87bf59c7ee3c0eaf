"""A scheduled batch as the model's flat input tensors, on the device.

The work is O(batch) numpy with one host->device copy per tensor: positions and KV slots come
from per-sequence starts and counts, block tables from rows kept between steps
(persistent_rows.py). A decode input whose token the host has not read yet (async scheduling) is
gathered on the device from the previous step's sampled tokens: at most one step is in flight, so
a pending input token was always sampled by the step launched just before. A verify step
(speculative decoding) feeds each sequence's newest token then its draft tokens, and returns the
logits of every one of them.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from atom_aot.models.step_inputs import StepInputs, input_dtype
from atom_aot.runtime.execution.persistent_rows import PersistentRows
from atom_aot.runtime.sampling.sampling_rows import SamplingBatch
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.transfer import to_device

PENDING = (-1,)   # the host's stand-in for a token sampled on the device and not read yet


@dataclass(frozen=True)
class LogitsRows:
    """Host-side bookkeeping of one step: what each row of the returned logits is for."""
    sample_rows: list[int]          # for each sampling sequence (batch order), its row in the logits
    prompt_rows: dict[int, range]   # batch index -> logits rows scoring its next prompt tokens (prompt logprobs)


class StepInputsBuilder:
    def __init__(self, kv_cache: torch.Tensor, block_size: int, device: torch.device):
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device
        self.rows = PersistentRows()
        self._last_sampled: torch.Tensor | None = None         # [n] the previous step's sampled tokens (device)
        self._last_sample_rows = np.zeros(0, dtype=np.int64)    # [n] their sequences' rows
        self._sample_rows = np.zeros(0, dtype=np.int64)         # rows of this batch's sampling sequences

    def build(self, batch: ScheduledBatch) -> tuple[StepInputs, LogitsRows]:
        self.rows.release(batch.freed)
        rows, widest = self.rows.rows_for(batch.seqs)
        starts = np.asarray(batch.num_computed_tokens, dtype=np.int64)      # [B]
        tables = self.rows.block_tables[rows, :widest]                      # [B, widest]
        query_start, seq_of_token, positions, slots = token_layout(starts, batch.num_new_tokens, tables,
                                                                   self.block_size)
        input_ids = _token_ids(batch, int(query_start[-1]))
        logits_indices, logits_rows = _logits_rows(batch, query_start)
        self._sample_rows = rows[np.asarray(batch.sampling, dtype=bool)]
        host = dict(input_ids=input_ids, positions=positions, slot_mapping=slots, block_tables=tables,
                    seq_lens=starts + np.diff(query_start), query_start_loc=query_start,
                    logits_indices=logits_indices)
        kv_dtype = self.kv_cache.dtype
        inputs = StepInputs(kv_cache=self.kv_cache, **{
            name: to_device(array, input_dtype(name, kv_dtype), self.device) for name, array in host.items()})
        pending = np.flatnonzero(input_ids < 0)                             # token rows
        if pending.size:
            self._gather_pending(inputs.input_ids, pending, seq_of_token[pending], rows, batch)
        return inputs, logits_rows

    def sampling_batch(self) -> SamplingBatch:
        """The sampling parameters of the last built batch's sampling sequences, from their persistent rows."""
        return self.rows.sampling_batch(self._sample_rows)

    def remember_sampled(self, sampled: torch.Tensor) -> None:
        """The tokens the last built batch samples ([n], on the device): the next batch's pending inputs."""
        self.rows.last_sample[self._last_sample_rows] = -1
        self.rows.last_sample[self._sample_rows] = np.arange(len(self._sample_rows))
        self._last_sample_rows, self._last_sampled = self._sample_rows, sampled

    def _gather_pending(self, input_ids: torch.Tensor, token_rows: np.ndarray, seq_index: np.ndarray,
                        rows: np.ndarray, batch: ScheduledBatch) -> None:
        """input_ids[token_rows] = the previous step's sampled tokens of those sequences (on the device)."""
        sources = self.rows.last_sample[rows[seq_index]]
        missing = np.flatnonzero(sources < 0)
        if missing.size:
            seq = batch.seqs[seq_index[missing[0]]]
            raise RuntimeError(f"request {seq.request_id!r} is decoded from a token that is neither known nor "
                               f"sampled by the previous step")
        index = to_device(token_rows, torch.int64, self.device)
        input_ids.index_copy_(0, index, self._last_sampled[to_device(sources, torch.int64, self.device)])


def token_layout(starts: np.ndarray, counts, tables: np.ndarray, block_size: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where a step's T tokens go: sequence b computes counts[b] positions from starts[b] [B], its
    blocks the row tables[b]. Returns query_start [B + 1], the sequence of each token [T], positions [T]
    and KV slots [T] (int64)."""
    counts = np.asarray(counts, dtype=np.int64)                             # [B]
    query_start = np.zeros(len(counts) + 1, dtype=np.int64)                 # [B + 1]
    np.cumsum(counts, out=query_start[1:])
    seq_of_token = np.repeat(np.arange(len(counts)), counts)                # [T]
    positions = np.arange(query_start[-1]) + (starts - query_start[:-1])[seq_of_token]
    slots = tables[seq_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return query_start, seq_of_token, positions, slots


def _token_ids(batch: ScheduledBatch, num_tokens: int) -> np.ndarray:
    """[T] the ids of the batch's new tokens; -1 for a token sampled on the device, not read yet."""
    pieces = []
    drafts = batch.draft_token_ids or itertools.repeat(())
    for seq, start, count, draft in zip(batch.seqs, batch.num_computed_tokens, batch.num_new_tokens, drafts):
        known, count = len(seq.token_ids), count - len(draft)
        if start + count <= known:
            pieces.append(seq.token_ids[start:start + count])
        elif count == 1 and start == known and not draft:
            pieces.append(PENDING)
        else:
            raise RuntimeError(f"request {seq.request_id!r}: positions {start}..{start + count - 1} are scheduled "
                               f"but only {known} tokens are known; only a decode may take a pending token")
        pieces.append(draft)
    return np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=num_tokens)


def _logits_rows(batch: ScheduledBatch, query_start: np.ndarray) -> tuple[np.ndarray, LogitsRows]:
    """[N] the token rows whose logits the forward returns, and what each is for."""
    if batch.is_verify:                 # every row: the newest token's and each draft's
        indices = np.arange(query_start[-1])
        return indices, LogitsRows(list(range(len(indices))), {})
    if not (batch.is_prefill and any(seq.params.prompt_logprobs is not None for seq in batch.seqs)):
        indices = query_start[1:][np.asarray(batch.sampling, dtype=bool)] - 1    # each sampling sequence's last
        return indices, LogitsRows(list(range(len(indices))), {})
    logits_rows, sample_rows, prompt_rows = [], [], {}
    for i, (seq, start, count) in enumerate(zip(batch.seqs, batch.num_computed_tokens, batch.num_new_tokens)):
        first_row = int(query_start[i])
        scoring = seq.scored_prompt_positions(start, count)
        if scoring:
            prompt_rows[i] = range(len(logits_rows), len(logits_rows) + len(scoring))
            logits_rows.extend(first_row + p - start for p in scoring)
        if batch.sampling[i]:
            sample_rows.append(len(logits_rows))
            logits_rows.append(first_row + count - 1)
    return np.asarray(logits_rows, dtype=np.int64), LogitsRows(sample_rows, prompt_rows)

