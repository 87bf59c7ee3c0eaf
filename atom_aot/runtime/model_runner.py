"""Runs one scheduled batch: flattens it into the model's input tensors, calls the model
(compiled or eager, the same signature), samples, and scores logprobs where asked."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from atom_aot.models.step_inputs import SPECS, StepInputs
from atom_aot.runtime.forwards import Forwards
from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.runtime.sampler import Sampler, compute_logprobs
from atom_aot.runtime.scheduler import ScheduledBatch


@dataclass(frozen=True)
class LogitsRows:
    """Host-side bookkeeping of one step: what each row of the returned logits is for."""
    sample_rows: list[int]          # for each sampling sequence (batch order), its row in the logits
    prompt_rows: dict[int, range]   # batch index -> logits rows scoring its next prompt tokens (prompt logprobs)


@dataclass
class StepOutput:
    sampled: list[int | None]                      # per batch sequence; None: still in its prompt
    logprobs: list[TokenLogprobs | None]
    prompt_logprobs: list[list[TokenLogprobs] | None]


class ModelRunner:
    def __init__(self, forwards: Forwards, kv_cache: torch.Tensor, block_size: int, device: torch.device,
                 sampler: Sampler):
        self.forwards = forwards
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device
        self.sampler = sampler

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        # a named range per step, so profiler traces (server or offline) split prefill from decode
        kind = "prefill" if batch.is_prefill else "decode"
        with torch.profiler.record_function(f"{kind}[bs={len(batch.seqs)},tokens={batch.num_tokens}]"):
            inputs, rows = self.prepare_inputs(batch)
            logits = self.forwards.for_batch(batch)(inputs)
            return self.postprocess(batch, rows, logits)

    def prepare_inputs(self, batch: ScheduledBatch) -> tuple[StepInputs, LogitsRows]:
        """The step's flat tensors (on the device) and which logits rows sample or score the prompt."""
        input_ids, positions, slots, logits_rows, sample_rows, prompt_rows = [], [], [], [], [], {}
        first_row = 0   # row of this sequence's first new token in the flat batch
        for i, (seq, count) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start = seq.num_computed_tokens
            pos = np.arange(start, start + count)
            table = np.asarray(seq.block_table, dtype=np.int64)
            input_ids.append(np.asarray(seq.token_ids[start:start + count], dtype=np.int64))
            positions.append(pos)
            slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            scoring = _prompt_positions_to_score(seq, start, count)
            if scoring:
                prompt_rows[i] = range(len(logits_rows), len(logits_rows) + len(scoring))
                logits_rows.extend(first_row + p - start for p in scoring)
            if batch.samples(i):
                sample_rows.append(len(logits_rows))
                logits_rows.append(first_row + count - 1)
            first_row += count
        max_blocks = max(len(seq.block_table) for seq in batch.seqs)
        tables = np.zeros((len(batch.seqs), max_blocks), dtype=np.int32)
        for i, seq in enumerate(batch.seqs):
            tables[i, :len(seq.block_table)] = seq.block_table
        counts = np.asarray(batch.num_new_tokens)
        seq_lens = np.asarray([s.num_computed_tokens for s in batch.seqs]) + counts
        host = dict(input_ids=np.concatenate(input_ids), positions=np.concatenate(positions),
                    slot_mapping=np.concatenate(slots), block_tables=tables, seq_lens=seq_lens,
                    query_start_loc=np.concatenate([[0], np.cumsum(counts)]), logits_indices=np.asarray(logits_rows))
        inputs = StepInputs(kv_cache=self.kv_cache, **{name: self._to_device(name, a) for name, a in host.items()})
        return inputs, LogitsRows(sample_rows, prompt_rows)

    def _to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        host = torch.from_numpy(np.ascontiguousarray(array, dtype=np.dtype(SPECS[name].dtype)))
        return host.to(self.device, non_blocking=True)

    def postprocess(self, batch: ScheduledBatch, rows: LogitsRows, logits: torch.Tensor) -> StepOutput:
        sampling_seqs = [seq for i, seq in enumerate(batch.seqs) if batch.samples(i)]
        sampled = []
        if sampling_seqs:
            sample = torch.as_tensor(rows.sample_rows, device=logits.device)
            tokens = self.sampler(logits[sample], sampling_seqs)
            sampled = tokens.tolist()
            logprobs = self._sampled_logprobs(logits[sample], tokens, sampling_seqs)
        out = StepOutput(sampled=[None] * len(batch.seqs), logprobs=[None] * len(batch.seqs),
                         prompt_logprobs=[None] * len(batch.seqs))
        sampling_indices = [i for i in range(len(batch.seqs)) if batch.samples(i)]
        for j, i in enumerate(sampling_indices):
            out.sampled[i] = sampled[j]
            out.logprobs[i] = logprobs[j]
        for i, scoring in rows.prompt_rows.items():
            seq = batch.seqs[i]
            start = seq.num_computed_tokens
            targets = torch.as_tensor(seq.token_ids[start + 1:start + 1 + len(scoring)], device=logits.device)
            out.prompt_logprobs[i] = compute_logprobs(logits[scoring.start:scoring.stop], targets,
                                                      [seq.params.prompt_logprobs] * len(scoring))
        return out

    @staticmethod
    def _sampled_logprobs(logits, tokens, seqs) -> list[TokenLogprobs | None]:
        wanted = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
        result: list[TokenLogprobs | None] = [None] * len(seqs)
        if wanted:
            rows = torch.as_tensor(wanted, device=logits.device)
            scored = compute_logprobs(logits[rows], tokens[rows], [seqs[i].params.logprobs for i in wanted])
            for i, lp in zip(wanted, scored):
                result[i] = lp
        return result


def _prompt_positions_to_score(seq, start: int, count: int) -> list[int]:
    """Positions in [start, start+count) whose logits score the next prompt token (echo + logprobs)."""
    if seq.params.prompt_logprobs is None:
        return []
    last = min(start + count, seq.num_prompt_tokens - 1)
    return list(range(start, last))
