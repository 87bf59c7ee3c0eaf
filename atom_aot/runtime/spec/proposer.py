"""What a proposer is: K guessed next tokens per running sequence, from its token history.

The speculative runner (runtime/spec/verifier.py) asks it after each step, for the sequences that got tokens,
and hands the drafts to the scheduler, which only reads them. A proposer's guesses are point masses: the
verifier accepts draft x with probability p(x) (the rejection sampler's q(x) = 1), which keeps the
output distribution exactly the target's whatever the guesses are.
"""
from __future__ import annotations

from typing import Protocol

from atom_aot.runtime.scheduling.sequence import Sequence


class Proposer(Protocol):
    num_speculative_tokens: int     # K: the most draft tokens proposed for one sequence in one step
    # a step where no sequence got a draft may run as a plain decode step (the decode package, in CUDA
    # graphs) instead of a verify step of one row per sequence; False for a proposer that reads every
    # step's hidden states from the mixed package (MTP)
    decodes_without_drafts: bool
    # slots past a verify step's tokens that the proposer writes after it (the MTP layer's chained steps write its
    # cache layer at the positions of the drafts after the first): the scheduler reserves them with the step
    lookahead_slots: int

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        """Draft tokens to follow each sequence's known tokens: at most min(K, limits[i]) for
        seqs[i] (fewer, or none, when it has no good guess)."""
        ...
