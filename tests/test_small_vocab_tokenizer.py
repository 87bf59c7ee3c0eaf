"""scripts/gpu/small_vocab_tokenizer.py: a byte-level BPE tokenizer cut to a model's smaller vocabulary (Mixtral's
random-weight runs) encodes and decodes text with ids below the cut only, and refuses what it cannot cut."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from factories import make_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))
from small_vocab_tokenizer import cut  # noqa: E402

TEXT = "Hello world, the capital of France is Paris. Ünïcödé and 日本語 too."


def test_the_cut_tokenizer_round_trips_text_with_ids_below_the_cut(tmp_path):
    from transformers import PreTrainedTokenizerFast
    make_tokenizer(tmp_path / "source")
    source = json.loads((tmp_path / "source" / "tokenizer.json").read_text())
    whole = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "source" / "tokenizer.json"))
    (tmp_path / "cut.json").write_text(json.dumps(cut(source, 300)))
    small = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "cut.json"))
    ids = small.encode(TEXT, add_special_tokens=False)
    assert len(small) == 300 and max(ids) < 300 and small.decode(ids) == TEXT
    assert len(ids) >= len(whole.encode(TEXT, add_special_tokens=False))     # fewer merges: as many tokens or more


def test_a_vocabulary_that_is_not_contiguous_below_the_cut_is_refused():
    tokenizer = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 2}, "merges": []}, "added_tokens": []}
    with pytest.raises(SystemExit, match="not a contiguous vocabulary"):
        cut(tokenizer, 2)
    with pytest.raises(SystemExit, match="only BPE"):
        cut({"model": {"type": "Unigram"}}, 2)
