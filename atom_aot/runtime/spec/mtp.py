"""MTP proposer: the model's own multi-token-prediction layer (DeepSeek-V3) guesses the next K tokens.

The MTP step at position p reads the target's final-normed hidden state at p and the token at
p + 1, and predicts the token at p + 2 (atom_aot/models/deepseek_mtp.py). Its cache layer is the
last layer of the target's KV cache (the model's KV layout counts it), addressed through the
target's own block tables, as vLLM's drafter layers share the target's: position p's MTP KV sits
in position p's slot.

- After every target step (prefill chunk or verify) the runner hands over the tokens that follow
  the positions it computed (`observe`); the MTP layer runs over those positions with the target's
  hidden states (the tap on the target's forward keeps them), which writes its KV for them, and
  its prediction after the last one is the sequence's first draft. So its KV is exact for every
  computed position before the step's blocks enter the prefix cache.
- `propose` (after the step, once the scheduler has the step's tokens) returns that draft and, for K > 1,
  chains the same layer on its own output hidden state and draft (DeepSeek's reuse of its one MTP layer), one
  position further each time. Those chained positions are the ones the next verify step computes: the
  scheduler reserved their slots with the step just run (`lookahead_slots`), a chain stops where a sequence's
  slots end, and the next `observe` overwrites them with the target's hidden states.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from atom_aot.models.step_inputs import StepInputs, input_dtype
from atom_aot.runtime.execution.step_inputs_builder import token_layout
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.sequence import Sequence, SequenceStatus
from atom_aot.runtime.spec.verify_rows import as_decode_rows
from atom_aot.runtime.transfer import to_device

# (step inputs, previous hidden [T, hidden]) -> (float32 logits [N, vocab], hidden [T, hidden])
MTPForward = Callable[[StepInputs, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class HiddenTap:
    """The hidden states [T, hidden] of the target's last forward, whichever package ran it (the mixed one for
    prefill steps, the decode one for verify steps as decode rows), for the MTP layer: `tapping` turns a
    package's (logits, hidden) entry into the logits-only forward the model runner and the ranks' links call."""

    def __init__(self, logits_and_hidden: Callable[[StepInputs], tuple[torch.Tensor, torch.Tensor]]):
        self.logits_and_hidden = logits_and_hidden     # the mixed package's, which verify graphs capture
        self.hidden: torch.Tensor | None = None

    def tapping(self, logits_and_hidden: Callable[[StepInputs], tuple[torch.Tensor, torch.Tensor]]
                ) -> Callable[[StepInputs], torch.Tensor]:
        def forward(inputs: StepInputs) -> torch.Tensor:
            logits, self.hidden = logits_and_hidden(inputs)
            return logits
        return forward


@dataclass
class Guess:
    """The MTP layer's guess after a sequence's last target step."""
    position: int            # c: the sequence's computed tokens then (the guess follows its token at c)
    token: int               # the guess for the token at c + 1: the first draft
    hidden: torch.Tensor     # [hidden] the MTP layer's output at position c - 1 (a chained step reads it)


class MTPProposer:
    decodes_without_drafts = False      # it reads every target step's hidden states (runtime/spec/proposer.py)

    def __init__(self, mtp: MTPForward, tap: HiddenTap, kv_cache: torch.Tensor, block_size: int,
                 device: torch.device, num_speculative_tokens: int):
        self.mtp, self.tap = mtp, tap
        self.kv_cache, self.block_size, self.device = kv_cache, block_size, device
        self.num_speculative_tokens = num_speculative_tokens
        self.lookahead_slots = num_speculative_tokens - 1      # the chained steps' positions past the first draft
        self._guesses: dict[Sequence, Guess] = {}

    @torch.inference_mode()
    def observe(self, batch: ScheduledBatch, following: list[list[int]]) -> None:
        """After a target step over `batch`: following[i] holds the tokens at positions start + 1 ..
        start + m of sequence i, whose positions start .. start + m - 1 the step computed (m <= its
        new tokens: a verify step's accepted ones). Runs the MTP layer over those positions."""
        first_rows = np.concatenate([[0], np.cumsum(batch.num_new_tokens)[:-1]])    # [B] each sequence's rows
        live = [i for i, seq in enumerate(batch.seqs) if following[i] and not seq.is_finished]
        if not live:
            return
        rows = np.concatenate([np.arange(first_rows[i], first_rows[i] + len(following[i])) for i in live])
        previous = self.tap.hidden[to_device(rows, torch.int64, self.device)]       # [T', hidden]
        seqs = [batch.seqs[i] for i in live]
        starts = [batch.num_computed_tokens[i] for i in live]
        inputs, last_rows = self._inputs(seqs, starts, [following[i] for i in live])
        logits, hidden = self.mtp(inputs, previous)                                 # [T', vocab], [T', hidden]
        last_rows = to_device(last_rows, torch.int64, self.device)
        last = hidden[last_rows]                                                    # [B', hidden]
        for j, (seq, start, token) in enumerate(zip(seqs, starts, logits[last_rows].argmax(dim=-1).tolist())):
            self._guesses[seq] = Guess(start + len(following[live[j]]), token, last[j])

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        self._forget_gone()
        # a chained step at position p writes p's slot: a chain stops at the last slot the sequence holds
        limits = [min(limit, len(seq.block_table) * self.block_size - seq.num_computed_tokens + 1)
                  for seq, limit in zip(seqs, limits)]
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [i for i, limit in enumerate(limits) if limit > 0]
        for i in active:
            drafts[i].append(self._guess(seqs[i]).token)
        hidden = torch.stack([self._guesses[seqs[i]].hidden for i in active]) if active else None   # [A, hidden]
        for step in range(1, self.num_speculative_tokens):
            keep = [a for a, i in enumerate(active) if min(self.num_speculative_tokens, limits[i]) > step]
            if not keep:
                break
            active, hidden = [active[a] for a in keep], hidden[keep]
            chained = [seqs[i] for i in active]
            inputs, _ = self._inputs(chained, [seq.num_computed_tokens - 1 + step for seq in chained],
                                     [[drafts[i][-1]] for i in active])          # one row each: every row is last
            logits, hidden = self.mtp(inputs, hidden)                                # [A, vocab], [A, hidden]
            for i, token in zip(active, logits.argmax(dim=-1).tolist()):
                drafts[i].append(token)
        return drafts

    def _guess(self, seq: Sequence) -> Guess:
        guess = self._guesses.get(seq)
        if guess is None or guess.position != seq.num_computed_tokens or seq.num_tokens != guess.position + 1:
            raise RuntimeError(f"the MTP proposer has no guess for request {seq.request_id!r} at its "
                               f"{seq.num_computed_tokens} computed tokens: every target step must be observed")
        return guess

    def _forget_gone(self) -> None:
        """Drop the guesses of sequences that finished or were preempted (a preempted one starts over)."""
        for seq in [seq for seq in self._guesses if seq.status != SequenceStatus.RUNNING]:
            del self._guesses[seq]

    def _inputs(self, seqs: list[Sequence], starts: list[int], tokens: list[list[int]]) -> tuple[StepInputs, np.ndarray]:
        """A step of the MTP layer: sequence i computes len(tokens[i]) positions from starts[i] (tokens[i]
        its input ids) in its own slots, each position a decode row of its own (the package's one query row
        per sequence: `as_decode_rows`, runtime/spec/verify_rows.py, says why that is exact); and the rows of each
        sequence's last position."""
        tables = np.zeros((len(seqs), max(len(seq.block_table) for seq in seqs)), dtype=np.int32)   # [B, widest]
        for row, seq in zip(tables, seqs):
            row[:len(seq.block_table)] = seq.block_table
        counts = [len(t) for t in tokens]
        begins = np.asarray(starts, dtype=np.int64)
        query_start, _, positions, slots = token_layout(begins, counts, tables, self.block_size)
        host = dict(input_ids=np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens]), positions=positions,
                    slot_mapping=slots, block_tables=tables, seq_lens=begins + counts, query_start_loc=query_start,
                    logits_indices=np.arange(len(positions)))
        inputs = StepInputs(kv_cache=self.kv_cache, **{
            name: to_device(array, input_dtype(name, self.kv_cache.dtype), self.device) for name, array in host.items()})
        return as_decode_rows(inputs, counts), query_start[1:] - 1

