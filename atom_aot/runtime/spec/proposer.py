"""What a proposer is: K guessed next tokens per running sequence, from its token history.

Torch-free, so the scheduler (plain Python) calls it. A proposer's guesses are point masses: the
verifier accepts draft x with probability p(x) (the rejection sampler's q(x) = 1), which keeps the
output distribution exactly the target's whatever the guesses are.
"""
from __future__ import annotations

from typing import Protocol

from atom_aot.runtime.engine.sequence import Sequence

METHODS = ("mtp", "ngram", "draft")


class Proposer(Protocol):
    num_speculative_tokens: int     # K: the most draft tokens proposed for one sequence in one step
    # a step where no sequence got a draft may run as a plain decode step (the decode package, in CUDA
    # graphs) instead of a verify step of one row per sequence; False for a proposer that reads every
    # step's hidden states from the mixed package (MTP)
    decodes_without_drafts: bool

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        """Draft tokens to follow each sequence's known tokens: at most min(K, limits[i]) for
        seqs[i] (fewer, or none, when it has no good guess)."""
        ...
