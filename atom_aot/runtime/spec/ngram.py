"""Prompt lookup: guess that the text goes on as it did after the last time its current ending
appeared (rewrites, summaries quoting their source, code edits). No weights, no device work."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atom_aot.runtime.scheduling.sequence import Sequence


@dataclass(frozen=True)
class NgramProposer:
    num_speculative_tokens: int     # K
    min_n: int = 2                  # shortest suffix worth matching
    max_n: int = 4                  # longest suffix tried (first)
    decodes_without_drafts: ClassVar[bool] = True     # reads token ids only (runtime/spec/proposer.py)
    lookahead_slots: ClassVar[int] = 0

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n} "
                             f"(--ngram-min-n / --ngram-max-n)")

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        return [propose_ngram(seq.token_ids, min(self.num_speculative_tokens, limit), self.min_n, self.max_n)
                for seq, limit in zip(seqs, limits)]


def propose_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The (up to) k tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` of n tokens, n from max_n down to min_n; [] when no suffix recurs."""
    if k <= 0:
        return []
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):     # latest occurrence first, not the suffix itself
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []
