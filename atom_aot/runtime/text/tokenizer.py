"""The artifact's tokenizer (from its tokenizer/ folder) and prompt helpers."""
from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger("atom_aot")


def load_tokenizer(tokenizer_dir: Path):
    """`FastTokenizer` straight from tokenizer.json when there is one, else transformers' AutoTokenizer.

    Both read the same tokenizer.json and tokenizer_config.json (tests/test_fast_tokenizer.py checks
    they agree), but importing transformers costs seconds of start-up that, in the thread
    `LLMEngine` loads the tokenizer in, also hold the GIL the model load needs. The usual path logs
    at debug level (the CLI's stderr stays clean), the slow fallback at info.
    """
    tokenizer_dir = Path(tokenizer_dir)
    if (tokenizer_dir / "tokenizer.json").is_file():
        from atom_aot.runtime.text.fast_tokenizer import FastTokenizer
        log.debug("tokenizer: tokenizer.json via the tokenizers package (%s)", tokenizer_dir)
        return FastTokenizer.from_dir(tokenizer_dir)
    log.info("tokenizer: no tokenizer.json in %s; transformers' AutoTokenizer (slower to import)", tokenizer_dir)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def load_artifact_tokenizer(artifact_path: Path):
    """(tokenizer, seconds) from an artifact's verified tokenizer/ members."""
    from atom_aot.artifact.reader import Artifact
    start = time.perf_counter()
    tokenizer = load_tokenizer(Artifact.open(artifact_path).member_dir("tokenizer"))
    return tokenizer, time.perf_counter() - start


def apply_chat_template(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                        **template_options) -> str:
    if not tokenizer.chat_template and not template_options.get("chat_template"):
        raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **template_options)


def encode_prompt(tokenizer, prompt: str | list[int], chat_templated: bool = False) -> list[int]:
    """Token ids of a prompt; a chat-templated string already carries its special tokens."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=not chat_templated).input_ids
    ids = list(prompt)
    if not all(isinstance(t, int) and 0 <= t for t in ids):
        raise ValueError("a token-id prompt must be a list of non-negative integers")
    return ids
