"""Hostile requests, live (one server on the eager tiny-llama artifact): nothing a client sends ends the
engine or answers 500. A table of the cases a probe found (integers no tensor holds, recursion, lone
surrogates in keys, two structured outputs, bodies that are not JSON this server reads), a fuzz over
every request field's type extremes on both generation endpoints, and /health answering while long
prompts are tokenized. Each refusal is a 4xx with an OpenAI-style `code`, and the engine answers after."""
from __future__ import annotations

import asyncio
import gzip
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
from test_server_flow import engine_of, tokenizer  # noqa: F401 (tokenizer: a fixture)
from test_server_support import ServerProcess

from atom_aot.runtime.processes.messages import EngineInfo
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.server.lifecycle.metrics import ServerMetrics
from atom_aot.server.options import ServerOptions
from atom_aot.server.protocol.errors import MAX_LOGGED_CHARS, bounded_traceback
from atom_aot.server.protocol.requests import NOT_IMPLEMENTED, ChatCompletionRequest, CompletionRequest
from atom_aot.server.serving.tokenization import tokenize
from atom_aot.server.state import ServerState

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
DEPTH = 24                      # the server's --max-json-depth here (the default is 64)
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_llama_eager_artifact, tmp_path_factory):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("server"), "--max-json-depth", str(DEPTH))
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as client:
        yield client


def c(**fields) -> dict:
    return {"prompt": "hi", "max_tokens": 2, **fields}


def m(**fields) -> dict:
    return {"messages": MSG, "max_tokens": 2, **fields}


def nested(levels: int) -> dict:
    """`levels` objects, one in the next."""
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def schema(levels: int) -> dict:
    """A JSON schema nested about `levels` objects deep (two per property level)."""
    value: dict = {"type": "string"}
    for _ in range(levels // 2):
        value = {"type": "object", "properties": {"a": value}}
    return value


def raw(text: str) -> bytes:
    return text.encode()


def post(http: httpx.Client, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(path, content=content, headers={"Content-Type": "application/json", **(headers or {})})


def named_tool(parameters: dict) -> dict:
    return m(tools=[{"type": "function", "function": {"name": "f", "parameters": parameters}}],
             tool_choice={"type": "function", "function": {"name": "f"}})


# (name, path, body: a dict sent as JSON or raw bytes, extra headers, error code, words the message must have)
BAD_CASES = [
    # integers no tensor holds: the sampler's int64 top_k killed the engine
    ("top_k 1e20", COMP, c(top_k=10 ** 20), {}, "invalid_value", ["top_k"]),
    ("top_k 1e19 as a float on chat", CHAT, m(top_k=1e19), {}, "invalid_value", ["top_k"]),
    ("top_k -1e20", CHAT, m(top_k=-10 ** 20), {}, "invalid_value", ["top_k"]),
    ("seed 1e20", COMP, c(seed=10 ** 20), {}, "invalid_value", ["seed"]),
    ("n 1e20", COMP, c(n=10 ** 20), {}, "invalid_value", ["n"]),
    ("max_tokens 1e20", COMP, c(max_tokens=10 ** 20), {}, "invalid_value", ["max_tokens"]),
    ("max_completion_tokens 1e20", CHAT, m(max_completion_tokens=10 ** 20), {}, "invalid_value",
     ["max_completion_tokens"]),
    ("min_tokens 1e20", COMP, c(min_tokens=10 ** 20), {}, "invalid_value", ["min_tokens"]),
    ("logprobs 1e20", COMP, c(logprobs=10 ** 20), {}, "invalid_value", ["logprobs"]),
    ("top_logprobs 1e20", CHAT, m(logprobs=True, top_logprobs=10 ** 20), {}, "invalid_value", ["top_logprobs"]),
    ("stop token 1e20", COMP, c(stop_token_ids=[10 ** 20]), {}, "invalid_value", ["stop_token_ids"]),
    ("prompt token 1e20", COMP, c(prompt=[1, 10 ** 20]), {}, "invalid_value", ["vocabulary"]),
    ("logit_bias value 1e308", COMP, c(logit_bias={"1": 1e308}), {}, "invalid_value", ["logit_bias"]),
    ("logit_bias key of 5000 digits", COMP, c(logit_bias={"9" * 5000: 1}), {}, "invalid_value", ["logit_bias"]),
    ("logit_bias key an Arabic-Indic digit", CHAT, m(logit_bias={"\u0663": 1}), {}, "invalid_value",
     ["decimal digits"]),
    ("logit_bias key with a sign", COMP, c(logit_bias={"+3": 1}), {}, "invalid_value", ["logit_bias"]),
    ("logit_bias key outside the vocabulary", COMP, c(logit_bias={"2147483647": 1}), {}, "invalid_value",
     ["vocabulary"]),
    ("presence_penalty 1e308", CHAT, m(presence_penalty=-1e308), {}, "invalid_value", ["presence_penalty"]),
    # lone surrogates anywhere, keys included
    ("surrogate in a key", COMP, raw('{"prompt": "hi", "\\ud800": 1}'), {}, "invalid_value", ["key", "surrogate"]),
    ("surrogate in a logit_bias key", COMP, c(logit_bias={"\udc00": 1}), {}, "invalid_value", ["surrogate"]),
    ("surrogate in a template variable", CHAT, m(chat_template_kwargs={"x": ["\ud83d"]}), {}, "invalid_value",
     ["chat_template_kwargs.x.0"]),
    # recursion: refused before any parser recurses
    ("chat_template_kwargs 900 deep", CHAT, m(chat_template_kwargs=nested(900)), {}, "invalid_json",
     ["--max-json-depth"]),
    ("tool parameters 300 deep, named", CHAT, named_tool(schema(300)), {}, "invalid_json", ["--max-json-depth"]),
    ("response_format 300 deep", CHAT, m(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema(300)}}), {}, "invalid_json", ["--max-json-depth"]),
    ("one level over the limit", CHAT, m(chat_template_kwargs=nested(DEPTH)), {}, "invalid_json",
     [f"more than {DEPTH} deep"]),
    ("arrays 20000 deep", COMP, b"[" * 20_000 + b"]" * 20_000, {}, "invalid_json", ["deep"]),
    # bodies that are not JSON this server reads
    ("invalid UTF-8", COMP, b'{"prompt": "\xff\xfe"}', {}, "invalid_json", ["UTF-8"]),
    ("gzip with Content-Encoding", COMP, gzip.compress(json.dumps(c()).encode()), {"Content-Encoding": "gzip"},
     "invalid_json", ["Content-Encoding"]),
    ("gzip without Content-Encoding", COMP, gzip.compress(json.dumps(c()).encode()), {}, "invalid_json", ["gzip"]),
    ("an integer of 5000 digits", COMP, raw('{"prompt": "hi", "max_tokens": ' + "9" * 5000 + "}"), {},
     "invalid_json", ["5000 digits"]),
    ("NaN", COMP, raw('{"prompt": "hi", "temperature": NaN}'), {}, "invalid_json", ["NaN"]),
    ("Infinity", CHAT, raw('{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}'), {},
     "invalid_json", ["Infinity"]),
    ("-Infinity", COMP, raw('{"prompt": "hi", "presence_penalty": -Infinity}'), {}, "invalid_json", ["Infinity"]),
    ("1e400", COMP, raw('{"prompt": "hi", "temperature": 1e400}'), {}, "invalid_json", ["64-bit float"]),
    ("an empty body", CHAT, b"", {}, "invalid_json", ["missing"]),
    ("truncated JSON", CHAT, b'{"messages": [', {}, "invalid_json", ["line 1"]),
    # messages in our words
    ("an empty prompt", COMP, c(prompt=""), {}, "invalid_value", ["prompt", "no tokens"]),
    ("an empty second prompt", COMP, c(prompt=["hi", ""]), {}, "invalid_value", ["prompt 1"]),
    ("min_tokens over max_tokens", COMP, c(min_tokens=9, max_tokens=2), {}, "invalid_value",
     ["min_tokens (9)", "max_tokens (2)"]),
    ("min_tokens over max_completion_tokens", CHAT, m(min_tokens=9, max_completion_tokens=3), {}, "invalid_value",
     ["min_tokens (9)", "max_completion_tokens (3)"]),
    ("an unknown structured_outputs field", COMP, c(structured_outputs={"jsn": {}}), {}, "unknown_parameter",
     ["json, regex"]),
    ("a model name of 100000 characters", COMP, c(model="m" * 100_000), {}, "model_not_found", ["not served"]),
    ("an unknown field of 5000 characters", CHAT, m(**{"y" * 5000: 1}), {}, "unknown_parameter", ["unknown field"]),
    # two structured outputs: a 400 naming both
    ("structured_outputs json and regex", COMP, c(structured_outputs={"json": {"type": "object"}, "regex": "zzz"}),
     {}, "invalid_value", ["json and regex"]),
    ("structured_outputs regex and choice", CHAT, m(structured_outputs={"choice": ["a"], "regex": "zzz"}), {},
     "invalid_value", ["regex and choice"]),
    ("guided_json and structured_outputs", COMP, c(guided_json={"type": "object"},
                                                   structured_outputs={"regex": "a"}), {},
     "invalid_value", ["guided_json and structured_outputs"]),
    ("response_format and guided_choice", CHAT, m(response_format={"type": "json_object"}, guided_choice=["a"]), {},
     "invalid_value", ["response_format and guided_choice"]),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=[case[0] for case in BAD_CASES])
def test_bad_input_is_a_4xx_with_a_code(http, case):
    name, path, body, headers, code, words = case
    response = post(http, path, body, headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], error
    assert "json_" not in error["message"].replace("json_schema", "").replace("json_object", ""), error
    assert len(error["message"]) < 600 and len(error["param"] or "") < 200, error
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("path, body", [
    (COMP, c(top_k=2 ** 63 - 1)),                               # int64's largest, what the sampler's tensor holds
    (COMP, c(seed=2 ** 63 - 1, n=3)),                           # seed + choice index past int64: still a seed
    (CHAT, m(seed=-2 ** 63, n=2, top_k=5)),
    (CHAT, m(chat_template_kwargs=nested(DEPTH - 1))),          # exactly at the depth limit (the body is one)
    (CHAT, named_tool(schema(DEPTH - 8))),
    (COMP, c(prompt="smile \ud83d\ude00", logit_bias={"5": 1.5, "0007": -2})),   # a surrogate pair is a character
])
def test_values_at_the_bounds_are_served(http, path, body):
    response = post(http, path, body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"]


EXTREMES = [10 ** 20, -10 ** 20, 2 ** 63, -2 ** 63 - 1, 1e308, 0.5, True, "x", "\ud800", [], {}, {"\ud800": 1},
            nested(DEPTH + 5)]
LITERALS = ["NaN", "-Infinity", "9" * 5000, "1e999"]


def _fuzz_bodies(base: dict, fields: list[str]):
    for field in fields:
        rest = json.dumps({k: v for k, v in base.items() if k != field})[:-1]
        for value in EXTREMES:
            yield field, value, f'{rest}, "{field}": {json.dumps(value)}}}'.encode()
        for literal in LITERALS:
            yield field, literal[:12], f'{rest}, "{field}": {literal}}}'.encode()


@pytest.mark.parametrize("path, model, base", [(COMP, CompletionRequest, c(max_tokens=1)),
                                                (CHAT, ChatCompletionRequest, m(max_tokens=1))])
def test_fuzz_every_field_with_type_extremes(http, path, model, base):
    """Every field (and a few refused ones) x each extreme, 16 at a time: never a 5xx, a 4xx always has a code."""
    fields = [f.alias or name for name, f in model.model_fields.items()] + ["best_of", "suffix", "x" * 300]
    assert len(fields) > 30 and set(NOT_IMPLEMENTED) >= {"best_of", "suffix"}
    cases = list(_fuzz_bodies(base, fields))
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda case: post(http, path, case[2]), cases))
    for (field, value, _), response in zip(cases, responses):
        assert response.status_code < 500, (field, value, response.text)
        if response.status_code >= 400:
            assert response.json()["error"]["code"], (field, value, response.text)
    assert sum(r.status_code == 200 for r in responses) >= 10     # the fuzz also reached the engine
    assert post(http, path, base).status_code == 200


def test_refusals_leave_the_engine_and_the_log_as_they_were(server, http):
    """After the table and the fuzz (module order), a small request still answers, and nothing logged a
    request body or a traceback of its recursion."""
    reply = post(http, COMP, c(temperature=0))
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] is not None
    assert len(server.log()) < 20_000, server.log()[-2000:]
    assert "Traceback" not in server.log()


def test_health_answers_while_long_prompts_are_tokenized(http):
    """Two ~0.6 MB prompts take the tiny tokenizer seconds each (on the event loop, each /health
    would wait that long); tokenized on the pool, /health answers the while."""
    text = " ".join(f"w{i % 977}x{i % 13}" for i in range(70_000))
    results, latencies = [], []

    def big():
        results.append(post(http, COMP, c(prompt=text)).json()["error"]["code"])
    workers = [threading.Thread(target=big) for _ in range(2)]
    for worker in workers:
        worker.start()
    while any(worker.is_alive() for worker in workers):
        start = time.perf_counter()
        assert http.get("/health").status_code == 200
        latencies.append(time.perf_counter() - start)
        time.sleep(0.02)
    assert results == ["context_length_exceeded"] * 2
    assert len(latencies) >= 5 and max(latencies) < 1.0, (len(latencies), max(latencies))


def test_tokenize_encodes_on_the_tokenizer_pool(tokenizer):  # noqa: F811
    threads = []

    class Recording:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, *args, **kwargs):
            threads.append(threading.current_thread().name)
            return tokenizer(*args, **kwargs)

    engine, _ = engine_of(tokenizer)
    info = EngineInfo(max_model_len=64, vocab_size=100, block_size=16, num_kv_blocks=8, execution="eager",
                      build_key="k")
    state = ServerState(engine=engine, tokenizer=Recording(), info=info, model_name="m", metrics=ServerMetrics())

    async def body():
        return b'{"prompt": "hello there"}'
    assert asyncio.run(tokenize(state, SimpleNamespace(body=body, headers={})))["count"] > 0
    assert threads and all(name.startswith("atom-tokenize") for name in threads), threads


@pytest.mark.parametrize("fields", [
    {"top_k": 10 ** 20}, {"top_k": 1e19}, {"seed": 2 ** 64}, {"seed": -2 ** 63 - 1}, {"max_tokens": 2 ** 63},
    {"min_tokens": 10 ** 20}, {"stop_token_ids": [2 ** 63]}, {"logit_bias": {10 ** 20: 1.0}},
    {"logit_bias": {3: math.inf}}, {"bad_words_token_ids": [[2 ** 70]]}, {"temperature": math.nan},
    {"top_p": math.nan}, {"presence_penalty": math.inf}, {"logprobs": 10 ** 20},
])
def test_sampling_params_refuse_what_no_tensor_holds(fields):
    """LLMEngine callers get a ValueError here, not an engine that dies in the sampler."""
    with pytest.raises(ValueError):
        SamplingParams(**fields)


def test_sampling_params_take_the_bounds_themselves():
    assert SamplingParams(top_k=2 ** 63 - 1, seed=2 ** 64 - 1).top_k == 2 ** 63 - 1
    assert SamplingParams(seed=-2 ** 63, logit_bias={0: -100.0}).seed == -2 ** 63


def test_an_unexpected_error_logs_a_bounded_traceback():
    def ping(n):
        return pong(n + 1)

    def pong(n):
        return ping(n + 1)
    try:
        ping(0)
    except RecursionError as e:
        text = bounded_traceback(e)
    assert "RecursionError" in text and len(text) <= MAX_LOGGED_CHARS + 40


def test_the_depth_limit_is_a_server_option():
    assert ServerOptions().max_json_depth == 64
    with pytest.raises(ValueError, match="--max-json-depth"):
        ServerOptions(max_json_depth=0)


def test_a_long_text_encodes_to_the_same_tokens(tiny_llama_dir):
    """Past GIL_FREE_ENCODE_CHARS the fast tokenizer encodes another way (without the GIL): same tokens."""
    from atom_aot.runtime.text.fast_tokenizer import GIL_FREE_ENCODE_CHARS, FastTokenizer
    fast = FastTokenizer.from_dir(tiny_llama_dir)
    text = "The quick brown fox, naïve café <|im_end|> 🙂 " * (GIL_FREE_ENCODE_CHARS // 40)
    assert len(text) >= GIL_FREE_ENCODE_CHARS
    for special in (True, False):
        assert fast.encode(text, special) == fast.backend.encode(text, add_special_tokens=special).ids
