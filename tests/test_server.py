"""The OpenAI-compatible server, live: one server per module (eager tiny-llama artifact), driven
by the official `openai` client and by raw HTTP; greedy outputs checked against the offline
`LLMEngine` on the same artifact and RuntimeConfig."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time

import httpx
import openai
import pytest
import torch
from test_server_support import API_KEY, RUNTIME, ServerProcess, metric

from atom_aot.artifact.reader import Artifact
from atom_aot.runtime.sampling_params import SamplingParams


# small limits, so that tests can reach them: (max n, sequences per request, queued sequences, stall seconds)
MAX_N, MAX_SEQS_PER_REQUEST, MAX_QUEUED_SEQS, STALL_S = 100, 64, 96, 2
LIMIT_FLAGS = ("--max-n", str(MAX_N), "--max-seqs-per-request", str(MAX_SEQS_PER_REQUEST),
               "--max-queued-seqs", str(MAX_QUEUED_SEQS), "--stalled-stream-timeout", str(STALL_S))


@pytest.fixture(scope="module")
def profiler_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def server_process(tiny_llama_eager_artifact, tmp_path_factory, profiler_dir):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("server"),
                         "--torch-profiler-dir", str(profiler_dir), "--max-request-body-bytes", str(64 << 10),
                         *LIMIT_FLAGS)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def offline(tiny_llama_eager_artifact, server_process):
    """The reference engine, loaded here while the server starts in its own processes."""
    from atom_aot import LLMEngine
    return LLMEngine(model=str(tiny_llama_eager_artifact), **RUNTIME)


@pytest.fixture(scope="module")
def server(server_process, offline):
    return server_process.wait_healthy()


@pytest.fixture(scope="module")
def model_name(tiny_llama_eager_artifact) -> str:
    return Artifact.open(tiny_llama_eager_artifact).manifest.model.name


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def http(server, method: str, path: str, **kwargs) -> httpx.Response:
    headers = {**server.headers, **kwargs.pop("headers", {})}
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=60, **kwargs)


def sse_events(text: str) -> list:
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# -- the openai client ------------------------------------------------------------------------
def test_models_lists_the_artifact_model(client, model_name):
    models = client.models.list().data
    assert [m.id for m in models] == [model_name]
    assert models[0].object == "model"


def test_completion(client, model_name):
    out = client.completions.create(model=model_name, prompt="Hello world", max_tokens=8, temperature=0)
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    choice = out.choices[0]
    assert isinstance(choice.text, str) and choice.finish_reason in ("stop", "length")
    usage = out.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    extra = usage.model_extra
    assert extra["ttft_s"] > 0 and extra["latency_s"] >= extra["ttft_s"] and extra["tpot_s"] >= 0


def test_chat(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi there"}],
                                         max_tokens=6, temperature=0)
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)
    assert out.usage.completion_tokens <= 6 and out.usage.model_extra["latency_s"] > 0


def test_max_completion_tokens_caps_chat(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                         max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_streaming_chat_equals_whole_response(client, model_name):
    kwargs = dict(model=model_name, messages=[{"role": "user", "content": "Tell me about blocks"}],
                  max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_completion_equals_whole_response(client, model_name):
    kwargs = dict(model=model_name, prompt="Paged attention stores", max_tokens=10, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_n_choices_with_seed_are_distinct_and_reproducible(client, model_name):
    kwargs = dict(model=model_name, prompt="The quick brown", max_tokens=8, temperature=1.0, n=4, seed=11)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1        # choice i samples with seed + i


def test_n_choices_stream_chat(client, model_name):
    chunks = list(client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=5, temperature=0.8, n=3, stream=True))
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1, 2}


def test_several_prompts_times_n(client, model_name):
    out = client.completions.create(model=model_name, prompt=["Hello", "world"], max_tokens=3, n=2,
                                    temperature=0)
    by_index = {c.index: c.text for c in out.choices}
    assert sorted(by_index) == [0, 1, 2, 3]
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]   # greedy: a prompt's choices agree


def test_seed_reproducibility(client, model_name):
    def sample(seed):
        return client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "Say something"}], max_tokens=10,
            temperature=1.0, seed=seed, extra_body={"ignore_eos": True}).choices[0].message.content
    assert sample(1234) == sample(1234)
    assert len({sample(1234), sample(1), sample(2)}) > 1


def test_chat_logprobs(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
                                         extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 6
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)   # greedy takes the top token
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="replace")


def _offline_prompt_logprobs(offline, prompt_ids: list[int]) -> list[float]:
    [request_id] = offline.add_request([prompt_ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))
    scored = None
    with torch.inference_mode():
        while not offline.is_finished():
            for update in offline.step():
                if update.request_id == request_id and update.prompt_logprobs is not None:
                    scored = update.prompt_logprobs
    return [entry.logprob for entry in scored]


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_echo_logprobs_score_the_prompt_like_offline(client, model_name, offline, max_tokens):
    """lm-eval's loglikelihood request: token-id prompts, echo, logprobs=1, max_tokens 1 (or 0)."""
    prompts = [offline.tokenizer("Hello world! How are you today?").input_ids,
               offline.tokenizer("def f(x):\n    return x").input_ids]
    out = client.completions.create(model=model_name, prompt=prompts, echo=True, logprobs=1,
                                    max_tokens=max_tokens, temperature=0)
    for choice, prompt_ids in zip(sorted(out.choices, key=lambda c: c.index), prompts):
        lp = choice.logprobs
        assert len(lp.tokens) == len(prompt_ids) + max_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        expected = _offline_prompt_logprobs(offline, prompt_ids)
        assert lp.token_logprobs[1:len(prompt_ids)] == pytest.approx(expected, abs=1e-4)
        assert all(len(top) >= 1 for top in lp.top_logprobs[1:])
        assert lp.text_offset == sorted(lp.text_offset)
    assert out.usage.completion_tokens == (0 if max_tokens == 0 else len(prompts))


def test_streamed_echo_starts_with_the_prompt(client, model_name):
    whole = client.completions.create(model=model_name, prompt="Hello world", max_tokens=4, temperature=0,
                                      echo=True, logprobs=1)
    chunks = list(client.completions.create(model=model_name, prompt="Hello world", max_tokens=4, temperature=0,
                                            echo=True, logprobs=1, stream=True))
    assert chunks[0].choices[0].text.startswith("Hello world")
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    streamed = [t for c in chunks for t in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:])
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    assert offsets == whole.choices[0].logprobs.text_offset


def test_completion_logprobs_without_echo(client, model_name):
    out = client.completions.create(model=model_name, prompt="Hello", max_tokens=4, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == out.choices[0].text or "\ufffd" in "".join(lp.tokens)


def test_stop_string_ends_the_text(client, model_name):
    kwargs = dict(model=model_name, prompt="The quick brown fox", max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    text = client.completions.create(**kwargs).choices[0].text
    stop = text[3:5]
    assert len(stop) == 2
    stopped = client.completions.create(stop=[stop], **kwargs).choices[0]
    assert stopped.text == text[:text.find(stop)] and stopped.finish_reason == "stop"


# -- continuous batching equals the offline engine ----------------------------------------------
def _concurrent_cases(offline) -> list[dict]:
    """64 greedy requests: completions and chats, whole and streamed, several lengths, some stops."""
    words = "the quick brown fox jumps over lazy dog paged attention blocks hello world".split()
    cases = []
    for i in range(64):
        text = " ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 9)) + f" {i}"
        chat = i % 4 == 3
        prompt = offline.apply_chat_template([{"role": "user", "content": text}]) if chat else text
        cases.append({"chat": chat, "text": text, "prompt": prompt, "stream": i % 2 == 1,
                      "max_tokens": 4 + i % 13, "stop": None})
    return cases


def _add_stop_strings(offline, cases: list[dict]) -> None:
    """For every 8th case, a stop string taken from the middle of its own unstopped output."""
    picked = cases[::8]
    outs = offline.generate([c["prompt"] for c in picked],
                            [SamplingParams(temperature=0, max_tokens=c["max_tokens"]) for c in picked])
    for case, out in zip(picked, outs):
        if len(out["text"]) >= 6 and "\ufffd" not in out["text"][2:4]:
            case["stop"] = [out["text"][2:4]]


async def _ask(http_client: httpx.AsyncClient, model_name: str, case: dict) -> str:
    body = {"model": model_name, "max_tokens": case["max_tokens"], "temperature": 0, "stream": case["stream"]}
    if case["stop"]:
        body["stop"] = case["stop"]
    if case["chat"]:
        body["messages"] = [{"role": "user", "content": case["text"]}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = case["prompt"]
        path = "/v1/completions"
    response = await http_client.post(path, json=body)
    assert response.status_code == 200, response.text
    if not case["stream"]:
        choice = response.json()["choices"][0]
        return choice["message"]["content"] if case["chat"] else choice["text"]
    pieces = []
    for event in sse_events(response.text):
        for choice in event["choices"]:
            pieces.append(choice["delta"].get("content") or "" if case["chat"] else choice["text"])
    return "".join(pieces)


def test_64_concurrent_greedy_requests_equal_offline_generate(server, model_name, offline):
    cases = _concurrent_cases(offline)
    with torch.inference_mode():
        _add_stop_strings(offline, cases)
        expected = offline.generate(
            [c["prompt"] for c in cases],
            [SamplingParams(temperature=0, max_tokens=c["max_tokens"], stop_strings=c["stop"] or [])
             for c in cases])

    async def run_all():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=300,
                                     limits=limits) as http_client:
            return await asyncio.gather(*(_ask(http_client, model_name, c) for c in cases))

    got = asyncio.run(run_all())
    mismatches = [(i, e["text"], g) for i, (e, g) in enumerate(zip(expected, got)) if e["text"] != g]
    assert not mismatches, mismatches[:5]
    assert any(c["stop"] for c in cases)


# -- errors -----------------------------------------------------------------------------------
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def _bad_cases():
    """(name, method, path, json body or raw bytes, extra headers, status, error code or None)."""
    c = lambda **kw: {"model": "MODEL", "prompt": "hi", "max_tokens": 2, **kw}    # noqa: E731
    m = lambda **kw: {"model": "MODEL", "messages": MSG, "max_tokens": 2, **kw}    # noqa: E731
    return [
        ("invalid json", "POST", COMP, b"{not json", {}, 400, "invalid_json"),
        ("body is a list", "POST", COMP, [1, 2], {}, 400, "invalid_json"),
        ("empty body", "POST", CHAT, b"", {}, 400, "invalid_json"),
        ("unknown model", "POST", COMP, {**c(), "model": "gpt-9"}, {}, 400, "model_not_found"),
        ("unknown model chat", "POST", CHAT, {**m(), "model": "gpt-9"}, {}, 400, "model_not_found"),
        ("model not a string", "POST", COMP, {**c(), "model": 7}, {}, 400, "invalid_value"),
        ("missing messages", "POST", CHAT, {"model": "MODEL"}, {}, 400, "missing_field"),
        ("empty messages", "POST", CHAT, m(messages=[]), {}, 400, "invalid_value"),
        ("messages not a list", "POST", CHAT, m(messages="hi"), {}, 400, "invalid_value"),
        ("message without role", "POST", CHAT, m(messages=[{"content": "hi"}]), {}, 400, "missing_field"),
        ("unknown role", "POST", CHAT, m(messages=[{"role": "robot", "content": "x"}]), {}, 400, "invalid_value"),
        ("content not text", "POST", CHAT, m(messages=[{"role": "user", "content": 5}]), {}, 400, "invalid_value"),
        ("temperature negative", "POST", COMP, c(temperature=-0.5), {}, 400, "invalid_value"),
        ("temperature too high", "POST", CHAT, m(temperature=3), {}, 400, "invalid_value"),
        ("temperature a string", "POST", COMP, c(temperature="hot"), {}, 400, "invalid_value"),
        ("top_p zero", "POST", COMP, c(top_p=0), {}, 400, "invalid_value"),
        ("top_p above one", "POST", CHAT, m(top_p=1.5), {}, 400, "invalid_value"),
        ("top_k below -1", "POST", COMP, c(top_k=-2), {}, 400, "invalid_value"),
        ("min_p above one", "POST", COMP, c(min_p=1.5), {}, 400, "invalid_value"),
        ("max_tokens zero on chat", "POST", CHAT, m(max_tokens=0), {}, 400, "invalid_value"),
        ("max_tokens zero without echo", "POST", COMP, c(max_tokens=0), {}, 400, "invalid_value"),
        ("max_tokens negative", "POST", COMP, c(max_tokens=-1), {}, 400, "invalid_value"),
        ("max_tokens a float", "POST", COMP, c(max_tokens=1.5), {}, 400, "invalid_value"),
        ("max_tokens beyond context", "POST", COMP, c(max_tokens=100000), {}, 400, "context_length_exceeded"),
        ("max_completion_tokens beyond context", "POST", CHAT, m(max_completion_tokens=100000), {}, 400,
         "context_length_exceeded"),
        ("prompt beyond context", "POST", COMP, c(prompt=[5] * 600), {}, 400, "context_length_exceeded"),
        ("missing prompt", "POST", COMP, {"model": "MODEL"}, {}, 400, "missing_field"),
        ("empty prompt", "POST", COMP, c(prompt=""), {}, 400, "invalid_value"),
        ("empty prompt list", "POST", COMP, c(prompt=[]), {}, 400, "invalid_value"),
        ("prompt token out of vocabulary", "POST", COMP, c(prompt=[1, 10 ** 6]), {}, 400, "invalid_value"),
        ("prompt token negative", "POST", COMP, c(prompt=[1, -3]), {}, 400, "invalid_value"),
        ("prompt mixed types", "POST", COMP, c(prompt=[1, "a"]), {}, 400, "invalid_value"),
        ("n zero", "POST", COMP, c(n=0), {}, 400, "invalid_value"),
        ("n a string", "POST", CHAT, m(n="2"), {}, 400, "invalid_value"),
        ("stop not strings", "POST", COMP, c(stop=[1, 2]), {}, 400, "invalid_value"),
        ("stop empty string", "POST", COMP, c(stop=""), {}, 400, "invalid_value"),
        ("stream not a bool", "POST", COMP, c(stream="yes"), {}, 400, "invalid_value"),
        ("stream_options without stream", "POST", CHAT, m(stream_options={"include_usage": True}), {}, 400,
         "invalid_value"),
        ("seed a string", "POST", COMP, c(seed="42"), {}, 400, "invalid_value"),
        ("ignore_eos not a bool", "POST", COMP, c(ignore_eos="true"), {}, 400, "invalid_value"),
        ("logprobs above 20", "POST", COMP, c(logprobs=21), {}, 400, "invalid_value"),
        ("top_logprobs without logprobs", "POST", CHAT, m(top_logprobs=2), {}, 400, "invalid_value"),
        ("top_logprobs above 20", "POST", CHAT, m(logprobs=True, top_logprobs=30), {}, 400, "invalid_value"),
        ("top_p a list", "POST", CHAT, m(top_p=[1]), {}, 400, "invalid_value"),
        ("temperature NaN", "POST", COMP, b'{"model": "MODEL", "prompt": "hi", "temperature": NaN}', {}, 400,
         "invalid_json"),
        ("max_tokens a bool", "POST", COMP, c(max_tokens=True), {}, 400, "invalid_value"),
        ("logprobs a bool on completions", "POST", COMP, c(logprobs=True), {}, 400, "invalid_value"),
        ("seed above int64", "POST", CHAT, m(seed=2 ** 64), {}, 400, "invalid_value"),
        ("17 stop strings", "POST", COMP, c(stop=["a"] * 17), {}, 400, "invalid_value"),
        ("stream_options not an object", "POST", CHAT, m(stream=True, stream_options=5), {}, 400, "invalid_value"),
        ("image content part", "POST", CHAT, m(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}]), {}, 400, "invalid_value"),
        ("text part without text", "POST", CHAT, m(messages=[{"role": "user", "content": [{"type": "text"}]}]), {},
         400, "missing_field"),
        ("deeply nested json", "POST", COMP, b"[" * 20_000 + b"]" * 20_000, {}, 400, "invalid_json"),
        # fields this server does not take: refused by name, never dropped
        ("presence penalty out of range", "POST", CHAT, m(presence_penalty=2.5), {}, 400, "invalid_value"),
        ("repetition penalty zero", "POST", COMP, c(repetition_penalty=0), {}, 400, "invalid_value"),
        ("logit_bias key not a token id", "POST", COMP, c(logit_bias={"a": 10}), {}, 400, "invalid_value"),
        ("logit_bias outside the vocabulary", "POST", CHAT, m(logit_bias={"999999": 10}), {}, 400, "invalid_value"),
        ("min_tokens over max_tokens", "POST", COMP, c(min_tokens=9, max_tokens=2), {}, 400, "invalid_value"),
        ("response_format without its schema", "POST", CHAT, m(response_format={"type": "json_schema"}), {}, 400,
         "invalid_value"),
        ("guided_regex that does not compile", "POST", COMP, c(guided_regex="(("), {}, 400, None),
        ("tools (auto) without --enable-auto-tool-choice", "POST", CHAT,
         m(tools=[{"type": "function", "function": {"name": "f"}}]), {}, 400, "invalid_value"),
        ("tool_choice without tools", "POST", CHAT, m(tool_choice="required"), {}, 400, "invalid_value"),
        ("legacy functions", "POST", CHAT, m(functions=[{"name": "f"}]), {}, 400, "unsupported_parameter"),
        ("best_of", "POST", COMP, c(best_of=3), {}, 400, "unsupported_parameter"),
        ("suffix", "POST", COMP, c(suffix="the end"), {}, 400, "unsupported_parameter"),
        ("unknown field completions", "POST", COMP, c(temprature=0.5), {}, 400, "unknown_parameter"),
        ("unknown field chat", "POST", CHAT, m(temprature=0.5), {}, 400, "unknown_parameter"),
        ("a chat-only field on completions", "POST", COMP, c(continue_final_message=True), {}, 400,
         "unknown_parameter"),
        ("messages on completions", "POST", COMP, c(messages=MSG), {}, 400, "unknown_parameter"),
        ("unknown message field", "POST", CHAT, m(messages=[{"role": "user", "content": "hi", "x": 1}]), {}, 400,
         "unknown_parameter"),
        ("tool call without its function", "POST", CHAT, m(messages=[{"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function"}]}]), {}, 400, "missing_field"),
        ("continuous usage stats", "POST", COMP, c(stream=True, stream_options={
            "include_usage": True, "continuous_usage_stats": True}), {}, 400, "unsupported_parameter"),
        # strings that are not valid Unicode: lone UTF-16 surrogates
        ("surrogate in the prompt", "POST", COMP, c(prompt="\ud800abc"), {}, 400, "invalid_value"),
        ("surrogate in a prompt list", "POST", COMP, c(prompt=["ok", "x\udc00"]), {}, 400, "invalid_value"),
        ("surrogate in chat content", "POST", CHAT, m(messages=[{"role": "user", "content": "\ud800abc"}]), {}, 400,
         "invalid_value"),
        ("surrogate in a text part", "POST", CHAT, m(messages=[{"role": "user", "content": [
            {"type": "text", "text": "\udfff"}]}]), {}, 400, "invalid_value"),
        ("surrogate in a message name", "POST", CHAT, m(messages=[{"role": "user", "content": "x",
                                                                  "name": "\ud83d"}]), {}, 400, "invalid_value"),
        ("surrogate in a stop string", "POST", COMP, c(stop=["\ud800"]), {}, 400, "invalid_value"),
        ("surrogate in a chat stop string", "POST", CHAT, m(stop="a\ud800"), {}, 400, "invalid_value"),
        ("surrogate in the model", "POST", COMP, {**c(), "model": "\ud800"}, {}, 400, "invalid_value"),
        # the server's limits, each named with the flag that raises it
        ("2000 prompts x n 128", "POST", COMP, c(prompt=[[5]] * 2000, n=128), {}, 400, "limit_exceeded"),
        ("300 text prompts", "POST", COMP, c(prompt=["a"] * 300), {}, 400, "limit_exceeded"),
        ("n above --max-n", "POST", COMP, c(n=MAX_N + 1), {}, 400, "limit_exceeded"),
        ("n above --max-n chat", "POST", CHAT, m(n=MAX_N + 1), {}, 400, "limit_exceeded"),
        ("prompts x n above the limit", "POST", COMP, c(prompt=["a", "b"], n=MAX_SEQS_PER_REQUEST // 2 + 1), {},
         400, "limit_exceeded"),
        ("n above the sequences limit chat", "POST", CHAT, m(n=MAX_SEQS_PER_REQUEST + 1), {}, 400, "limit_exceeded"),
        # token ids outside the vocabulary
        ("stop token out of vocabulary", "POST", COMP, c(stop_token_ids=[10 ** 6]), {}, 400, "invalid_value"),
        ("stop token out of vocabulary chat", "POST", CHAT, m(stop_token_ids=[10 ** 6]), {}, 400, "invalid_value"),
        ("token out of vocabulary in a prompt list", "POST", COMP, c(prompt=[[1, 2], [3, 10 ** 7]]), {}, 400,
         "invalid_value"),
        ("body over the size limit", "POST", COMP, c(prompt="x" * (70 << 10)), {}, 413, "request_too_large"),
        ("no api key", "POST", COMP, c(), {"Authorization": ""}, 401, "invalid_api_key"),
        ("wrong api key", "GET", "/v1/models", None, {"Authorization": "Bearer nope"}, 401, "invalid_api_key"),
        ("unknown route", "GET", "/v1/nope", None, {}, 404, "not_found"),
        ("unknown route post", "POST", "/v2/completions", c(), {}, 404, "not_found"),
        ("GET on a POST route", "GET", CHAT, None, {}, 405, "method_not_allowed"),
        ("POST on a GET route", "POST", "/v1/models", {}, {}, 405, "method_not_allowed"),
    ]


BAD_CASES = _bad_cases()


@pytest.mark.parametrize("case", BAD_CASES, ids=[case[0] for case in BAD_CASES])
def test_bad_request(server, model_name, case):
    name, method, path, body, headers, status, code = case
    kwargs = {"headers": headers}
    if isinstance(body, bytes):
        kwargs.update(content=body, headers={**headers, "Content-Type": "application/json"})
    elif body is not None:
        kwargs["content"] = json.dumps(body).replace('"MODEL"', json.dumps(model_name))
        kwargs["headers"] = {**headers, "Content-Type": "application/json"}
    response = http(server, method, path, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    if code is not None:
        assert error["code"] == code, error
    if code in ("unsupported_parameter", "unknown_parameter"):
        assert error["param"].split(".")[-1] in error["message"], error
    if code == "limit_exceeded":
        assert "raises it" in error["message"] and "--max-" in error["message"]
    assert http(server, "GET", "/health").status_code == 200       # the server lives on after each


def test_bad_request_matrix_is_large_and_covers_both_endpoints(server):
    assert len(BAD_CASES) >= 60
    assert sum(case[2] == COMP for case in BAD_CASES) >= 30 and sum(case[2] == CHAT for case in BAD_CASES) >= 30
    assert http(server, "GET", "/health").json() == {"status": "ok"}


def test_the_request_that_wedged_the_engine_is_refused_at_once(server, model_name):
    """Issue case 1: prompt [[5]] * 2000 with n 128 was 256,000 sequences."""
    start = time.monotonic()
    response = http(server, "POST", COMP, json={"model": model_name, "prompt": [[5]] * 2000, "n": 128})
    assert time.monotonic() - start < 5
    assert response.status_code == 400 and "--max-prompts-per-request" in response.json()["error"]["message"]
    text = _engine_metrics(server)
    assert metric(text, "atom_num_requests_waiting") == 0 and metric(text, "atom_num_requests_running") == 0


def test_context_error_says_the_numbers(server, model_name):
    response = http(server, "POST", COMP, json={"model": model_name, "prompt": "hi", "max_tokens": 100000})
    message = response.json()["error"]["message"]
    assert "512" in message and "100000" in message


def test_unknown_model_error_names_the_served_model(client, model_name):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="nope", prompt="hi", max_tokens=1)
    assert model_name in info.value.message


# -- abort, metrics, profiler -----------------------------------------------------------------
def _engine_metrics(server) -> str:
    response = http(server, "GET", "/metrics")
    assert response.status_code == 200
    return response.text


def _metrics_once(server, condition, timeout: float = 30) -> str:
    """/metrics once `condition(text)` holds (engine numbers come with its heartbeat, so they lag a
    little), or at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        text = _engine_metrics(server)
        if condition(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def _wait_until_idle(server, free_blocks: float, timeout: float = 30) -> str:
    return _metrics_once(server, lambda text: metric(text, "atom_num_requests_running") == 0 and metric(
        text, "atom_num_requests_waiting") == 0 and metric(text, "atom_kv_cache_blocks_free") == free_blocks, timeout)


def _idle_metrics(server) -> str:
    """/metrics once the engine is idle with every KV block free (what earlier tests ran has ended)."""
    total = metric(_engine_metrics(server), "atom_kv_cache_blocks_total")
    return _wait_until_idle(server, total)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_disconnect_aborts_and_returns_kv_blocks(server, model_name, stream):
    before = _idle_metrics(server)
    assert metric(before, "atom_num_requests_running") == 0
    initial = metric(before, "atom_kv_cache_blocks_free")
    body = {"model": model_name, "prompt": "Hello world " * 20, "max_tokens": 400, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{server.url}{COMP}", json=body, headers=server.headers, timeout=60) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            busy = _metrics_once(server, lambda text: metric(text, "atom_kv_cache_blocks_free") < initial, 10)
            assert metric(busy, "atom_kv_cache_blocks_free") < initial
    else:            # the client gives up waiting: the connection closes with the request unfinished (400
        # tokens of the tiny model take about 1 s on a 2-core machine: a 1 s timeout sometimes saw them all)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}{COMP}", json=body, headers=server.headers, timeout=0.25)
    after = _wait_until_idle(server, initial)
    assert metric(after, "atom_kv_cache_blocks_free") == initial
    assert metric(after, "atom_generation_tokens_total") - metric(before, "atom_generation_tokens_total") < 400
    assert metric(after, "atom_request_aborted_total") == metric(before, "atom_request_aborted_total") + 1


def test_metrics_parse_as_prometheus_text(server, client, model_name):
    from prometheus_client.parser import text_string_to_metric_families
    client.completions.create(model=model_name, prompt="metrics please", max_tokens=3, temperature=0)
    families = {f.name: f for f in text_string_to_metric_families(_engine_metrics(server))}
    for name in ("atom_num_requests_running", "atom_num_requests_waiting", "atom_kv_cache_blocks_used",
                 "atom_kv_cache_blocks_free", "atom_prefix_cache_hit_rate", "atom_prompt_tokens",
                 "atom_generation_tokens", "atom_time_to_first_token_seconds",
                 "atom_time_per_output_token_seconds", "atom_e2e_request_latency_seconds"):
        assert name in families, name
    assert families["atom_time_to_first_token_seconds"].type == "histogram"
    ttft_count = [s for s in families["atom_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft_count[0].value >= 1
    compilations = {s.labels["kind"]: s.value for s in families["atom_runtime_compilations"].samples}
    assert compilations and all(v == 0 for v in compilations.values())


def test_profiler_writes_a_trace_per_rank(server, client, model_name, profiler_dir):
    assert http(server, "POST", "/start_profile").status_code == 200
    again = http(server, "POST", "/start_profile")
    assert again.status_code == 400 and again.json()["error"]["code"] == "profiler_state"
    client.completions.create(model=model_name, prompt="profile me", max_tokens=3, temperature=0)
    stopped = http(server, "POST", "/stop_profile")
    assert stopped.status_code == 200, stopped.text
    traces = list((profiler_dir / "rank_0").glob("*.json.gz"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert http(server, "POST", "/stop_profile").status_code == 400


def test_a_full_engine_answers_429_with_retry_after(server, model_name):
    """The engine is frozen, so what is submitted stays queued; the front end still answers."""
    from concurrent.futures import ThreadPoolExecutor
    engine = server.engine_pid()
    os.kill(engine, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(http, server, "POST", COMP, json={"model": model_name, "prompt": "Hello",
                                                                 "max_tokens": 4, "n": MAX_SEQS_PER_REQUEST})
            deadline = time.monotonic() + 10
            while http(server, "GET", "/ready").json()["queued_seqs"] < MAX_SEQS_PER_REQUEST:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            over = http(server, "POST", COMP, json={"model": model_name, "prompt": "Hi", "max_tokens": 2,
                                                    "n": MAX_QUEUED_SEQS - MAX_SEQS_PER_REQUEST + 1})
            os.kill(engine, signal.SIGCONT)
            assert held.result().status_code == 200
    finally:
        os.kill(engine, signal.SIGCONT)
    assert over.status_code == 429 and over.headers["retry-after"] == "1", over.text
    error = over.json()["error"]
    assert error["code"] == "overloaded" and error["type"] == "rate_limit_error" and "--max-queued-seqs" in error["message"]
    fits = http(server, "POST", COMP, json={"model": model_name, "prompt": "Hi", "max_tokens": 2,
                                            "n": MAX_SEQS_PER_REQUEST})
    assert fits.status_code == 200


def test_a_client_that_stops_reading_is_aborted_and_its_blocks_freed(server, model_name):
    """Issue case 9: a stream nobody reads no longer generates to max_tokens."""
    before = _idle_metrics(server)
    initial = metric(before, "atom_kv_cache_blocks_free")
    n, max_tokens = MAX_SEQS_PER_REQUEST, 480
    body = json.dumps({"model": model_name, "prompt": "Hello", "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True, "n": n, "logprobs": 20}).encode()
    head = (f"POST {COMP} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)      # a reader that soon stops taking
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(head + body)
        busy = _metrics_once(server, lambda text: metric(text, "atom_kv_cache_blocks_free") < initial, 10)
        assert metric(busy, "atom_kv_cache_blocks_free") < initial
        after = _wait_until_idle(server, initial, timeout=60)           # nothing read meanwhile
        assert metric(after, "atom_kv_cache_blocks_free") == initial
        generated = metric(after, "atom_generation_tokens_total") - metric(before, "atom_generation_tokens_total")
        assert generated < n * max_tokens
        aborted = metric(after, "atom_request_aborted_total") - metric(before, "atom_request_aborted_total")
        assert aborted >= 1
    assert "--stalled-stream-timeout" in server.log()


def test_health_and_metrics_answer_while_the_engine_cannot(server):
    """Issue case 8: liveness and /metrics come from the front end, not from an engine round trip."""
    engine = server.engine_pid()
    os.kill(engine, signal.SIGSTOP)
    try:
        time.sleep(1.5)
        start = time.monotonic()
        health, ready, metrics = (http(server, "GET", path) for path in ("/health", "/ready", "/metrics"))
        elapsed = time.monotonic() - start
    finally:
        os.kill(engine, signal.SIGCONT)
    assert (health.status_code, ready.status_code, metrics.status_code) == (200, 200, 200) and elapsed < 2
    assert metric(metrics.text, "atom_engine_alive") == 1
    assert metric(metrics.text, "atom_engine_heartbeat_age_seconds") > 1.0 < ready.json()["heartbeat_age_s"]
    deadline = time.monotonic() + 10
    while metric(_engine_metrics(server), "atom_engine_heartbeat_age_seconds") > 1.0:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_health_at_the_end(server):
    assert http(server, "GET", "/health").json() == {"status": "ok"}
    assert server.proc.poll() is None
    assert "Traceback" not in server.log()      # no request above hit an unhandled error
