"""The compiled forwards of a running engine, and which one runs a batch.

`mixed` runs any batch. `decode`, where the artifact has one, runs batches of one new token per
sequence with the decode kernel configs: the package itself, or its CUDA graphs, which hold only
batches up to their largest capture size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch

Forward = Callable[[StepInputs], torch.Tensor]    # -> float32 logits [N, vocab]


@dataclass(frozen=True)
class Forwards:
    mixed: Forward
    decode: Forward | None = None
    decode_max_seqs: int | None = None     # decode batches of more sequences run `mixed` (None: no limit)

    def for_batch(self, batch: ScheduledBatch) -> Forward:
        fits = self.decode_max_seqs is None or len(batch.seqs) <= self.decode_max_seqs
        if batch.is_prefill or self.decode is None or not fits:
            return self.mixed
        return self.decode
