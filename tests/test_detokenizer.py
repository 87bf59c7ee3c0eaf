"""Incremental detokenization: the byte kind (byte-level BPE tokenizers) against the tokenizer's own
decoding, token by token and over random streams that cut characters and hold special tokens; the
window kind for tokenizers whose text is not their tokens' bytes joined."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from factories import SPECIAL, make_tokenizer

from atom_aot.runtime.text.detokenizer import BytePieces, ByteStream, Detokenizer, WindowStream
from atom_aot.runtime.text.tokenizer import load_tokenizer

REAL_TOKENIZERS = ("qwen3", "llama3")         # shipped under tests/data/tokenizers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer(folder)
    return load_tokenizer(folder)


@pytest.fixture(scope="module", params=REAL_TOKENIZERS)
def real_tokenizer(request, shipped_folder):
    return load_tokenizer(shipped_folder(f"tokenizers/{request.param}"))


def token_ids_of(tokenizer) -> range:
    return range(tokenizer.backend.get_vocab_size(with_added_tokens=True))


def random_streams(tokenizer, count: int, seed: int) -> list[list[int]]:
    """Streams of any tokens, one in ten a special or added token."""
    rng = random.Random(seed)
    vocab, added = token_ids_of(tokenizer), list(tokenizer.backend.get_added_tokens_decoder())
    return [[rng.choice(added) if rng.random() < 0.1 else rng.choice(vocab) for _ in range(rng.randint(1, 16))]
            for _ in range(count)]


def streamed(stream, token_ids: list[int]) -> list[str]:
    return [stream.add([t]) for t in token_ids]


class TestBytePieces:
    @pytest.mark.parametrize("skip", [True, False])
    def test_every_token_of_the_test_tokenizer_reads_as_the_tokenizer_decodes_it(self, tiny, skip):
        pieces = BytePieces.of(tiny, skip_special_tokens=skip)
        for token_id in token_ids_of(tiny):
            assert pieces.bytes(token_id).decode(errors="replace") == tiny.decode([token_id], skip_special_tokens=skip)

    def test_tokens_of_real_vocabularies(self, real_tokenizer):
        tokenizer = real_tokenizer
        pieces = BytePieces.of(tokenizer, skip_special_tokens=True)
        added = list(tokenizer.backend.get_added_tokens_decoder())
        for token_id in random.Random(0).sample(token_ids_of(tokenizer), 3000) + added:
            decoded = tokenizer.decode([token_id], skip_special_tokens=True)
            assert pieces.bytes(token_id).decode(errors="replace") == decoded

    def test_only_for_byte_level_tokenizers_that_do_not_clean_up_spaces(self, tiny, tmp_path):
        assert BytePieces.of(tiny, True) is not None
        tiny.clean_up_tokenization_spaces = True
        try:
            assert BytePieces.of(tiny, True) is None
        finally:
            tiny.clean_up_tokenization_spaces = False
        assert BytePieces.of(metaspace_tokenizer(tmp_path), True) is None


class TestByteStream:
    def test_random_streams_read_as_the_tokenizer_decodes_them(self, tiny):
        pieces = BytePieces.of(tiny, skip_special_tokens=True)
        for ids in random_streams(tiny, 2000, seed=1):
            text = "".join(streamed(ByteStream(pieces), ids))
            whole = tiny.decode(ids, skip_special_tokens=True)
            assert whole.startswith(text), ids
            if not whole.endswith("\ufffd"):
                assert text == whole, ids

    def test_a_cut_character_waits_for_its_last_byte(self, tiny):
        ids = tiny("日本語 🙂", add_special_tokens=False).input_ids
        deltas = streamed(Detokenizer(tiny).stream([]), ids)
        assert "".join(deltas) == "日本語 🙂" and "" in deltas          # some token ended mid-character
        assert not any("\ufffd" in d for d in deltas)

    def test_special_tokens_are_skipped(self, tiny):
        end = tiny.convert_tokens_to_ids(SPECIAL[2])
        ids = tiny("Hello", add_special_tokens=False).input_ids + [end]
        assert "".join(streamed(Detokenizer(tiny).stream([]), ids)) == "Hello"

    def test_real_text(self, real_tokenizer):
        tokenizer = real_tokenizer
        text = "The quick brown fox — ünïcödé, 日本語の文章, emojis 🙂🚀 and Ελληνικά.\n  def f(x):\n\treturn x"
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert "".join(streamed(Detokenizer(tokenizer).stream([]), ids)) == text


def metaspace_tokenizer(folder: Path):
    """A SentencePiece-style tokenizer ("▁" for spaces, dropped at the start of a decoding)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from factories import CORPUS
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(str(folder))
    return load_tokenizer(folder)


class TestWindowStream:
    def test_other_tokenizers_render_the_leading_space_of_each_token(self, tmp_path):
        tokenizer = metaspace_tokenizer(tmp_path)
        prompt = tokenizer("Hello world!", add_special_tokens=False).input_ids
        output = tokenizer(" How are you today?", add_special_tokens=False).input_ids
        stream = Detokenizer(tokenizer).stream(prompt)
        assert isinstance(stream, WindowStream)
        deltas = streamed(stream, output)
        assert "".join(deltas) == " How are you today?"
        assert deltas[0].startswith(" ")                 # decoding the first token alone would drop it
