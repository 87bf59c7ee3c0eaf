"""Log-probabilities in OpenAI's two formats, and tokens as text and bytes.

chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}

A byte-level BPE token may hold part of a UTF-8 character; its `bytes` are the exact bytes
(from the tokenizer's byte alphabet), its `token` text their lossy decoding.
"""
from __future__ import annotations

from functools import lru_cache

from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.runtime.text.detokenizer import BYTE_ALPHABET


class TokenRenderer:
    """How a token id is shown in logprobs (cached: the same ids recur)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.bytes = lru_cache(maxsize=1 << 16)(self._bytes)
        self.text = lru_cache(maxsize=1 << 16)(self._text)

    def _bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and piece and all(c in BYTE_ALPHABET for c in piece):
            return bytes(BYTE_ALPHABET[c] for c in piece)
        return self.tokenizer.decode([token_id]).encode()

    def _text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


class TokenIdRenderer:
    """vLLM's return_tokens_as_token_ids: every token shown as "token_id:{id}" (its bytes those of
    that text), so that a token holding part of a character is still named exactly."""

    @staticmethod
    def text(token_id: int) -> str:
        return f"token_id:{token_id}"

    def bytes(self, token_id: int) -> bytes:
        return self.text(token_id).encode()


def chat_logprobs(renderer: TokenRenderer | TokenIdRenderer, entries: list[TokenLogprobs]) -> dict:
    return {"content": [_chat_entry(renderer, e) for e in entries]}


def _chat_entry(renderer: TokenRenderer | TokenIdRenderer, entry: TokenLogprobs) -> dict:
    item = _chat_token(renderer, entry.token_id, entry.logprob)
    item["top_logprobs"] = [_chat_token(renderer, token_id, logprob) for token_id, logprob in entry.top]
    return item


def _chat_token(renderer: TokenRenderer | TokenIdRenderer, token_id: int, logprob: float) -> dict:
    return {"token": renderer.text(token_id), "logprob": logprob, "bytes": list(renderer.bytes(token_id))}


def completion_logprobs(renderer: TokenRenderer | TokenIdRenderer, token_ids: list[int],
                        entries: list[TokenLogprobs | None], offset: int = 0) -> tuple[dict, int]:
    """The completions format for `token_ids` (an entry of None: unscored, the prompt's first
    token); text offsets start at `offset`. Returns it and the offset after the last token."""
    result = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, entry in zip(token_ids, entries):
        text = renderer.text(token_id)
        result["tokens"].append(text)
        result["text_offset"].append(offset)
        offset += len(text)
        if entry is None:
            result["token_logprobs"].append(None)
            result["top_logprobs"].append(None)
            continue
        top = {renderer.text(t): lp for t, lp in entry.top}
        top.setdefault(text, entry.logprob)       # the chosen token is always listed (as vLLM does)
        result["token_logprobs"].append(entry.logprob)
        result["top_logprobs"].append(top)
    return result, offset


def prompt_logprobs(renderer: TokenRenderer | TokenIdRenderer, entries: list[TokenLogprobs]) -> list[dict | None]:
    """vLLM's `prompt_logprobs` of a choice: per prompt token, None for the first (nothing precedes
    it), else {token id: {"logprob", "rank", "decoded_token"}}: the prompt's token, then the top ones."""
    shown: list[dict | None] = [None]
    for entry in entries:
        item = {str(entry.token_id): _vllm_entry(renderer, entry.token_id, entry.logprob, entry.rank)}
        for rank, (token_id, logprob) in enumerate(entry.top, 1):
            item.setdefault(str(token_id), _vllm_entry(renderer, token_id, logprob, rank))
        shown.append(item)
    return shown


def _vllm_entry(renderer: TokenRenderer | TokenIdRenderer, token_id: int, logprob: float, rank: int) -> dict:
    return {"logprob": logprob, "rank": rank, "decoded_token": renderer.text(token_id)}
