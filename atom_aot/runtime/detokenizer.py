"""Incremental detokenization that is correct across multi-byte characters.

A byte-level BPE token can end in the middle of a UTF-8 character; decoding it alone yields
U+FFFD. Text is emitted only once the window decodes cleanly. A few prompt tokens lead the
window so tokenizers that drop a leading space when decoding a lone token still render it.
"""
from __future__ import annotations

CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the text they complete (possibly empty, while a character is cut)."""
        self.token_ids.extend(new_token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.token_ids[self.prefix_offset:])
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return text[len(prefix):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
