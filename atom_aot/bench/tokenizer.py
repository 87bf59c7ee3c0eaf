"""Where a benchmark gets its tokenizer: an artifact, a GGUF with HF tokenizer files beside it,
or anything `AutoTokenizer.from_pretrained` takes. Prompt lengths must be counted by the same
tokenizer the server uses, so an artifact's own copy is preferred."""
from __future__ import annotations

from pathlib import Path


def tokenizer_source(name_or_path: str) -> str:
    """The folder (or hub name) holding the tokenizer of `name_or_path`."""
    path = Path(name_or_path)
    if path.suffix == ".atom" or (path.is_dir() and (path / "manifest.json").exists()):
        from atom_aot.artifact.reader import Artifact
        return str(Artifact.open(path).member_dir("tokenizer"))
    if path.suffix == ".gguf":
        if not (path.parent / "tokenizer.json").exists():
            raise ValueError(f"{path} is a GGUF without tokenizer.json beside it; pass --tokenizer "
                             f"(an artifact or a Hugging Face folder)")
        return str(path.parent)
    return name_or_path


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tokenizer_source(name_or_path))


def count_tokens(tokenizer, text: str) -> int:
    """Tokens the server sees for a text prompt (it encodes with the tokenizer's default special tokens)."""
    return len(tokenizer(text).input_ids)
