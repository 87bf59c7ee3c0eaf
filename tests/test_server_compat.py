"""Drop-in for vLLM/ATOM clients, live: one server per module (eager tiny-llama
artifact), driven by the official `openai` client as benchmark and eval tools drive it.

- chat streams send the role chunk with the first token, not before the prefill (TTFT);
- `model` may be left out; chat takes ATOM's `prompt` alias of `messages`;
- /tokenize, /detokenize, /tokenizer_info, /version in vLLM's shapes, behind the API key;
- `x-request-id` on every response, and in the completion ids.
"""
from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest
from factories import make_tokenizer
from fastapi.exceptions import RequestValidationError
from test_server_flow import engine_of, tokenizer  # noqa: F401 (tokenizer: a fixture)
from test_server_support import API_KEY, ServerProcess

from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.processes.messages import EngineInfo
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.text.tokenizer import load_tokenizer
from atom_aot.server.lifecycle.metrics import ServerMetrics
from atom_aot.server.lifecycle.request_ids import RequestId
from atom_aot.server.protocol.requests import ChatCompletionRequest, ChatMessage
from atom_aot.server.serving import chat as serving_chat
from atom_aot.server.serving.chat import render_messages
from atom_aot.server.serving.responses import envelope
from atom_aot.server.serving.tokenization import tokenize
from atom_aot.server.state import ServerState

USER = [{"role": "user", "content": "Tell me about paged attention"}]


@pytest.fixture(scope="module")
def server(tiny_llama_eager_artifact, tmp_path_factory):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("server"),
                         "--max-request-body-bytes", str(64 << 10))
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


def sdk(server, path: str = "") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}{path}", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return sdk(server, "/v1")


@pytest.fixture(scope="module")
def root(server) -> openai.OpenAI:
    """The SDK at the server's root, where vLLM has its tokenizer routes."""
    return sdk(server)


@pytest.fixture(scope="module")
def model_name(client) -> str:
    return client.models.list().data[0].id


def post(sdk: openai.OpenAI, path: str, body: dict) -> dict:
    return sdk.post(path, body=body, cast_to=object)


# -- 1. chat streaming: the first chunk with choices comes with the first token ---------------
def _long_messages(root: openai.OpenAI, budget: int) -> list[dict]:
    """One user message of about `budget` prompt tokens: a long prefill before the first token."""
    words = 1
    while post(root, "/tokenize", {"messages": [{"role": "user", "content": "block " * words * 2}]})["count"] < budget:
        words *= 2
    return [{"role": "user", "content": "block " * words}]


def test_chat_stream_first_chunk_waits_for_the_first_token(client, root, model_name):
    """Client-side time to the first chunk with choices is what benchmarks report as TTFT; it must
    not be shorter than the engine's own arrival-to-first-token time (`usage.ttft_s`)."""
    max_model_len = post(root, "/tokenize", {"prompt": "x"})["max_model_len"]
    messages = _long_messages(root, max_model_len // 2)
    for _ in range(3):
        start = time.perf_counter()
        stream = client.chat.completions.create(model=model_name, messages=messages, max_tokens=4, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        first_choice_s, chunks = None, []
        for chunk in stream:
            if chunk.choices and first_choice_s is None:
                first_choice_s = time.perf_counter() - start
            chunks.append(chunk)
        ttft_s = chunks[-1].usage.model_extra["ttft_s"]
        assert first_choice_s >= ttft_s > 0, (first_choice_s, ttft_s)
        assert chunks[0].choices[0].delta.role == "assistant"


def _state(engine, tokenizer) -> ServerState:
    """A server state on a fake engine (tests/test_server_flow.py), for in-process checks."""
    info = EngineInfo(max_model_len=64, vocab_size=100, block_size=16, num_kv_blocks=8, execution="eager",
                      build_key="k")
    return ServerState(engine=engine, tokenizer=tokenizer, info=info, model_name="m", metrics=ServerMetrics())


def test_role_chunks_go_out_with_the_first_engine_output(tokenizer):  # noqa: F811
    """Without a token, the stream yields nothing; the first output brings every choice's role
    chunk and its text in one write."""

    async def run():
        engine, fake = engine_of(tokenizer)
        state = _state(engine, tokenizer)
        req = ChatCompletionRequest.model_validate({"messages": USER, "stream": True, "n": 2})
        env = envelope(state, "chatcmpl", "chat.completion.chunk", RequestId("r", True))
        group = await engine.submit(["a", "b"], [[1, 2], [1, 2]], [SamplingParams(max_tokens=4)] * 2, 0.0)
        stream = serving_chat._stream(state, req, group, env, 2)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        waited = not first.done()
        fake.emit([CoreOutput("a", [5])])
        piece = await first
        first.cancel()
        await stream.aclose()
        return waited, piece

    waited, piece = asyncio.run(run())
    assert waited
    events = [line for line in piece.split("\n\n") if line]
    assert len(events) == 3 and all('"role": "assistant"' in e for e in events[:2])
    assert '"index": 0' in events[2] and '"role"' not in events[2]


# -- 2. model optional; chat's prompt alias ---------------------------------------------------
def test_model_may_be_left_out(server, client, model_name):
    body = {"prompt": "Hello world", "max_tokens": 4, "temperature": 0}
    named = client.completions.create(model=model_name, **body)
    unnamed = client.post("/completions", body=body, cast_to=openai.types.Completion)
    assert unnamed.choices[0].text == named.choices[0].text and unnamed.model == model_name
    chat = client.post("/chat/completions", body={"messages": USER, "max_tokens": 3},
                       cast_to=openai.types.chat.ChatCompletion)
    assert chat.model == model_name and chat.usage.completion_tokens <= 3
    with pytest.raises(openai.BadRequestError) as wrong:
        client.completions.create(model="gpt-9", **body)
    assert wrong.value.code == "model_not_found"


@pytest.mark.parametrize("prompt", ["Tell me about paged attention", USER])
def test_chat_prompt_alias(client, model_name, prompt):
    """ATOM takes `prompt` in chat requests: messages, or a string that is one user message."""
    whole = client.chat.completions.create(model=model_name, messages=USER, max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
    alias = client.post("/chat/completions", body={"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                   "ignore_eos": True}, cast_to=openai.types.chat.ChatCompletion)
    assert alias.choices[0].message.content == whole.choices[0].message.content
    assert alias.usage.prompt_tokens == whole.usage.prompt_tokens


@pytest.mark.parametrize("body, code, param", [
    ({"prompt": "hi", "messages": USER}, "invalid_value", "prompt"),
    ({"prompt": 5}, "invalid_value", "messages"),
    ({"prompt": "hi", "presence_penalty": 5}, "invalid_value", "presence_penalty"),
    ({"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "invalid_value", "tool_choice"),
    ({"model": "gpt-9", "prompt": "hi"}, "model_not_found", "model"),
])
def test_chat_prompt_alias_refusals(client, body, code, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.post("/chat/completions", body=body, cast_to=object)
    assert error.value.code == code and error.value.param == param, error.value.body


# -- 3. tokenizer routes, version, x-request-id ------------------------------------------------
def test_tokenize_counts_as_the_generation_endpoints_do(client, root, model_name):
    text = "Paged attention stores the KV cache in blocks"
    completion = client.completions.create(model=model_name, prompt=text, max_tokens=1)
    tokenized = post(root, "/tokenize", {"model": model_name, "prompt": text})
    assert set(tokenized) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tokenized["count"] == len(tokenized["tokens"]) == completion.usage.prompt_tokens
    assert tokenized["max_model_len"] > 0 and tokenized["token_strs"] is None
    chat = client.chat.completions.create(model=model_name, messages=USER, max_tokens=1)
    assert post(root, "/tokenize", {"messages": USER})["count"] == chat.usage.prompt_tokens
    with_strs = post(root, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert len(with_strs["token_strs"]) == with_strs["count"]
    plain = post(root, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert plain["count"] <= tokenized["count"]


TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t['function']['name'] }} {% endfor %}<|im_end|>\n"
                  "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tokenize_renders_tools_and_template_variables_as_chat_does(tmp_path):
    """vLLM's chat form of /tokenize takes tools (and chat_template_kwargs): the count must be what a chat
    completion with those tools sends to the model."""
    make_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    tokenizer.chat_template = TOOLS_TEMPLATE
    state = _state(None, tokenizer)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

    def count(body: dict) -> int:
        async def raw():
            return json.dumps(body).encode()
        return asyncio.run(tokenize(state, SimpleNamespace(body=raw, headers={})))["count"]
    with_tools = count({"messages": USER, "tools": tools})
    assert with_tools > count({"messages": USER})
    assert with_tools == len(tokenizer(render_messages(state, [ChatMessage.model_validate(m) for m in USER], True,
                                                       tools), add_special_tokens=False).input_ids)
    with pytest.raises(RequestValidationError, match="cannot be set here"):
        count({"messages": USER, "chat_template_kwargs": {"tools": []}})


def test_detokenize_inverts_tokenize(root):
    text = "Hello, world: blocks and pages"
    tokens = post(root, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    assert post(root, "/detokenize", {"tokens": tokens}) == {"prompt": text}


@pytest.mark.parametrize("path, body, code, param", [
    ("/tokenize", {"prompt": "hi", "model": "gpt-9"}, "model_not_found", "model"),
    ("/tokenize", {}, "missing_field", "prompt"),
    ("/tokenize", {"prompt": "hi", "messages": USER}, "invalid_value", "prompt"),
    ("/tokenize", {"messages": []}, "invalid_value", "messages"),
    ("/tokenize", {"prompt": "hi", "tools": [{"type": "function"}]}, "unsupported_parameter", "tools"),
    ("/tokenize", {"prompt": "hi", "color": 1}, "unknown_parameter", "color"),
    ("/tokenize", {"prompt": 5}, "invalid_value", "prompt"),
    ("/detokenize", {"tokens": [1, 10 ** 7]}, "invalid_value", "tokens"),
    ("/detokenize", {"tokens": [-1]}, "invalid_value", "tokens.0"),
    ("/detokenize", {}, "missing_field", "tokens"),
])
def test_tokenizer_route_refusals(root, path, body, code, param):
    with pytest.raises(openai.BadRequestError) as error:
        post(root, path, body)
    assert error.value.code == code and error.value.param == param, error.value.body


def test_tokenizer_info_and_version(root, server):
    info = root.get("/tokenizer_info", cast_to=object)
    assert isinstance(info["tokenizer_class"], str) and info["tokenizer_class"]
    assert info["eos_token"] and isinstance(info["eos_token"], str)
    assert isinstance(info["model_max_length"], int) and info["model_max_length"] > 0
    assert isinstance(info["chat_template"], str) and "messages" in info["chat_template"]
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & set(info)
    from atom_aot.version import __version__
    assert root.get("/version", cast_to=object) == {"version": __version__}


@pytest.mark.parametrize("method, path", [("POST", "/tokenize"), ("POST", "/detokenize"),
                                          ("GET", "/tokenizer_info"), ("GET", "/version")])
def test_new_routes_want_the_api_key(server, method, path):
    response = httpx.request(method, f"{server.url}{path}", json={"prompt": "x"} if method == "POST" else None,
                             headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_x_request_id_is_echoed_and_names_the_completion(client, model_name):
    raw = client.completions.with_raw_response.create(model=model_name, prompt="hi", max_tokens=2,
                                                      extra_headers={"x-request-id": "bench-42"})
    assert raw.headers["x-request-id"] == "bench-42" and raw.parse().id == "cmpl-bench-42"
    raw = client.chat.completions.with_raw_response.create(model=model_name, messages=USER, max_tokens=2,
                                                           extra_headers={"X-Request-Id": "chat-7"})
    assert raw.headers["x-request-id"] == "chat-7" and raw.parse().id == "chatcmpl-chat-7"
    generated = client.completions.with_raw_response.create(model=model_name, prompt="hi", max_tokens=2)
    rid = generated.headers["x-request-id"]
    assert len(rid) == 32 and generated.parse().id == f"cmpl-{rid}"


def test_x_request_id_on_streams_and_errors(server, client, model_name):
    with client.chat.completions.with_streaming_response.create(
            model=model_name, messages=USER, max_tokens=2, stream=True,
            extra_headers={"x-request-id": "stream-1"}) as response:
        assert response.headers["x-request-id"] == "stream-1"
        assert all(chunk.id == "chatcmpl-stream-1" for chunk in response.parse())
    for method, path, body, status in [("GET", "/v1/nope", None, 404), ("POST", "/v1/completions", {}, 400),
                                       ("POST", "/v1/completions", {"prompt": "x" * (70 << 10)}, 413),
                                       ("GET", "/health", None, 200)]:
        response = httpx.request(method, f"{server.url}{path}", json=body,
                                 headers={**server.headers, "x-request-id": f"e-{status}"})
        assert response.status_code == status and response.headers["x-request-id"] == f"e-{status}"
    unauthorized = httpx.get(f"{server.url}/v1/models", headers={"x-request-id": "no-key"})
    assert unauthorized.status_code == 401 and unauthorized.headers["x-request-id"] == "no-key"


def test_x_request_id_on_a_500(tokenizer):  # noqa: F811
    """A bug's 500 is sent by Starlette's outermost middleware, past ours: it carries the id too."""
    from fastapi.testclient import TestClient

    from atom_aot.server.app import build_app
    engine, _ = engine_of(tokenizer)
    app = build_app(_state(engine, tokenizer))

    async def broken():
        raise RuntimeError("a bug")
    app.add_api_route("/broken", broken)
    response = TestClient(app, raise_server_exceptions=False).get("/broken", headers={"x-request-id": "bug-1"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "bug-1"


@pytest.mark.parametrize("value", ["a" * 129, "has space", "tab\tin"])
def test_a_bad_x_request_id_is_refused(server, value):
    response = httpx.get(f"{server.url}/v1/models", headers={**server.headers, "x-request-id": value})
    assert response.status_code == 400 and response.json()["error"]["param"] == "x-request-id"
    assert response.headers["x-request-id"] != value


def test_one_x_request_id_on_concurrent_calls(client, model_name):
    """A client's id need not be unique: the engine's request ids are made unique behind it."""
    def ask(_):
        return client.completions.create(model=model_name, prompt="The quick brown", max_tokens=6, temperature=0,
                                         extra_headers={"x-request-id": "same"})
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(ask, range(8)))
    assert {o.id for o in outs} == {"cmpl-same"} and len({o.choices[0].text for o in outs}) == 1


# -- vLLM's engine-side request fields, live (the front-end ones: test_server_vllm_fields.py) -----
def test_allowed_token_ids_bound_every_sampled_token(client, model_name):
    allowed = [11, 42, 97]
    out = client.completions.create(model=model_name, prompt="The quick brown", max_tokens=12, temperature=1.0,
                                    logprobs=0, extra_body={"allowed_token_ids": allowed, "ignore_eos": True,
                                                            "return_tokens_as_token_ids": True})
    sampled = [int(token.removeprefix("token_id:")) for token in out.choices[0].logprobs.tokens]
    assert len(sampled) == 12 and set(sampled) <= set(allowed)


def test_cache_salt_isolates_prefix_cache_entries(client, model_name):
    prompt = "Salted prefix: " + " ".join(f"w{i}" for i in range(60))

    def cached(salt: str) -> int:
        out = client.completions.create(model=model_name, prompt=prompt, max_tokens=1, extra_body={"cache_salt": salt})
        return out.usage.prompt_tokens_details.cached_tokens
    assert cached("tenant-a") == 0 and cached("tenant-b") == 0
    assert cached("tenant-a") > 0


def test_prompt_logprobs_on_chat_and_completions(client, model_name):
    answer = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi there"}],
                                            max_tokens=1, extra_body={"prompt_logprobs": 2})
    shown = answer.choices[0].model_extra["prompt_logprobs"]
    assert len(shown) == answer.usage.prompt_tokens and shown[0] is None
    assert all(2 <= len(entry) <= 3 and all({"logprob", "rank", "decoded_token"} <= set(v) for v in entry.values())
               for entry in shown[1:])
    out = client.completions.create(model=model_name, prompt="The quick brown", max_tokens=1,
                                    extra_body={"prompt_logprobs": 0})
    assert [len(entry) if entry else None for entry in out.choices[0].model_extra["prompt_logprobs"]] == \
        [None] + [1] * (out.usage.prompt_tokens - 1)


def test_a_priority_is_refused_by_a_first_come_first_served_engine(client, model_name):
    assert client.completions.create(model=model_name, prompt="Hi", max_tokens=1, extra_body={"priority": 0}).choices
    with pytest.raises(openai.BadRequestError, match="--scheduling-policy priority"):
        client.completions.create(model=model_name, prompt="Hi", max_tokens=1, extra_body={"priority": 5})
