"""The typed contract between the scheduler and the model runner: one step's decision, as a frozen snapshot."""
from __future__ import annotations

from dataclasses import dataclass

from atom_aot.runtime.scheduling.sequence import Sequence


@dataclass(frozen=True)
class ScheduledBatch:
    """The scheduler's decision for one step: what the model runner computes. A snapshot: the
    sequences move on (their counts advance when the batch is made), the batch does not."""
    seqs: tuple[Sequence, ...]               # in batch order
    num_new_tokens: tuple[int, ...]          # tokens each sequence computes this step
    num_computed_tokens: tuple[int, ...]     # tokens each had in the cache before: its first new position
    sampling: tuple[bool, ...]               # whether each reaches its last token, so its next one is sampled
    is_prefill: bool                         # True: prompt tokens among them (decodes may ride along); False:
                                             # every sequence computes its newest token (and its drafts)
    freed: tuple[Sequence, ...] = ()         # sequences whose blocks were freed since the last batch
    scheduled_at: float = 0.0                # the scheduler's clock when the batch was made
    # a verify step (speculative decoding): each sequence's draft tokens, computed after its newest
    # token (num_new_tokens counts both); None: an ordinary step
    draft_token_ids: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def of(cls, seqs: tuple[Sequence, ...], num_new_tokens: tuple[int, ...], is_prefill: bool,
           freed: tuple[Sequence, ...] = (), scheduled_at: float = 0.0,
           draft_token_ids: tuple[tuple[int, ...], ...] | None = None) -> ScheduledBatch:
        """The batch of these sequences as they are now (before their counts advance)."""
        starts = tuple(seq.num_computed_tokens for seq in seqs)
        drafts = [len(d) for d in draft_token_ids] if draft_token_ids is not None else [0] * len(seqs)
        sampling = tuple(start + count - k == seq.num_tokens
                         for seq, start, count, k in zip(seqs, starts, num_new_tokens, drafts))
        return cls(seqs, num_new_tokens, starts, sampling, is_prefill, freed, scheduled_at, draft_token_ids)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_verify(self) -> bool:
        return self.draft_token_ids is not None
