"""Tool-call parsers on fixed texts (vLLM's hermes and llama3_json formats), the stream that holds
back a call's text, and which tool_choice needs what."""
from __future__ import annotations

import json

import pytest

from atom_aot.server.options import ServerOptions
from atom_aot.server.protocol.errors import APIError
from atom_aot.server.protocol.requests import ChatCompletionRequest
from atom_aot.server.serving.tool_calls import ToolCallStream, ToolPlan, tool_plan
from atom_aot.server.serving.tool_parsers import HermesParser, Llama3JsonParser

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')


def calls(parsed):
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def test_hermes_reads_every_call_and_the_content_before_them():
    parsed = HermesParser().parse(HERMES)
    assert parsed.content == "Let me check.\n"
    assert calls(parsed) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    unclosed = HermesParser().parse('<tool_call>{"name": "f", "arguments": {}}')
    assert unclosed.content is None and calls(unclosed) == [("f", {})]


@pytest.mark.parametrize("text", ["no calls here", '<tool_call>{"name": "f", "argu', "<tool_call>[1, 2]</tool_call>"])
def test_what_does_not_parse_is_content(text):
    for parser in (HermesParser(), Llama3JsonParser()):
        parsed = parser.parse(text)
        assert parsed.content == text and parsed.tool_calls == []


def test_llama3_json_reads_parameters_and_several_calls():
    one = Llama3JsonParser().parse('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert one.content is None and calls(one) == [("get_weather", {"city": "Paris"})]
    two = Llama3JsonParser().parse('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}}')
    assert calls(two) == [("a", {}), ("b", {"x": 1})]


def test_streamable_never_shows_the_start_of_a_call():
    hermes = HermesParser()
    assert hermes.streamable("Sure <tool") == len("Sure ")
    assert hermes.streamable("Sure <tool_call>{") == len("Sure ")
    assert hermes.streamable("a < b") == len("a < b")
    llama = Llama3JsonParser()
    assert llama.streamable("  ") == 0 and llama.streamable(' {"na') == 0 and llama.streamable("<|pyth") == 0
    assert llama.streamable("Hello") == 5


def stream_in_pieces(plan: ToolPlan, text: str, size: int) -> list[dict]:
    stream = ToolCallStream(plan)
    return [stream.delta(text[i:i + size], finished=i + size >= len(text)) for i in range(0, len(text), size)]


def assembled(deltas: list[dict]) -> list[dict]:
    """The calls as a client puts them together: id, type and name from a call's first delta, arguments
    concatenated over all of them."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        for piece in delta.get("tool_calls", []):
            call = calls.setdefault(piece["index"], {"pieces": 0, "arguments": ""})
            if "id" in piece:
                assert "id" not in call, "a call's id is sent once"
                call.update(id=piece["id"], name=piece["function"]["name"])
            call["arguments"] += piece["function"]["arguments"]
            call["pieces"] += 1
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("size", [1, 7, 1000])
def test_auto_stream_sends_content_then_each_call_as_it_is_written(size):
    deltas = stream_in_pieces(ToolPlan("auto", parser=HermesParser()), HERMES, size)
    content = "".join(d.get("content", "") for d in deltas)
    whole = HermesParser().parse(HERMES)
    assert content == whole.content
    calls = assembled(deltas)
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    if size == 1:         # the name goes out before the arguments, the arguments in several pieces
        first = next(i for i, d in enumerate(deltas) if "tool_calls" in d)
        assert deltas[first]["tool_calls"][0]["function"]["arguments"] == ""
        assert all(c["pieces"] > 5 for c in calls)
        assert next(i for i, d in enumerate(deltas) if d.get("tool_calls", [{}])[0].get("index") == 1) < len(deltas) - 5


@pytest.mark.parametrize("text", [
    '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x":1, "s": "}}; <"}}',
    '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}'])
def test_llama3_json_stream_adds_up_to_the_parse(text):
    for size in (1, 3):
        deltas = stream_in_pieces(ToolPlan("auto", parser=Llama3JsonParser()), text, size)
        assert not any("content" in d for d in deltas)
        whole = Llama3JsonParser().parse(text)
        assert [(c["name"], c["arguments"]) for c in assembled(deltas)] == [(c.name, c.arguments) for c in whole.tool_calls]
        assert all(json.loads(c.arguments) is not None for c in whole.tool_calls)


def test_parallel_tool_calls_false_keeps_the_first_call():
    plan = ToolPlan("auto", parser=HermesParser(), max_calls=1)
    assert calls(plan.parse(HERMES)) == [("get_weather", {"city": "Paris"})]
    deltas = stream_in_pieces(plan, HERMES, 5)
    assert [c["name"] for c in assembled(deltas)] == ["get_weather"]
    assert json.loads(assembled(deltas)[0]["arguments"]) == {"city": "Paris"}


def test_a_call_cut_short_ends_as_content():
    text = HERMES[:HERMES.index("Rome")]
    deltas = stream_in_pieces(ToolPlan("auto", parser=HermesParser()), text, 4)
    assert "".join(d.get("content", "") for d in deltas) == text       # the parse fails: all of it is content
    assert HermesParser().parse(text).tool_calls == []


def test_named_stream_streams_the_arguments():
    stream = ToolCallStream(ToolPlan("named", function="get_weather"))
    deltas = [stream.delta(piece, finished=False) for piece in ('{"city"', ': "Oslo"', "}")]
    assert deltas[0]["tool_calls"][0]["function"]["name"] == "get_weather" and deltas[0]["tool_calls"][0]["id"]
    assert "id" not in deltas[1]["tool_calls"][0]
    assert json.loads("".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas)) == {"city": "Oslo"}
    assert stream.finish_reason("stop") == "stop"


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_tool_choice_plans():
    auto = ServerOptions(enable_auto_tool_choice=True, tool_call_parser="llama3_json")
    assert tool_plan(auto, request()) is None and tool_plan(auto, request(tools=[WEATHER], tool_choice="none")) is None
    assert isinstance(tool_plan(auto, request(tools=[WEATHER])).parser, Llama3JsonParser)
    with pytest.raises(APIError, match="--enable-auto-tool-choice"):
        tool_plan(ServerOptions(), request(tools=[WEATHER]))
    named = tool_plan(ServerOptions(), request(tools=[WEATHER], tool_choice={"type": "function",
                                                                            "function": {"name": "get_weather"}}))
    assert named.mode == "named" and json.loads(named.grammar.value) == WEATHER["function"]["parameters"]
    required = tool_plan(ServerOptions(), request(tools=[WEATHER], tool_choice="required"))
    assert json.loads(required.grammar.value)["minItems"] == 1 and "maxItems" not in json.loads(required.grammar.value)
    one = tool_plan(ServerOptions(), request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False))
    assert json.loads(one.grammar.value)["maxItems"] == 1
    assert tool_plan(auto, request(tools=[WEATHER], parallel_tool_calls=False)).max_calls == 1
    with pytest.raises(APIError, match="cannot be combined"):
        tool_plan(ServerOptions(), request(tools=[WEATHER], tool_choice="required", guided_regex="x"))
    with pytest.raises(ValueError, match="not among the tools"):
        request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "other"}})
    with pytest.raises(ValueError, match="needs --tool-call-parser"):
        ServerOptions(enable_auto_tool_choice=True)
