"""Server pieces that need no live server: request parsing and refusals, logprob formats, error
shapes, the body size limit, the bounded output buffer, health routes, options."""
from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.server.lifecycle.guards import BodySizeLimit
from atom_aot.server.protocol.errors import install_error_handlers
from atom_aot.server.protocol.requests import NOT_IMPLEMENTED, ChatCompletionRequest, CompletionRequest, normalize_prompt
from atom_aot.server.serving.logprobs import TokenRenderer, chat_logprobs, completion_logprobs


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    return load_tokenizer(tiny_llama_dir)


class TestNormalizePrompt:
    @pytest.mark.parametrize("prompt, expected", [
        ("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2, 3], [[1, 2, 3]]), ([[1], [2, 3]], [[1], [2, 3]])])
    def test_the_four_forms(self, prompt, expected):
        assert normalize_prompt(prompt) == expected

    @pytest.mark.parametrize("prompt", [[], 5, None, [1, "a"], [[1], []], [True, 2], {"a": 1}])
    def test_other_shapes_are_refused(self, prompt):
        with pytest.raises(ValueError, match="prompt must be"):
            normalize_prompt(prompt)

    def test_negative_token_ids_say_so(self):
        with pytest.raises(ValueError, match="non-negative"):
            normalize_prompt([1, -2])


class TestRequestModels:
    def test_completion_defaults(self):
        req = CompletionRequest.model_validate({"model": "m", "prompt": "hi"})
        assert req.prompt == ["hi"] and req.n == 1 and req.max_tokens is None and req.stop_strings == []

    def test_echo_allows_max_tokens_zero(self):
        assert CompletionRequest.model_validate({"model": "m", "prompt": [1, 2], "echo": True, "max_tokens": 0})
        with pytest.raises(ValidationError, match="echo"):
            CompletionRequest.model_validate({"model": "m", "prompt": [1, 2], "max_tokens": 0})

    def test_chat_takes_text_parts_and_max_completion_tokens(self):
        req = ChatCompletionRequest.model_validate({
            "model": "m", "max_tokens": 9, "max_completion_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
        assert req.messages[0].as_template_input() == {"role": "user", "content": "ab"}
        assert req.requested_max_tokens == 4

    def test_strict_types(self):
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                  "temperature": "0.5"})

    @pytest.mark.parametrize("field, value, code", [
        ("user_tag", 1, "unknown_parameter"), ("use_beam_search", True, "unsupported_parameter"),
        ("structural_tag", {"type": "structural_tag"}, "unsupported_parameter"), ("best_of", 2, "unsupported_parameter"),
        ("suffix", "the end", "unsupported_parameter"), ("prediction", {"type": "content"}, "unsupported_parameter"),
    ])
    def test_fields_not_taken_are_refused_by_name(self, field, value, code):
        with pytest.raises(ValidationError) as info:
            CompletionRequest.model_validate({"model": "m", "prompt": "x", field: value})
        [error] = info.value.errors()
        assert error["type"] == "unsupported_field" and error["ctx"]["field"] == field and error["ctx"]["code"] == code
        assert field in error["ctx"]["message"]

    @pytest.mark.parametrize("field, value", [("use_beam_search", False), ("modalities", ["text"]),
                                              ("tools", None), ("tools", []), ("best_of", 1), ("suffix", "")])
    def test_values_that_ask_for_nothing_are_accepted(self, field, value):
        assert CompletionRequest.model_validate({"model": "m", "prompt": "x", field: value}).prompt == ["x"]

    def test_every_row_of_the_not_implemented_table_is_refused_when_it_asks_for_something(self):
        for field in NOT_IMPLEMENTED:
            with pytest.raises(ValidationError, match=field):
                ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                      field: {"something": True}})

    @pytest.mark.parametrize("body", [
        {"prompt": "a\ud800"}, {"prompt": ["ok", "\udfff"]}, {"prompt": "x", "stop": ["\ud83d"]},
        {"prompt": "x", "user": "\udc00"}])
    def test_lone_surrogates_are_refused(self, body):
        with pytest.raises(ValidationError, match="not valid Unicode"):
            CompletionRequest.model_validate({"model": "m", **body})


class TestLogprobFormats:
    def test_bytes_of_split_characters_join_to_the_text(self, tokenizer):
        renderer = TokenRenderer(tokenizer)
        text = "日本語 🙂"
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert b"".join(renderer.bytes(i) for i in ids) == text.encode()

    def test_chat_format(self, tokenizer):
        renderer = TokenRenderer(tokenizer)
        [a, b] = tokenizer("Hello world", add_special_tokens=False).input_ids[:2]
        out = chat_logprobs(renderer, [TokenLogprobs(a, -0.5, 1, [(a, -0.5), (b, -2.0)])])
        entry = out["content"][0]
        assert entry["token"] == renderer.text(a) and entry["logprob"] == -0.5
        assert [t["logprob"] for t in entry["top_logprobs"]] == [-0.5, -2.0]
        assert bytes(entry["bytes"]) == renderer.bytes(a)

    def test_completion_format_with_an_unscored_first_token(self, tokenizer):
        renderer = TokenRenderer(tokenizer)
        ids = tokenizer("Hello world", add_special_tokens=False).input_ids
        entries = [None] + [TokenLogprobs(t, -1.0, 3, [(ids[0], -0.1)]) for t in ids[1:]]
        out, end = completion_logprobs(renderer, ids, entries, offset=0)
        assert out["token_logprobs"][0] is None and out["top_logprobs"][0] is None
        assert out["token_logprobs"][1:] == [-1.0] * (len(ids) - 1)
        assert renderer.text(ids[1]) in out["top_logprobs"][1]          # the chosen token is always listed
        assert out["text_offset"][0] == 0 and end == len("".join(out["tokens"]))


def _echo_app(max_bytes: int = 1 << 20) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_bytes)

    @app.post("/echo")
    async def echo(body: dict):
        return body

    @app.post("/chat")
    async def chat(body: ChatCompletionRequest):
        return {}

    @app.get("/boom")
    async def boom():
        raise RuntimeError("bug")

    return TestClient(app, raise_server_exceptions=False)


class TestGuardsAndErrors:
    def test_body_limit(self):
        client = _echo_app(1024)
        assert client.post("/echo", json={"a": "x" * 100}).status_code == 200
        big = client.post("/echo", json={"a": "x" * 2000})
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

    def test_chunked_body_over_the_limit(self):
        client = _echo_app(1024)
        chunks = (b'{"a": "' + b"x" * 600 + b'"}' if i == 0 else b" " * 600 for i in range(2))
        response = client.post("/echo", content=chunks, headers={"Content-Type": "application/json"})
        assert response.status_code == 413

    def test_unexpected_errors_are_500_in_openai_shape(self):
        response = _echo_app(1024).get("/boom")
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "server_error"


class TestValidationMessages:
    MESSAGES = [{"role": "user", "content": "hi"}]

    @pytest.mark.parametrize("change, param, words", [
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "string or a list of text parts"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content",
         "only text content parts"),
        ({"stop": [1]}, "stop", "string or a list of strings"),
        ({"top_logprobs": 2}, "top_logprobs", "logprobs=true"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
        ({"temperature": "hot"}, "temperature", "got 'hot'"),
    ])
    def test_param_and_message(self, change, param, words):
        body = {"model": "m", "messages": self.MESSAGES, **change}
        error = _echo_app().post("/chat", json=body).json()["error"]
        assert error["param"] == param and words in error["message"]

    @pytest.mark.parametrize("content, param", [
        ("\ud800", "messages.0.content"), ([{"type": "text", "text": "ok\ud800"}], "messages.0.content.0.text")])
    def test_a_surrogate_in_chat_content_names_where(self, content, param):
        body = {"model": "m", "messages": [{"role": "user", "content": content}]}
        error = _echo_app().post("/chat", content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert error.status_code == 400
        assert error.json()["error"]["param"] == param and "not valid Unicode" in error.json()["error"]["message"]

    def test_an_unknown_nested_field_names_its_path(self):
        body = {"model": "m", "messages": [{"role": "user", "content": "x", "audio": {"id": "1"}}]}
        error = _echo_app().post("/chat", json=body).json()["error"]
        assert (error["param"], error["code"]) == ("messages.0.audio", "unsupported_parameter")

    def test_a_body_that_is_not_json_typed(self):
        response = _echo_app().post("/chat", content=b'{"model": "m"}', headers={"Content-Type": "text/plain"})
        assert response.status_code == 400 and "Content-Type: application/json" in response.json()["error"]["message"]
