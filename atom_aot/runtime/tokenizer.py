"""The artifact's tokenizer (transformers' AutoTokenizer over its tokenizer/ folder) and prompt helpers."""
from __future__ import annotations

from pathlib import Path


def load_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def apply_chat_template(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    if not tokenizer.chat_template:
        raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode_prompt(tokenizer, prompt: str | list[int], chat_templated: bool = False) -> list[int]:
    """Token ids of a prompt; a chat-templated string already carries its special tokens."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=not chat_templated).input_ids
    ids = list(prompt)
    if not all(isinstance(t, int) and 0 <= t for t in ids):
        raise ValueError("a token-id prompt must be a list of non-negative integers")
    return ids
