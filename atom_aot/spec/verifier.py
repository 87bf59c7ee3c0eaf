"""The model runner of a speculative engine: ordinary steps run as they are; a verify step runs the
mixed forward over each sequence's newest token and its drafts (several query tokens per
sequence; the decode package and its CUDA graphs hold one token per sequence) and turns the logits
into each sequence's run of tokens with the rejection sampler. Verification reads its results
back at once: speculative engines schedule synchronously."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_aot.runtime.model_runner import LaunchedStep, ModelRunner, StepOutput
from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.runtime.sampler import logprob_tensors, sampling_probs, token_logprobs
from atom_aot.runtime.scheduler import ScheduledBatch
from atom_aot.runtime.sequence import Sequence
from atom_aot.spec.rejection import verify_greedy, verify_sampled
from atom_aot.spec.stats import SpecCounters


@dataclass
class VerifiedOutput:
    runs: list[list[int]]                          # per batch sequence: accepted drafts, then the target's token
    logprobs: list[list[TokenLogprobs] | None]     # per token of the run, for sequences that asked


class SpeculativeRunner:
    def __init__(self, runner: ModelRunner, counters: SpecCounters):
        self.runner = runner
        self.sampler = runner.sampler
        self.counters = counters

    def run(self, batch: ScheduledBatch) -> StepOutput | VerifiedOutput:
        return self.complete(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> LaunchedStep | VerifiedOutput:
        if not batch.is_verify:
            return self.runner.launch(batch)
        with torch.profiler.record_function(f"verify[bs={len(batch.seqs)},tokens={batch.num_tokens}]"):
            inputs, _ = self.runner.prepare_inputs(batch)
            logits = self.runner.forwards.mixed(inputs)         # [T, V]: every row of the batch
            return self._verify(batch, logits)

    def complete(self, launched: LaunchedStep | VerifiedOutput) -> StepOutput | VerifiedOutput:
        return launched if isinstance(launched, VerifiedOutput) else self.runner.complete(launched)

    def _verify(self, batch: ScheduledBatch, logits: torch.Tensor) -> VerifiedOutput:
        rows = [seq for seq, count in zip(batch.seqs, batch.num_new_tokens) for _ in range(count)]
        probs = None if all(seq.params.greedy for seq in batch.seqs) else sampling_probs(logits, rows)
        out = VerifiedOutput(runs=[], logprobs=[])
        first = 0
        for seq, count, drafts in zip(batch.seqs, batch.num_new_tokens, batch.draft_token_ids):
            if seq.params.greedy:
                run = verify_greedy(logits[first:first + count], list(drafts))
            else:
                generator = seq.generator or self.sampler.generator
                run = verify_sampled(probs[first:first + count], list(drafts), None, generator)
            self.counters.record(len(drafts), len(run) - 1)
            out.runs.append(run)
            out.logprobs.append(self._logprobs(seq, logits[first:first + len(run)], run))
            first += count
        return out

    def _logprobs(self, seq: Sequence, logits: torch.Tensor, run: list[int]) -> list[TokenLogprobs] | None:
        """Like the ordinary step's: under the model's own distribution (logits [len(run), V])."""
        if seq.params.logprobs is None:
            return None
        tokens = torch.tensor(run, dtype=torch.int64, device=logits.device)
        return token_logprobs(logprob_tensors(logits, tokens, seq.params.logprobs), [seq.params.logprobs] * len(run))
