"""The request fields OpenAI clients send for bookkeeping and the ones vLLM users rely on, each
checked for its effect: over plain HTTP and through the openai SDK (extra_body), against the
front end with a scripted engine, so that every output is known in advance."""
from __future__ import annotations

import asyncio
import json

import openai
import pytest
from fastapi.testclient import TestClient
from test_server_flow import FakeClient, tokenizer  # noqa: F401 (tokenizer: a fixture)

from atom_aot.runtime.outputs import CoreOutput, TokenLogprobs
from atom_aot.runtime.processes.messages import Added, EngineInfo
from atom_aot.server.app import build_app
from atom_aot.server.lifecycle.metrics import ServerMetrics
from atom_aot.server.options import ServerOptions
from atom_aot.server.serving.async_engine import AsyncEngine
from atom_aot.server.state import ServerState

ANSWER = "Hello world! How are you today?"
MAX_MODEL_LEN = 256


class ScriptedClient(FakeClient):
    """Answers every request it is sent with `script`, one token per output, the last finishing it;
    keeps each request as the engine would have received it."""

    def __init__(self, script: list[int]):
        super().__init__()
        self.script = script
        self.requests = []

    async def call(self, request, timeout=None):
        self.requests += request.requests
        for new in request.requests:
            asyncio.get_running_loop().call_soon(self._answer, new)
        return Added(len(request.requests))

    def _answer(self, new) -> None:
        for i, token in enumerate(self.script):
            last = i == len(self.script) - 1
            logprobs = [TokenLogprobs(token, -0.5, 1, [(token, -0.5)])] if new.params.logprobs is not None else []
            self.emit([CoreOutput(new.request_id, [token], finish_reason="length" if last else None,
                                  logprobs=logprobs, num_prompt_tokens=len(new.prompt_token_ids))])


def serve(tokenizer, script: list[int], **options) -> tuple[TestClient, ScriptedClient]:
    client = ScriptedClient(script)
    info = EngineInfo(max_model_len=MAX_MODEL_LEN, vocab_size=len(tokenizer), block_size=16, num_kv_blocks=64,
                      execution="eager", build_key="k")
    state = ServerState(engine=AsyncEngine(client, tokenizer), tokenizer=tokenizer, info=info, model_name="m",
                        metrics=ServerMetrics(), options=ServerOptions(**options))
    return TestClient(build_app(state)), client


@pytest.fixture(scope="module")
def http(tokenizer):
    return serve(tokenizer, tokenizer(ANSWER, add_special_tokens=False).input_ids)


@pytest.fixture(scope="module")
def sdk(http) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http[0], max_retries=0)


def chat(http, **fields) -> dict:
    response = http[0].post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], **fields})
    assert response.status_code == 200, response.text
    return response.json()


def refused(http, path: str, body: dict) -> dict:
    response = http[0].post(path, json=body)
    assert response.status_code == 400, response.text
    return response.json()["error"]


def streamed_text(response) -> str:
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return "".join(c["delta"].get("content") or "" if "delta" in c else c["text"] for e in events for c in e["choices"])


# -- OpenAI's bookkeeping fields ---------------------------------------------------------------
def test_bookkeeping_fields_are_accepted_and_change_nothing(sdk):
    fields = {"store": False, "metadata": {"team": "eval"}, "service_tier": "auto", "user": "u-1",
              "prompt_cache_key": "k", "safety_identifier": "s-1", "verbosity": "medium"}
    plain = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    tagged = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], **fields)
    assert tagged.choices[0].message.content == plain.choices[0].message.content == ANSWER
    assert sdk.completions.create(model="m", prompt="Hi", extra_body=fields).choices[0].text == ANSWER


@pytest.mark.parametrize("field, value", [("store", True), ("service_tier", "flex"), ("service_tier", "priority"),
                                          ("verbosity", "low")])
def test_bookkeeping_values_that_ask_for_what_is_not_here_are_refused_by_name(http, field, value):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Hi"})):
        error = refused(http, path, {**body, field: value})
        assert error["param"] == field and error["code"] == "unsupported_parameter" and field in error["message"]


def test_metadata_is_held_to_openais_limits(http):
    error = refused(http, "/v1/completions", {"prompt": "Hi", "metadata": {str(i): "v" for i in range(17)}})
    assert error["param"] == "metadata" and "16" in error["message"]


# -- the output text -----------------------------------------------------------------------------
def test_include_stop_str_in_output_keeps_the_stop_string(http, sdk):
    for include, text in ((False, "Hello "), (True, "Hello world")):
        body = {"prompt": "Hi", "stop": ["world"], "include_stop_str_in_output": include}
        choice = http[0].post("/v1/completions", json=body).json()["choices"][0]
        assert (choice["text"], choice["stop_reason"]) == (text, "world")        # vLLM's field: the stop string
        assert streamed_text(http[0].post("/v1/completions", json={**body, "stream": True})) == text
    answer = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], stop=["How"],
                                         extra_body={"include_stop_str_in_output": True})
    assert answer.choices[0].message.content == "Hello world! How" and answer.choices[0].finish_reason == "stop"


def test_skip_special_tokens_false_spells_them(tokenizer):
    hello, world = (tokenizer(t, add_special_tokens=False).input_ids for t in ("Hello", " world"))
    http, _ = serve(tokenizer, [*hello, tokenizer.convert_tokens_to_ids("<|im_start|>"), *world])
    for skip, text in ((True, "Hello world"), (False, "Hello<|im_start|> world")):
        body = {"prompt": "Hi", "skip_special_tokens": skip}
        assert http.post("/v1/completions", json=body).json()["choices"][0]["text"] == text
        assert streamed_text(http.post("/v1/completions", json={**body, "stream": True})) == text


def test_return_tokens_as_token_ids_names_tokens_by_id(http, sdk, tokenizer):
    ids = tokenizer(ANSWER, add_special_tokens=False).input_ids
    answer = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], logprobs=True,
                                         top_logprobs=1, extra_body={"return_tokens_as_token_ids": True})
    assert [e.token for e in answer.choices[0].logprobs.content] == [f"token_id:{i}" for i in ids]
    assert answer.choices[0].logprobs.content[0].bytes == list(f"token_id:{ids[0]}".encode())
    body = {"prompt": "Hi", "logprobs": 1, "return_tokens_as_token_ids": True}
    shown = http[0].post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert shown["tokens"] == [f"token_id:{i}" for i in ids] and set(shown["top_logprobs"][0]) == {f"token_id:{ids[0]}"}


# -- the prompt ---------------------------------------------------------------------------------
def test_truncate_prompt_tokens_keeps_the_last_k(http, tokenizer):
    prompt = "The quick brown fox jumps over the lazy dog."
    ids = tokenizer(prompt).input_ids
    body = http[0].post("/v1/completions", json={"prompt": prompt, "truncate_prompt_tokens": 3}).json()
    assert body["usage"]["prompt_tokens"] == 3 and http[1].requests[-1].prompt_token_ids == ids[-3:]
    assert chat(http, truncate_prompt_tokens=4)["usage"]["prompt_tokens"] == 4
    whole = http[0].post("/v1/completions", json={"prompt": prompt, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == len(ids)
    for value, says in ((MAX_MODEL_LEN + 1, "context length"), (0, ">= 1")):
        error = refused(http, "/v1/completions", {"prompt": prompt, "truncate_prompt_tokens": value})
        assert error["param"] == "truncate_prompt_tokens" and says in error["message"]


def test_add_special_tokens(tmp_path):
    from factories import make_tokenizer
    from tokenizers.processors import TemplateProcessing

    from atom_aot.runtime.text.tokenizer import load_tokenizer
    fast = make_tokenizer(tmp_path)
    bos = fast.convert_tokens_to_ids("<|endoftext|>")
    fast.backend_tokenizer.post_processor = TemplateProcessing(single="<|endoftext|> $A",
                                                               special_tokens=[("<|endoftext|>", bos)])
    fast.save_pretrained(str(tmp_path))
    with_bos = load_tokenizer(tmp_path)
    http, engine = serve(with_bos, with_bos("Hello", add_special_tokens=False).input_ids)
    plain = with_bos("Hi", add_special_tokens=False).input_ids
    for add, first in ((None, [bos]), (True, [bos]), (False, [])):
        http.post("/v1/completions", json={"prompt": "Hi", **({} if add is None else {"add_special_tokens": add})})
        assert engine.requests[-1].prompt_token_ids == first + plain
    template = with_bos.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                            add_generation_prompt=True)
    for add, first in ((None, []), (True, [bos])):
        http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                **({} if add is None else {"add_special_tokens": add})})
        assert engine.requests[-1].prompt_token_ids == first + with_bos(template, add_special_tokens=False).input_ids


# -- chat rendering -----------------------------------------------------------------------------
CONTINUED = [{"role": "user", "content": "Say hello"}, {"role": "assistant", "content": "Sure: "}]


def test_continue_final_message_leaves_the_last_message_open(http, tokenizer):
    chat(http, messages=CONTINUED, add_generation_prompt=False, continue_final_message=True)
    prompt = tokenizer.decode(http[1].requests[-1].prompt_token_ids)
    assert prompt.endswith("<|im_start|>assistant\nSure: ") and prompt.count("<|im_end|>") == 1
    error = refused(http, "/v1/chat/completions", {"messages": CONTINUED, "continue_final_message": True})
    assert "add_generation_prompt" in error["message"]


def test_continue_final_message_renders_as_transformers_does(tmp_path):
    from factories import make_tokenizer

    from atom_aot.runtime.text.tokenizer import load_tokenizer
    theirs = make_tokenizer(tmp_path)
    ours = load_tokenizer(tmp_path)
    for messages in (CONTINUED, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "  y  "}]):
        expected = theirs.apply_chat_template(messages, tokenize=False, continue_final_message=True)
        assert ours.apply_chat_template(messages, tokenize=False, continue_final_message=True) == expected
        assert expected.endswith(messages[-1]["content"].lstrip())


def test_chat_echo_starts_the_answer_with_the_last_message(http, sdk):
    fields = {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
    assert chat(http, messages=CONTINUED, **fields)["choices"][0]["message"]["content"] == "Sure: " + ANSWER
    stream = http[0].post("/v1/chat/completions", json={"messages": CONTINUED, "stream": True, **fields})
    assert streamed_text(stream) == "Sure: " + ANSWER
    user_last = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                            extra_body={"echo": True})
    assert user_last.choices[0].message.content == ANSWER      # the last message is not the answer's role


def test_a_request_chat_template_needs_the_operators_trust(http, tokenizer):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    error = refused(http, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                    "chat_template": template})
    assert error["param"] == "chat_template" and "--trust-request-chat-template" in error["message"]
    trusting, engine = serve(tokenizer, [5], trust_request_chat_template=True)
    trusting.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                "chat_template": template})
    assert engine.requests[-1].prompt_token_ids == tokenizer("[user] Hi\n", add_special_tokens=False).input_ids


def test_tokenize_renders_messages_as_chat_does(tokenizer):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    http, engine = serve(tokenizer, [5], trust_request_chat_template=True)
    for fields in ({"add_generation_prompt": False, "continue_final_message": True}, {"chat_template": template}):
        http.post("/v1/chat/completions", json={"messages": CONTINUED, "max_tokens": 1, **fields})
        counted = http.post("/tokenize", json={"messages": CONTINUED, **fields}).json()
        assert counted["tokens"] == engine.requests[-1].prompt_token_ids
    strict, _ = serve(tokenizer, [5])
    refusal = strict.post("/tokenize", json={"messages": CONTINUED, "chat_template": template})
    assert refusal.status_code == 400 and refusal.json()["error"]["param"] == "chat_template"


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/chat/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"allowed_token_ids": [0, 10 ** 6]}, "allowed_token_ids"),
    ("/v1/completions", {"allowed_token_ids": []}, "allowed_token_ids"),
    ("/v1/completions", {"cache_salt": ""}, "cache_salt"),
])
def test_field_values_that_cannot_be_served_are_refused(http, path, fields, param):
    body = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    error = refused(http, path, {**body, **fields})
    assert param in (error["param"] or "") + error["message"]


def test_spaces_between_special_tokens_takes_both_values(http):
    for value in (True, False):
        body = {"prompt": "Hi", "spaces_between_special_tokens": value}
        assert http[0].post("/v1/completions", json=body).json()["choices"][0]["text"] == ANSWER


def test_priority_reaches_the_engine(http):
    chat(http, priority=7)
    assert http[1].requests[-1].params.priority == 7
    http[0].post("/v1/completions", json={"prompt": "Hi"})
    assert http[1].requests[-1].params.priority == 0
