"""Runs one scheduled batch: its input tensors, the model (compiled or eager, the same signature),
sampling and logprobs, in two halves. `launch` queues all of it on the device and returns at once;
`complete` reads the results back (the only place the host waits for the device). Between the two
the host may schedule and launch the next batch (async scheduling); `run` is both at once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.execution.step_inputs_builder import LogitsRows, StepInputsBuilder
from atom_aot.runtime.outputs import StepOutput
from atom_aot.runtime.sampling.sampler import LogprobTensors, Sampler, logprob_tensors, token_logprobs
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.sequence import Sequence
from atom_aot.runtime.transfer import Readback, to_device


class StepResults(NamedTuple):
    """What a step leaves on the device for the host to read."""
    tokens: torch.Tensor                         # [n] one per sampling sequence, in batch order
    logprobs: LogprobTensors | None              # of the sampling sequences that asked, in their order
    prompt_logprobs: dict[int, LogprobTensors]   # batch index -> its scored prompt positions


@dataclass(frozen=True)
class LaunchedStep:
    """A step queued on the device; `ModelRunner.complete` reads its results."""
    batch: ScheduledBatch
    results: Readback[StepResults]


class ModelRunner:
    def __init__(self, forwards: Forwards, kv_cache: torch.Tensor, block_size: int, device: torch.device,
                 sampler: Sampler):
        self.forwards = forwards
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device
        self.sampler = sampler
        self.inputs = StepInputsBuilder(kv_cache, block_size, device)

    def run(self, batch: ScheduledBatch) -> StepOutput:
        return self.complete(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> LaunchedStep:
        # a named range per step, so profiler traces (server or offline) split prefill from decode
        kind = "prefill" if batch.is_prefill else "decode"
        with torch.profiler.record_function(f"{kind}[bs={len(batch.seqs)},tokens={batch.num_tokens}]"):
            inputs, rows = self.prepare_inputs(batch)
            logits = self.forwards.for_batch(batch)(inputs)
            return LaunchedStep(batch, Readback(self._sample(batch, rows, logits), self.device))

    def new_request_generator(self, seed: int) -> torch.Generator:
        return self.sampler.new_request_generator(seed)

    def prepare_inputs(self, batch: ScheduledBatch) -> tuple[StepInputs, LogitsRows]:
        """The step's flat tensors (on the device) and which logits rows sample or score the prompt."""
        return self.inputs.build(batch)

    def complete(self, launched: LaunchedStep) -> StepOutput:
        """Wait for the step's results (not for steps launched after it) and hand them out per sequence."""
        batch, results = launched.batch, launched.results.wait()
        sampling = [i for i, samples in enumerate(batch.sampling) if samples]
        out = StepOutput(sampled=[None] * len(batch.seqs), logprobs=[None] * len(batch.seqs),
                         prompt_logprobs=[None] * len(batch.seqs))
        for i, token in zip(sampling, results.tokens.tolist()):
            out.sampled[i] = token
        if results.logprobs is not None:
            wanted = [i for i in sampling if batch.seqs[i].params.logprobs is not None]
            scored = token_logprobs(results.logprobs, [batch.seqs[i].params.logprobs for i in wanted])
            for i, logprobs in zip(wanted, scored):
                out.logprobs[i] = logprobs
        for i, tensors in results.prompt_logprobs.items():
            num_top = batch.seqs[i].params.prompt_logprobs
            out.prompt_logprobs[i] = token_logprobs(tensors, [num_top] * len(tensors.ranks))
        return out

    def _sample(self, batch: ScheduledBatch, rows: LogitsRows, logits: torch.Tensor) -> StepResults:
        """Queue sampling and logprobs; logits: [N, vocab], the rows `rows` describes."""
        seqs = [seq for seq, samples in zip(batch.seqs, batch.sampling) if samples]
        # without prompt rows, every logits row samples, in batch order
        logits_to_sample = logits[to_device(rows.sample_rows, torch.int64, self.device)] if rows.prompt_rows else logits
        tokens = (self.sampler(logits_to_sample, seqs, self.inputs.sampling_batch()) if seqs
                  else torch.empty(0, dtype=torch.int64, device=logits.device))
        self.inputs.remember_sampled(tokens)
        return StepResults(tokens, self._sampled_logprobs(logits_to_sample, tokens, seqs),
                           self._prompt_logprobs(batch, rows, logits))

    def _sampled_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor,
                          seqs: list[Sequence]) -> LogprobTensors | None:
        wanted = [j for j, seq in enumerate(seqs) if seq.params.logprobs is not None]
        if not wanted:
            return None
        index = to_device(wanted, torch.int64, self.device)
        return logprob_tensors(logits[index], tokens[index], max(seqs[j].params.logprobs for j in wanted))

    def _prompt_logprobs(self, batch: ScheduledBatch, rows: LogitsRows,
                         logits: torch.Tensor) -> dict[int, LogprobTensors]:
        scored = {}
        for i, scoring in rows.prompt_rows.items():
            seq, start = batch.seqs[i], batch.num_computed_tokens[i]
            targets = to_device(seq.token_ids[start + 1:start + 1 + len(scoring)], torch.int64, self.device)
            scored[i] = logprob_tensors(logits[scoring.start:scoring.stop], targets, seq.params.prompt_logprobs)
        return scored
