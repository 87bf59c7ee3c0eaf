"""The model runner of a speculative engine: ordinary steps run as they are; a verify step runs the
mixed forward over each sequence's newest token and its drafts (several query tokens per
sequence: the mixed package itself, or its verify CUDA graphs, runtime/spec/verify_graphs.py) and turns
the logits into each sequence's run of tokens with the rejection sampler. Verification reads its
results back at once: speculative engines schedule synchronously."""
from __future__ import annotations

from typing import Callable, Protocol, Sequence as Seq

import torch

from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.execution.model_runner import LaunchedStep, ModelRunner
from atom_aot.runtime.outputs import SpecCounters, StepOutput, TokenLogprobs, VerifiedOutput
from atom_aot.runtime.sampling.sampler import logprob_tensors, sampling_probs, token_logprobs
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.scheduler import draft_limit
from atom_aot.runtime.scheduling.sequence import Sequence
from atom_aot.runtime.spec.proposer import Proposer
from atom_aot.runtime.spec.rejection import verify_greedy, verify_sampled_batch


class StepObserver(Protocol):
    """A proposer that follows every target step (the MTP proposer: atom_aot/runtime/spec/mtp.py)."""

    def observe(self, batch: ScheduledBatch, following: list[list[int]]) -> None:
        """following[i]: the tokens after the positions the step computed for batch.seqs[i]."""
        ...


# (a verify batch's inputs, its query tokens per sequence) -> float32 logits [T, vocab], every row
VerifyForward = Callable[[StepInputs, Seq[int]], torch.Tensor]


class SpeculativeRunner:
    def __init__(self, runner: ModelRunner, counters: SpecCounters, proposer: Proposer, max_model_len: int,
                 observer: StepObserver | None = None, verify_forward: VerifyForward | None = None):
        self.runner = runner
        self.sampler = runner.sampler
        self.counters = counters
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.observer = observer        # told of each step's computed positions before the scheduler's update
        self.verify_forward = verify_forward or (lambda inputs, counts: runner.forwards.mixed(inputs))

    def run(self, batch: ScheduledBatch) -> StepOutput | VerifiedOutput:
        return self.complete(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> LaunchedStep | VerifiedOutput:
        if not batch.is_verify:
            return self.runner.launch(batch)
        with torch.profiler.record_function(f"verify[bs={len(batch.seqs)},tokens={batch.num_tokens}]"):
            inputs, _ = self.runner.prepare_inputs(batch)
            logits = self.verify_forward(inputs, batch.num_new_tokens)    # [T, V]: every row of the batch
            verified = self._verify(batch, logits)
            if self.observer is not None:
                self.observer.observe(batch, following_tokens(batch, verified.runs))
            return verified

    def complete(self, launched: LaunchedStep | VerifiedOutput) -> StepOutput | VerifiedOutput:
        if isinstance(launched, VerifiedOutput):
            return launched
        result = self.runner.complete(launched)
        if self.observer is not None:
            self.observer.observe(launched.batch, following_tokens(launched.batch, result.sampled))
        return result

    def take_draft_token_ids(self, seqs: list[Sequence]) -> dict[str, list[int]]:
        """Drafts for the next verify step of each sequence that just got its step's tokens (request id -> tokens),
        from the proposer, after the step (vLLM's shape: the scheduler only reads them). A sequence that finished,
        or whose next step is no decode, gets none."""
        ready = [seq for seq in seqs if not seq.is_finished and seq.num_uncomputed_tokens == 1]
        if not ready:
            return {}
        k = self.proposer.num_speculative_tokens
        drafts = self.proposer.propose(ready, [draft_limit(seq, k, self.max_model_len) for seq in ready])
        return {seq.request_id: list(draft) for seq, draft in zip(ready, drafts) if draft}

    def new_request_generator(self, seed: int) -> torch.Generator:
        return self.sampler.new_request_generator(seed)

    def _verify(self, batch: ScheduledBatch, logits: torch.Tensor) -> VerifiedOutput:
        rows = [seq for seq, count in zip(batch.seqs, batch.num_new_tokens) for _ in range(count)]
        greedy = [seq.params.greedy for seq in batch.seqs]
        probs = None if all(greedy) else sampling_probs(logits, rows, self.sampler.threshold)
        argmax = logits.argmax(dim=-1).tolist() if any(greedy) else None     # one read back for the batch
        starts = [0]
        for count in batch.num_new_tokens:
            starts.append(starts[-1] + count)
        sampled = iter(verify_sampled_batch([
            (probs[start:start + count], list(drafts), None, seq.generator or self.sampler.generator)
            for seq, start, count, drafts in zip(batch.seqs, starts, batch.num_new_tokens, batch.draft_token_ids)
            if not seq.params.greedy]))
        out = VerifiedOutput(runs=[], logprobs=[])
        for seq, first, count, drafts in zip(batch.seqs, starts, batch.num_new_tokens, batch.draft_token_ids):
            run = verify_greedy(argmax[first:first + count], list(drafts)) if seq.params.greedy else next(sampled)
            self.counters.record(len(drafts), len(run) - 1)
            out.runs.append(run)
            out.logprobs.append(self._logprobs(seq, logits[first:first + len(run)], run))
        return out

    def _logprobs(self, seq: Sequence, logits: torch.Tensor, run: list[int]) -> list[TokenLogprobs] | None:
        """Like the ordinary step's: under the model's own distribution (logits [len(run), V])."""
        if seq.params.logprobs is None:
            return None
        tokens = torch.tensor(run, dtype=torch.int64, device=logits.device)
        return token_logprobs(logprob_tensors(logits, tokens, seq.params.logprobs), [seq.params.logprobs] * len(run))


def following_tokens(batch: ScheduledBatch, runs_or_sampled: list) -> list[list[int]]:
    """For each sequence of a target step, the tokens after the positions it computed: a verify
    step's run (its accepted drafts, then the target's token); a prefill chunk's next prompt tokens,
    ending with the sampled token where the chunk reaches the end."""
    if batch.is_verify:
        return [list(run) for run in runs_or_sampled]
    following = []
    for seq, start, count, token in zip(batch.seqs, batch.num_computed_tokens, batch.num_new_tokens, runs_or_sampled):
        known = seq.token_ids[start + 1:start + count + 1]
        following.append(known + [token] if len(known) < count and token is not None else known)
    return following
