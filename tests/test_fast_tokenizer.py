"""FastTokenizer (tokenizer.json through the `tokenizers` package) must behave exactly as
transformers' AutoTokenizer on the same folder, for every part of the surface the engine, server,
examples and benchmarks use, and must load without importing transformers."""
from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from atom_aot.runtime.text.fast_tokenizer import FastTokenizer
from atom_aot.runtime.text.tokenizer import load_tokenizer
from factories import make_tokenizer

REPO = Path(__file__).resolve().parents[1]
SEED = 20240611

TEXTS = ["Hello world", "", " ", "  leading spaces\tand tabs\n\nnewlines  ",
         "émojis 🤖👍🏽, 中文, 日本語 and Ünïcödé",
         "<|im_start|>user\nhi<|im_end|>\n", "<|begin_of_text|>x<|end_of_text|><|endoftext|>", " <|im_end|> ",
         "The   quick brown fox's dog, isn't it? I'm sure they've gone . , !", "a" * 50, "0123456789 3.14159 1e-9",
         "def f(x):\n\treturn x * 2  # ok\r\n", "Paged attention stores keys in blocks. " * 150]
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Hello! 🤖"}, {"role": "user", "content": "And  now?\n"}],
    [{"role": "user", "content": "Ünïcödé question"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "think", "tool_calls": None},
     {"role": "user", "content": "q2"}],
]


# -- the tokenizer folders ---------------------------------------------------------------------

def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _with_bos(out: Path) -> None:
    """BOS from tokenizer.json's post-processor; add_bos/eos_token in the config (transformers 5
    ignores them beside tokenizer.json); the template inline; extra special tokens, one new;
    clean-up asked for (skipped for BPE)."""
    make_tokenizer(out)
    template = (out / "chat_template.jinja").read_text(encoding="utf-8")
    (out / "chat_template.jinja").unlink()
    bos = {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}
    _edit_json(out / "tokenizer.json", lambda t: t.update(post_processor={
        "type": "TemplateProcessing", "special_tokens": {"<|endoftext|>": bos},
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}]}))
    _edit_json(out / "tokenizer_config.json", lambda c: c.update(
        add_bos_token=False, add_eos_token=True, chat_template=template, clean_up_tokenization_spaces=True,
        additional_special_tokens=["<|im_start|>", "<|tool|>"], tokenizer_class="PreTrainedTokenizerFast"))


def _legacy_map(out: Path) -> None:
    """No added_tokens_decoder, so special_tokens_map.json counts and overrides the config; a new
    unk token; a model-specific `image_token`; no post-processor; `<|im_start|>` not special."""
    make_tokenizer(out)

    def tokenizer_json(t):
        t["post_processor"] = None
        t["added_tokens"][1]["special"] = False
    _edit_json(out / "tokenizer.json", tokenizer_json)
    _edit_json(out / "tokenizer_config.json", lambda c: c.update(eos_token="<|endoftext|>", image_token="<|image|>"))
    _edit_json(out / "special_tokens_map.json", lambda m: m.update(
        eos_token={"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False,
                   "single_word": False}, unk_token="<unk>", additional_special_tokens=["<|im_start|>"]))


def _config_flags(out: Path) -> None:
    """The config's added_tokens_decoder disagrees with tokenizer.json: its flags win in transformers."""
    make_tokenizer(out)
    added = {str(t.pop("id")): t for t in json.loads((out / "tokenizer.json").read_text())["added_tokens"]}
    added["1"].update(special=False, lstrip=True)
    added["2"].update(special=False)          # the eos token: named, so special again
    _edit_json(out / "tokenizer_config.json", lambda c: c.update(added_tokens_decoder=added))


_SMOLLM2_DIRS: dict[str, Path] = {}


def smollm2_tokenizer_dir(request, tmp_path_factory) -> Path:
    """SmolLM2's tokenizer as atom-build writes it into an artifact (converted from the GGUF: ~10 s,
    so once per session; tests/test_tokenizer_loading.py uses it too)."""
    gguf = request.getfixturevalue("smollm2_gguf")
    if str(gguf) not in _SMOLLM2_DIRS:
        from atom_aot.build.gguf_reader import read_gguf
        out = tmp_path_factory.mktemp("smollm2-tokenizer")
        read_gguf(str(gguf)).save_tokenizer(str(out))
        _SMOLLM2_DIRS[str(gguf)] = out
    return _SMOLLM2_DIRS[str(gguf)]


MADE = {"tiny": make_tokenizer, "tiny-bos": _with_bos, "tiny-legacy-map": _legacy_map,
        "tiny-config-flags": _config_flags}


@pytest.fixture(scope="module", params=["qwen3", "llama3", "smollm2", *MADE])
def pair(request, tmp_path_factory) -> tuple[FastTokenizer, object]:
    """(ours, transformers') for one tokenizer folder."""
    name = request.param
    if name in ("qwen3", "llama3"):
        folder = request.getfixturevalue("shipped_folder")(f"tokenizers/{name}")
    elif name == "smollm2":
        folder = smollm2_tokenizer_dir(request, tmp_path_factory)
    else:
        folder = tmp_path_factory.mktemp(name)
        MADE[name](folder)
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))


def _random_ids(auto, count: int, seed: int) -> list[list[int]]:
    """Id lists over the whole vocabulary, added tokens included; every third carries special ids."""
    rng, special = random.Random(seed), list(auto.all_special_ids)
    lists = []
    for i in range(count):
        ids = [rng.randrange(len(auto)) for _ in range(rng.randrange(0, 40))]
        if i % 3 == 0:
            ids[rng.randrange(len(ids) + 1):0] = rng.sample(special, min(2, len(special)))
        lists.append(ids)
    return lists


# -- the surface ---------------------------------------------------------------------------------

class TestEncode:
    def test_matches(self, pair):
        ours, auto = pair
        texts = TEXTS + ["".join(auto.all_special_tokens), f"x {auto.eos_token} y"]
        for text in texts:
            for special in (True, False):
                assert ours(text, add_special_tokens=special).input_ids == \
                    auto(text, add_special_tokens=special).input_ids, (text[:60], special)
            assert ours(text)["input_ids"] == auto(text)["input_ids"]
            assert ours.encode(text) == auto.encode(text)


class TestDecode:
    def test_random_ids(self, pair):
        ours, auto = pair
        for ids in _random_ids(auto, 150, SEED):
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip), \
                    (ids, skip)

    def test_lone_tokens(self, pair):
        """The detokenizer and logprobs decode one token at a time."""
        ours, auto = pair
        for token_id in _random_ids(auto, 1, SEED + 1)[0] + list(auto.all_special_ids):
            assert ours.decode([token_id]) == auto.decode([token_id])
            assert ours.decode(token_id, skip_special_tokens=True) == auto.decode(token_id, skip_special_tokens=True)

    def test_round_trip(self, pair):
        ours, auto = pair
        for text in TEXTS:
            ids = auto(text).input_ids
            assert ours.decode(ids) == auto.decode(ids)


class TestVocabulary:
    def test_convert_ids_to_tokens(self, pair):
        ours, auto = pair
        for ids in _random_ids(auto, 50, SEED + 2):
            assert ours.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)
            assert ours.convert_ids_to_tokens(ids, skip_special_tokens=True) == \
                auto.convert_ids_to_tokens(ids, skip_special_tokens=True)
            assert [ours.convert_ids_to_tokens(i) for i in ids] == [auto.convert_ids_to_tokens(i) for i in ids]

    def test_convert_tokens_to_ids(self, pair):
        ours, auto = pair
        tokens = auto.all_special_tokens + auto.convert_ids_to_tokens([0, 1, auto.vocab_size - 1]) + ["not-a-token"]
        assert ours.convert_tokens_to_ids(tokens) == auto.convert_tokens_to_ids(tokens)

    def test_sizes(self, pair):
        ours, auto = pair
        assert (ours.vocab_size, len(ours)) == (auto.vocab_size, len(auto))


class TestSpecialTokens:
    def test_ids(self, pair):
        ours, auto = pair
        assert set(ours.all_special_ids) == set(auto.all_special_ids)
        assert set(ours.all_special_tokens) == set(auto.all_special_tokens)
        for role in ("bos", "eos", "pad", "unk"):
            assert getattr(ours, f"{role}_token") == getattr(auto, f"{role}_token"), role
            assert getattr(ours, f"{role}_token_id") == getattr(auto, f"{role}_token_id"), role
        assert ours.special_tokens_map == auto.special_tokens_map


class TestChatTemplate:
    def test_template_text(self, pair):
        ours, auto = pair
        assert ours.chat_template == auto.chat_template

    @pytest.mark.parametrize("add_generation_prompt", [True, False])
    def test_renders_alike(self, pair, add_generation_prompt):
        ours, auto = pair
        for messages in CONVERSATIONS:
            kwargs = dict(add_generation_prompt=add_generation_prompt)
            text = ours.apply_chat_template(messages, tokenize=False, **kwargs)
            assert text == auto.apply_chat_template(messages, tokenize=False, **kwargs)
            assert ours.apply_chat_template(messages, **kwargs)["input_ids"] == \
                auto.apply_chat_template(messages, **kwargs)["input_ids"]

    def test_template_errors_are_template_errors(self, pair):
        """The server answers 400 to jinja2.TemplateError and ValueError, as with transformers."""
        import jinja2
        ours, _ = pair
        with pytest.raises(jinja2.TemplateError, match="no system"):
            ours.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                     chat_template="{{ raise_exception('no system') }}")
        with pytest.raises(ValueError):
            ours.apply_chat_template([], tokenize=False)


# -- loading -----------------------------------------------------------------------------------

def test_loads_without_importing_transformers(tmp_path):
    make_tokenizer(tmp_path)
    code = ("import sys\nfrom atom_aot.runtime.text.tokenizer import load_tokenizer\n"
            f"tok = load_tokenizer({str(tmp_path)!r})\n"
            "tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False)\n"
            "tok.decode(tok('hi').input_ids)\n"
            "print(type(tok).__name__, sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["FastTokenizer", "[]"], out.stdout + out.stderr


def test_logs_which_loader_runs(tmp_path, caplog):
    """Without tokenizer.json (here: GPT-2 style vocab.json + merges.txt) AutoTokenizer still loads it."""
    fast_dir, legacy_dir = tmp_path / "fast", tmp_path / "legacy"
    tokenizer = make_tokenizer(fast_dir)
    legacy_dir.mkdir()
    tokenizer.backend_tokenizer.model.save(str(legacy_dir))
    _edit_json(legacy_dir / "tokenizer_config.json", lambda c: c.update(
        json.loads((fast_dir / "tokenizer_config.json").read_text()), tokenizer_class="GPT2Tokenizer"))
    with caplog.at_level(logging.DEBUG, logger="atom_aot"):
        fast, auto = load_tokenizer(fast_dir), load_tokenizer(legacy_dir)
    assert isinstance(fast, FastTokenizer) and not isinstance(auto, FastTokenizer)
    assert "tokenizers package" in caplog.text and "AutoTokenizer" in caplog.text
    assert auto("Hello world", add_special_tokens=False).input_ids == fast("Hello world").input_ids
