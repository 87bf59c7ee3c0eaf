"""vLLM's sampling and structured-output request fields through the official openai SDK, live (one
server on the eager tiny-llama artifact): penalties, logit_bias, min_tokens, bad_words change the
output as vLLM's do."""
from __future__ import annotations

import openai
import pytest
from test_server_compat import client, model_name, post, root, server  # noqa: F401 (fixtures)

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def tokens_of(root):
    return lambda text: post(root, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]


def test_penalties_change_greedy_output(client, model_name):
    plain = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    for fields in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"extra_body": {"repetition_penalty": 3.0}}):
        extra = {"ignore_eos": True, **fields.pop("extra_body", {})}
        penalized = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0,
                                              extra_body=extra, **fields).choices[0].text
        assert penalized != plain, fields


def test_logit_bias_forces_a_token_in_chat(client, model_name, tokens_of):
    forced = tokens_of(" fox")[-1]
    reply = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=1.0, seed=3, logit_bias={str(forced): 100},
                                           extra_body={"ignore_eos": True})
    assert tokens_of(reply.choices[0].message.content) == tokens_of(" fox" * 4)


def test_min_tokens_delays_eos(client, model_name, tokens_of):
    eos_text = "<|im_end|>"
    eos = tokens_of(eos_text)[-1]
    for min_tokens, count in ((0, 1), (6, 7)):
        out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20, temperature=0,
                                        logit_bias={str(eos): 100}, extra_body={"min_tokens": min_tokens})
        assert out.usage.completion_tokens == count and out.choices[0].finish_reason == "stop"


def test_bad_words_are_never_completed(client, model_name, tokens_of):
    """"Hello" (one token) biased up is all the model says; banned as a word it never appears, banned
    twice over ("HelloHello": two tokens, whose steps run synchronously) it never appears twice in a row."""
    [hello] = tokens_of("Hello")
    ask = dict(model=model_name, prompt=PROMPT, max_tokens=12, temperature=0, logit_bias={str(hello): 50})
    assert client.completions.create(**ask, extra_body={"ignore_eos": True}).choices[0].text == "Hello" * 12
    for words, ok in ((["Hello"], lambda ids: hello not in ids),
                      (["HelloHello"], lambda ids: hello in ids and [hello, hello] not in [ids[i:i + 2] for i in
                                                                                        range(len(ids))])):
        out = client.completions.create(**ask, logprobs=0, extra_body={"ignore_eos": True, "bad_words": words})
        ids = [tokens_of(token)[0] if tokens_of(token) else None for token in out.choices[0].logprobs.tokens]
        assert ok(ids), (words, out.choices[0].text)
