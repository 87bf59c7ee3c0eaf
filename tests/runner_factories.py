"""Factories for the model runner's tests: sequences in any state of their life, batches as the
scheduler makes them, and a CPU runner whose forwards are fakes that record what they were given."""
from __future__ import annotations

import torch

from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.execution.model_runner import ModelRunner
from atom_aot.runtime.sampling.sampler import Sampler
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.sequence import Sequence, SequenceStatus

BLOCK_SIZE = 4
VOCAB = 32


def make_sequence(token_ids: list[int], block_table: list[int], num_computed_tokens: int = 0,
                  num_prompt_tokens: int | None = None, request_id: str = "r", **params) -> Sequence:
    """A running sequence holding `block_table`; `num_prompt_tokens` defaults to all of `token_ids`."""
    seq = Sequence(request_id=request_id, token_ids=list(token_ids),
                   num_prompt_tokens=len(token_ids) if num_prompt_tokens is None else num_prompt_tokens,
                   params=SamplingParams(temperature=0, **params), block_size=BLOCK_SIZE,
                   status=SequenceStatus.RUNNING, num_computed_tokens=num_computed_tokens,
                   block_table=list(block_table))
    assert len(block_table) * BLOCK_SIZE >= len(token_ids), "the block table must hold every token"
    return seq


def make_batch(*scheduled: tuple[Sequence, int], freed: tuple[Sequence, ...] = ()) -> ScheduledBatch:
    """(sequence, tokens it computes this step) pairs; a decode batch when every count is the last
    token. `freed`: sequences whose blocks the scheduler freed since the last batch."""
    seqs = tuple(seq for seq, _ in scheduled)
    counts = tuple(count for _, count in scheduled)
    is_prefill = not all(count == 1 and seq.num_uncomputed_tokens == 1 for seq, count in scheduled)
    return ScheduledBatch.of(seqs, counts, is_prefill, freed)


class RecordingForward:
    """Stands in for a compiled forward: keeps its inputs, returns logits [N, VOCAB] whose argmax in
    row r is (token id at logits row r + 1) % VOCAB."""

    def __init__(self):
        self.calls: list[StepInputs] = []

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        self.calls.append(inputs)
        next_ids = (inputs.input_ids[inputs.logits_indices] + 1) % VOCAB
        return torch.nn.functional.one_hot(next_ids, VOCAB).float()


def make_runner(forwards: Forwards | None = None, num_blocks: int = 16) -> ModelRunner:
    kv_cache = torch.zeros(1, 2, num_blocks, BLOCK_SIZE, 1, 2)
    return ModelRunner(forwards or Forwards(RecordingForward()), kv_cache, BLOCK_SIZE, torch.device("cpu"),
                       Sampler(torch.device("cpu")))
