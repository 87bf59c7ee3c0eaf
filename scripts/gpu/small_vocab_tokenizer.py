"""A byte-level BPE tokenizer cut to a model's smaller vocabulary, for random-weight benchmarks of models whose own
tokenizer is not here (Mixtral's 32,000 ids: the Llama-3 tokenizer cut to its first 32,000 ids).

A BPE vocabulary grows in merge order, so its first N ids with the merges that make them are a complete
tokenizer of N ids (the 256 byte symbols come first). Special tokens above N are dropped, and with them the
post-processor that adds a begin-of-text id outside the model's embedding.

  python scripts/gpu/small_vocab_tokenizer.py --source .gpu/tokenizers/llama3 --vocab-size 32000 --out DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def cut(tokenizer: dict, vocab_size: int) -> dict:
    """`tokenizer` (tokenizer.json's content) with ids below `vocab_size` only."""
    model = tokenizer["model"]
    if model["type"] != "BPE":
        raise SystemExit(f"only BPE tokenizers can be cut, this one is {model['type']}")
    vocab = {token: i for token, i in model["vocab"].items() if i < vocab_size}
    if len(vocab) != vocab_size or set(vocab.values()) != set(range(vocab_size)):
        raise SystemExit(f"the source's first {vocab_size} ids are not a contiguous vocabulary")

    def kept(merge) -> bool:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        return left in vocab and right in vocab and left + right in vocab

    out = dict(tokenizer)
    out["model"] = {**model, "vocab": vocab, "merges": [m for m in model["merges"] if kept(m)]}
    out["added_tokens"] = [t for t in tokenizer.get("added_tokens", []) if t["id"] < vocab_size]
    out["post_processor"] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="a folder with tokenizer.json")
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    source = json.loads((args.source / "tokenizer.json").read_text())
    (args.out / "tokenizer.json").write_text(json.dumps(cut(source, args.vocab_size), ensure_ascii=False))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768,
              "clean_up_tokenization_spaces": False}
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    if (args.source / "LICENSE").exists():
        (args.out / "LICENSE").write_bytes((args.source / "LICENSE").read_bytes())


if __name__ == "__main__":
    main()
