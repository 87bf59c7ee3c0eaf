"""Tool-call parsers on fixed texts (vLLM's hermes and llama3_json formats), the stream that holds
back a call's text, and which tool_choice needs what."""
from __future__ import annotations

import json

import pytest

from atom_aot.server.errors import APIError
from atom_aot.server.options import ServerOptions
from atom_aot.server.protocol import ChatCompletionRequest
from atom_aot.server.tool_calls import ToolCallStream, ToolPlan, tool_plan
from atom_aot.server.tool_parsers import HermesParser, Llama3JsonParser

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


def test_auto_stream_sends_content_then_the_calls():
    stream = ToolCallStream(ToolPlan("auto", parser=HermesParser()))
    deltas = [stream.delta(HERMES[i:i + 7], finished=i + 7 >= len(HERMES)) for i in range(0, len(HERMES), 7)]
    content = "".join(d.get("content", "") for d in deltas)
    [last] = [d for d in deltas if "tool_calls" in d]
    assert content == "Let me check.\n" and last is deltas[-1]
    assert [(c["index"], c["function"]["name"]) for c in last["tool_calls"]] == [(0, "get_weather"), (1, "get_weather")]
    assert stream.finish_reason("stop") == "tool_calls"


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
    assert json.loads(required.grammar.value)["minItems"] == 1
    with pytest.raises(APIError, match="cannot be combined"):
        tool_plan(ServerOptions(), request(tools=[WEATHER], tool_choice="required", guided_regex="x"))
    with pytest.raises(ValueError, match="not among the tools"):
        request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "other"}})
    with pytest.raises(ValueError, match="needs --tool-call-parser"):
        ServerOptions(enable_auto_tool_choice=True)
