"""The runtime loads tokenizers as FastTokenizer straight from tokenizer.json (no transformers import);
it must behave exactly as AutoTokenizer on the same folder, down to the order of the special ids.
tests/test_fast_tokenizer.py checks the whole surface on more tokenizers."""
import pytest
from transformers import AutoTokenizer

from atom_aot.runtime.text.tokenizer import load_tokenizer
from factories import make_tokenizer
from test_fast_tokenizer import smollm2_tokenizer_dir

TEXTS = ["Hello world", "  leading spaces\tand tabs\n\nnewlines", "émojis 🤖, 中文 and Ünïcödé",
         "<|im_start|>user\nhi<|im_end|>", "The   quick brown fox's dog, isn't it?", "a" * 50]


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def tokenizer_dir(request, tmp_path_factory):
    """A tokenizer folder as atom-build writes it into an artifact (for SmolLM2: from its GGUF)."""
    if request.param == "smollm2":
        return smollm2_tokenizer_dir(request, tmp_path_factory)
    out = tmp_path_factory.mktemp("tok")
    make_tokenizer(out)
    return out


def test_matches_auto_tokenizer(tokenizer_dir):
    ours, auto = load_tokenizer(tokenizer_dir), AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for text in TEXTS:
        for special in (True, False):
            assert ours(text, add_special_tokens=special).input_ids == auto(text, add_special_tokens=special).input_ids
        ids = auto(text).input_ids
        assert ours.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id", "all_special_ids", "chat_template"):
        assert getattr(ours, attr) == getattr(auto, attr), attr
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
