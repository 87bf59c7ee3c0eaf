"""What the output parsers share about markers in a growing text."""
from __future__ import annotations

import functools
import re


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (it may be the marker's first half): what a stream
    holds back until the next piece tells."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if marker.startswith(text[-n:])), 0)


@functools.lru_cache(maxsize=8)
def special_texts(tokenizer) -> frozenset[str]:
    """The texts of the tokenizer's special tokens (those that skip_special_tokens leaves out); read once per
    tokenizer, not per request."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "backend", None)
    if not hasattr(backend, "get_added_tokens_decoder"):
        return frozenset(getattr(tokenizer, "all_special_tokens", ()))
    return frozenset(token.content for token in backend.get_added_tokens_decoder().values() if token.special)


def other_specials(tokenizer, markers: tuple[str, ...]) -> frozenset[str] | None:
    """Where `tokenizer` holds some of a reader's `markers` as special tokens (so its text is decoded with the
    special tokens kept): the other special tokens, which that text then shows and the reader leaves out; None
    where no marker is special (the text holds the markers either way, as tokens or as plain text)."""
    special = special_texts(tokenizer)
    return special - set(markers) if special & set(markers) else None


class HiddenTokens:
    """Special tokens that a text decoded with its special tokens kept shows and its reader does not want (the
    end-of-sequence token, say): removed, the first characters of a possible one held back while the text grows."""

    def __init__(self, tokens: frozenset[str]):
        self._pattern = re.compile("|".join(map(re.escape, sorted(tokens, key=len, reverse=True)))) if tokens else None
        self._starts = frozenset(token[:n] for token in tokens for n in range(1, len(token)))
        self._longest = max(map(len, tokens), default=0)

    def visible(self, text: str, finished: bool = True) -> str:
        if self._pattern is None:
            return text
        text = self._pattern.sub("", text)
        if finished:
            return text
        held = next((n for n in range(min(self._longest - 1, len(text)), 0, -1) if text[-n:] in self._starts), 0)
        return text[:len(text) - held]
