"""The deepseek_v3, deepseek_v31, glm45 and qwen3_coder tool-call parsers on recorded outputs (vLLM's formats):
one call, several, after text, none, malformed; streams in pieces of every size adding up to the whole parse;
values typed by the tool's schema; and the special tokens a parser reads kept in the text, and only then."""
from __future__ import annotations

import json

import pytest
from test_tool_parsers import assembled, stream_in_pieces

from atom_aot.server.options import ServerOptions
from atom_aot.server.protocol.requests import ChatCompletionRequest
from atom_aot.server.serving.markers import HiddenTokens
from atom_aot.server.serving.tool_calls import ToolCallStream, ToolPlan, hidden_tokens, tool_plan
from atom_aot.server.serving.tool_parsers import tool_parser

B, E, CB, CE, SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", \
    "<｜tool▁sep｜>"
SCHEMAS = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "ratio": {"type": "number"}, "tags": {"type": "array"}, "where": {"type": "object"}, "zip": {"type": "string"}}},
    "get_time": {"type": "object", "properties": {}}}


def v3(name: str, arguments: str) -> str:
    return f"{CB}function{SEP}{name}\n```json\n{arguments}\n```{CE}"


def v31(name: str, arguments: str) -> str:
    return f"{CB}{name}{SEP}{arguments}{CE}"


def glm(name: str, *pairs: tuple[str, str]) -> str:
    return f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                            for k, v in pairs) + "</tool_call>"


def qwen(name: str, *pairs: tuple[str, str]) -> str:
    return f"<tool_call>\n<function={name}>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n"
                                                         for k, v in pairs) + "</function>\n</tool_call>"


# parser -> (text, content, [(name, arguments)]) of outputs that are calls
WEATHER_PARIS = '{"city": "Paris"}'
RECORDED = {
    "deepseek_v3": [
        (B + v3("get_weather", WEATHER_PARIS) + E, None, [("get_weather", {"city": "Paris"})]),
        ("Let me check." + B + v3("get_weather", '{"city": "Paris", "days": 3}') + "\n" + v3("get_time", "{}") + E
         + "<｜end▁of▁sentence｜>", "Let me check.", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
        (B + v3("get_weather", '{\n  "city": "a\\n```b"\n}'), None, [("get_weather", {"city": "a\n```b"})]),
    ],
    "deepseek_v31": [
        (B + v31("get_weather", WEATHER_PARIS) + E, None, [("get_weather", {"city": "Paris"})]),
        ("Sure: " + B + v31("get_weather", '{"city": "Rome"}') + v31("get_time", "{}") + E, "Sure: ",
         [("get_weather", {"city": "Rome"}), ("get_time", {})]),
    ],
    "glm45": [
        (glm("get_weather", ("city", "Paris")), None, [("get_weather", {"city": "Paris"})]),
        ("I'll look.\n" + glm("get_weather", ("city", " New York "), ("days", "3"), ("metric", "true"),
                             ("tags", '["a", "b"]'), ("where", "{'lat': 1.5}"), ("zip", "007")) + "\n"
         + glm("get_time"), "I'll look.\n",
         [("get_weather", {"city": "New York", "days": 3, "metric": True, "tags": ["a", "b"], "where": {"lat": 1.5},
                           "zip": "007"}), ("get_time", {})]),
        ("<tool_call>get_time</tool_call>", None, [("get_time", {})]),
    ],
    "qwen3_coder": [
        (qwen("get_weather", ("city", "Paris")), None, [("get_weather", {"city": "Paris"})]),
        ("Checking.\n" + qwen("get_weather", ("city", "\nline two"), ("days", "3"), ("metric", "False"),
                               ("ratio", "2.50"), ("tags", "[1, 2]"), ("zip", "null"), ("other", "3")) + "\n"
         + qwen("get_time"), "Checking.\n",
         [("get_weather", {"city": "\nline two", "days": 3, "metric": False, "ratio": 2.5, "tags": [1, 2],
                           "zip": None, "other": "3"}), ("get_time", {})]),
        ("<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>", None,
         [("get_weather", {"city": "Oslo", "days": 2})]),          # vLLM's leniency: no tool_call, no </parameter>
    ],
}

MALFORMED = {
    "deepseek_v3": [B + v3("get_weather", '{"city": "Par'),                      # cut short
                    B + CB + "function" + SEP + 'get_weather\n```json\n{"city"',
                    B + v3("get_weather", '{"city": Paris}') + E,                # not JSON
                    B + v3("get_weather", "[1]") + E,                            # not an object
                    B + "junk" + v3("get_weather", "{}") + E,
                    B + v31("get_weather", "{}") + E,                            # V3.1's form
                    v3("get_weather", "{}")],                                    # no calls-begin
    "deepseek_v31": [B + v31("get_weather", '{"city": "Par'), B + v31("f", "nope") + E, B + E],
    "glm45": ["<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
              "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
              "<tool_call>get_weather\nsome words</tool_call>",
              '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
              glm("get_weather", ("city", "Paris")) + "<tool_call>get_time\n"],
    "qwen3_coder": ["<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
                    "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",
                    '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'],
}
NO_CALLS = ["The weather is fine.", "a < b and <tool or <｜tool", ""]
PARSERS = tuple(RECORDED)


def parser(name: str):
    return tool_parser(name, SCHEMAS)


def calls(parsed):
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


@pytest.mark.parametrize("name", PARSERS)
def test_recorded_calls_parse(name):
    for text, content, expected in RECORDED[name]:
        parsed = parser(name).parse(text)
        assert parsed.content == content and calls(parsed) == expected, text


@pytest.mark.parametrize("name", PARSERS)
def test_what_does_not_parse_is_content(name):
    for text in MALFORMED[name] + NO_CALLS:
        parsed = parser(name).parse(text)
        assert parsed.content == text and parsed.tool_calls == [], text


def streamed(name: str, text: str, size: int) -> tuple[str, list[dict], list[dict]]:
    deltas = stream_in_pieces(ToolPlan("auto", parser=parser(name)), text, size)
    return "".join(d.get("content", "") for d in deltas), assembled(deltas), deltas


@pytest.mark.parametrize("name", PARSERS)
def test_streams_in_pieces_add_up_to_the_parse(name):
    for text, content, _ in RECORDED[name]:
        whole = parser(name).parse(text)
        for size in range(1, len(text) + 1):
            sent, calls_sent, _ = streamed(name, text, size)
            assert sent == (content or ""), (text, size)
            assert [(c["name"], c["arguments"]) for c in calls_sent] == [(c.name, c.arguments) for c in
                                                                        whole.tool_calls], (text, size)


@pytest.mark.parametrize("name", PARSERS)
def test_a_stream_sends_the_name_first_then_the_arguments_in_pieces(name):
    text, _, _ = RECORDED[name][1]
    _, calls_sent, deltas = streamed(name, text, 1)
    first = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert first["function"]["name"] == "get_weather" and first["id"] and first["function"]["arguments"] == ""
    assert calls_sent[0]["pieces"] > 2 and len(calls_sent) == 2
    last_of_first = max(i for i, d in enumerate(deltas) for c in d.get("tool_calls", []) if c["index"] == 0)
    assert last_of_first < len(deltas) - 1, "the first call's arguments are all out before the stream ends"


@pytest.mark.parametrize("name", PARSERS)
def test_a_malformed_stream_ends_as_content(name):
    for text in MALFORMED[name] + NO_CALLS:
        for size in (1, 3, 1000):
            assert streamed(name, text, size)[0] == text, (text, size)


@pytest.mark.parametrize("name", ["glm45", "qwen3_coder"])
def test_string_values_stream_as_they_are_written(name):
    text = (glm if name == "glm45" else qwen)("get_weather", ("city", "Saint-Louis-du-Ha! Ha!"), ("days", "12"))
    stream = ToolCallStream(ToolPlan("auto", parser=parser(name)))
    pieces = [stream.delta(text[i], finished=i == len(text) - 1) for i in range(len(text))]
    arguments = [c["function"]["arguments"] for d in pieces for c in d.get("tool_calls", [])]
    assert '{"city": "Sa' in "".join(arguments[:4]) and json.loads("".join(arguments))["days"] == 12
    assert not any("12" in a for a in arguments[:-3]), "a number goes out once its value closes"


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("glm45", ("days", "three"), {"days": "three"}),           # not an integer: the text, as vLLM
    ("glm45", ("city", "42"), {"city": "42"}),                 # a declared string stays one
    ("glm45", ("undeclared", "42"), {"undeclared": 42}),       # undeclared: read as JSON
    ("glm45", ("days", "NaN"), {"days": "NaN"}),               # JSON has no NaN
    ("glm45", ("where", "{1, 2}"), {"where": "{1, 2}"}),       # a Python set is no JSON value
    ("qwen3_coder", ("days", "3.5"), {"days": "3.5"}),
    ("qwen3_coder", ("ratio", "inf"), {"ratio": "inf"}),
    ("qwen3_coder", ("metric", "yes"), {"metric": "yes"}),
    ("qwen3_coder", ("tags", "[1, 2"), {"tags": "[1, 2"}),
    ("qwen3_coder", ("city", "NULL"), {"city": None}),
])
def test_values_that_do_not_fit_the_schema_stay_text(name, value, expected):
    text = (glm if name == "glm45" else qwen)("get_weather", value)
    assert calls(parser(name).parse(text)) == [("get_weather", expected)]
    _, calls_sent, _ = streamed(name, text, 2)
    assert json.loads(calls_sent[0]["arguments"]) == expected


@pytest.mark.parametrize("name", ["glm45", "qwen3_coder"])
def test_unknown_functions_are_called_with_values_read_loosely(name):
    text = (glm if name == "glm45" else qwen)("lookup", ("n", "7"), ("n", "8"))     # a key twice: the first
    expected = {"n": 7} if name == "glm45" else {"n": "7"}       # glm45 reads it as JSON, qwen3_coder as a string
    assert calls(parser(name).parse(text)) == [("lookup", expected)]
    assert calls(tool_parser(name).parse(text)) == [("lookup", expected)]          # no schemas at all


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_the_plan_gives_the_parser_the_tools_schemas():
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS["get_weather"]}}
    options = ServerOptions(enable_auto_tool_choice=True, tool_call_parser="qwen3_coder")
    plan = tool_plan(options, request(tools=[weather]))
    assert calls(plan.parse(qwen("get_weather", ("days", "4")))) == [("get_weather", {"days": 4})]
    assert not plan.keeps_special_tokens
    with pytest.raises(ValueError, match="deepseek_v3, deepseek_v31, glm45, qwen3_coder"):
        ServerOptions(enable_auto_tool_choice=True)


def test_special_markers_are_kept_and_the_other_special_tokens_hidden(tokenizers):
    """The test tokenizer's <|im_start|> / <|im_end|> are special: a parser reading one has the text keep them,
    and the others (the end-of-sequence token) removed; a parser whose markers are not special changes nothing."""
    assert hidden_tokens(tokenizers["plain"], ("<tool_call>", "</tool_call>")) is None
    hidden = hidden_tokens(tokenizers["plain"], ("<|im_start|>",))
    assert hidden is not None and hidden.visible("a<|im_start|>b<|im_end|>") == "a<|im_start|>b"
    assert hidden.visible("ok<|im_e", finished=False) == "ok" and hidden.visible("ok<|im_e") == "ok<|im_e"
    plan = ToolPlan("auto", parser=parser("deepseek_v31"), hidden=HiddenTokens(frozenset({"<|im_end|>"})))
    text = "Hi" + B + v31("get_time", "{}") + E + "<|im_end|>"
    assert plan.keeps_special_tokens and calls(plan.parse(text)) == [("get_time", {})]
    for size in (1, 4):
        deltas = stream_in_pieces(ToolPlan("auto", parser=parser("deepseek_v31"), hidden=plan.hidden),
                                  "Hello<|im_end|>", size)
        assert "".join(d.get("content", "") for d in deltas) == "Hello"


# -- through the chat endpoint, against a scripted engine ------------------------------------------------------
DEEPSEEK_MARKERS = (B, E, CB, CE, SEP)
GET_TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict:
    """The test tokenizer (its <|im_start|> and <|im_end|> special), as it is (DeepSeek's markers are plain text to
    it) and with DeepSeek's markers as special tokens (skipped when decoding unless kept)."""
    from factories import make_tokenizer

    from atom_aot.runtime.text.tokenizer import load_tokenizer
    plain, special = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("deepseek")
    make_tokenizer(plain)
    fast = make_tokenizer(special)
    fast.add_special_tokens({"additional_special_tokens": list(DEEPSEEK_MARKERS)})
    fast.save_pretrained(str(special))
    return {"plain": load_tokenizer(plain), "special": load_tokenizer(special)}


def chat_call(tokenizer, stream: bool) -> tuple[dict, object]:
    from test_server_vllm_fields import serve
    answer = "Hi" + B + v31("get_time", "{}") + E
    ids = tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    http, engine = serve(tokenizer, ids, enable_auto_tool_choice=True, tool_call_parser="deepseek_v31")
    body = {"messages": [{"role": "user", "content": "time?"}], "tools": [GET_TIME], "stream": stream}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()["choices"][0], engine
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    calls_sent = assembled([{"tool_calls": [{**c, "function": {"arguments": "", **c["function"]}} for c in
                                            d["tool_calls"]]} for d in deltas if d.get("tool_calls")])
    content = "".join(d.get("content") or "" for d in deltas)
    return {"message": {"content": content, "tool_calls": [{"function": {"name": c["name"], "arguments": c[
        "arguments"]}} for c in calls_sent]}, "finish_reason": events[-1]["choices"][0]["finish_reason"]}, engine


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("special", [True, False])
def test_deepseek_markers_read_whether_special_tokens_or_plain_text(tokenizers, special, stream):
    """Special markers: the server decodes keeping them (and hides the end-of-sequence token); plain-text markers
    (a tokenizer without them): decoded as usual, read the same."""
    choice, engine = chat_call(tokenizers["special" if special else "plain"], stream)
    assert engine.requests[0].params.skip_special_tokens is (not special)
    assert choice["message"]["content"] == "Hi" and choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == \
        [("get_time", "{}")]
