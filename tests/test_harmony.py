"""GPT-OSS's harmony output read as vLLM's openai_gptoss reasoning parser and openai tool parser read it: recorded
outputs (reasoning then an answer, a tool call with its recipient after or before the channel, a preamble, a
built-in tool, outputs cut short, text that is no harmony), streamed in pieces of every size adding up to the whole
parse, the server's options, and one live server whose output a regex forces into harmony."""
from __future__ import annotations

import pytest

from atom_aot.server.options import ServerOptions
from atom_aot.server.serving.harmony import parse_messages, read_output
from atom_aot.server.serving.harmony_stream import HarmonyFields, HarmonyStream, harmony_fields, harmony_message
from atom_aot.server.serving.tool_calls import ToolPlan
from atom_aot.server.serving.tool_parsers import TOOL_PARSERS, OpenAIHarmonyParser
from live_reasoning import check_reasoning_and_call, reasoning_client

ANSWER = ("<|channel|>analysis<|message|>The user asks for the capital of France. It is Paris.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>The capital of France is **Paris**.<|return|>")
CALL = ('<|channel|>analysis<|message|>Need the weather; call get_weather.<|end|>'
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris", "unit": "C"}<|call|>')
CALL_RECIPIENT_FIRST = ('<|channel|>analysis<|message|>Look it up.<|end|>'
                        '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": "a<|b"}<|call|>')
PREAMBLE = ('<|channel|>analysis<|message|>Two steps.<|end|><|start|>assistant<|channel|>commentary<|message|>'
            'Checking both cities.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather '
            '<|constrain|>json<|message|>{"city": "Oslo"}<|call|>')
BROWSER = ('<|channel|>analysis to=browser.search code<|message|>{"query": "paged attention"}<|call|>')
CUT_IN_REASONING = "<|channel|>analysis<|message|>Let me think about th"
ALL = (ANSWER, CALL, CALL_RECIPIENT_FIRST, PREAMBLE, BROWSER, CUT_IN_REASONING, "No harmony here.")


class TestRead:
    def test_reasoning_then_answer(self):
        out = read_output(ANSWER)
        assert out.reasoning == "The user asks for the capital of France. It is Paris."
        assert out.content == "The capital of France is **Paris**." and out.calls == []

    def test_tool_call_recipient_after_the_channel(self):
        out = read_output(CALL)
        assert out.reasoning == "Need the weather; call get_weather." and out.content is None
        assert out.calls == [("get_weather", '{"city": "Paris", "unit": "C"}')]
        last = parse_messages(CALL)[-1]
        assert (last.role, last.channel, last.recipient, last.content_type) == (
            "assistant", "commentary", "functions.get_weather", "json")

    def test_tool_call_recipient_in_the_role_header(self):
        out = read_output(CALL_RECIPIENT_FIRST)
        assert out.calls == [("lookup", '{"q": "a<|b"}')] and out.reasoning == "Look it up."
        assert parse_messages(CALL_RECIPIENT_FIRST)[-1].content_type == "json"

    def test_a_preamble_is_content_and_a_builtin_tool_reasoning(self):
        out = read_output(PREAMBLE)
        assert out.content == "Checking both cities." and out.reasoning == "Two steps."
        assert out.calls == [("get_weather", '{"city": "Oslo"}')]
        browser = read_output(BROWSER)
        assert browser.reasoning == '{"query": "paged attention"}' and browser.calls == [] and browser.content is None

    def test_cut_short_and_no_harmony(self):
        cut = read_output(CUT_IN_REASONING)
        assert (cut.reasoning, cut.content) == ("Let me think about th", None)
        assert read_output("No harmony here.").content == "No harmony here."
        assert read_output(ANSWER[:ANSWER.index("<|message|>", 60)]).content is None     # final's header only

    def test_the_tool_parser_reads_calls_and_content(self):
        parsed = ToolPlan("auto", parser=TOOL_PARSERS["openai"]()).parse(PREAMBLE)
        assert parsed.content == "Checking both cities." and [c.name for c in parsed.tool_calls] == ["get_weather"]
        assert isinstance(TOOL_PARSERS["openai"](), OpenAIHarmonyParser)


def stream(text: str, size: int, fields: HarmonyFields, plan=None) -> tuple[list[dict], HarmonyStream]:
    s = HarmonyStream(fields, plan)
    return [s.delta(text[i:i + size], finished=i + size >= len(text)) for i in range(0, len(text), size)], s


def joined(deltas: list[dict], key: str) -> str | None:
    pieces = [d[key] for d in deltas if key in d]
    return "".join(pieces) if pieces else None


@pytest.mark.parametrize("size", [1, 2, 5, 11, 1000])
@pytest.mark.parametrize("text", ALL)
def test_streams_add_up_to_the_whole_parse(text, size):
    fields = HarmonyFields(reasoning=True, tools=True)
    deltas, _ = stream(text, size, fields)
    message, _ = harmony_message(fields, text)
    assert joined(deltas, "content") == message["content"]
    assert joined(deltas, "reasoning") == joined(deltas, "reasoning_content") == message.get("reasoning")
    calls: dict[int, dict] = {}
    for piece in (p for d in deltas for p in d.get("tool_calls", [])):
        call = calls.setdefault(piece["index"], {"name": piece["function"].get("name"), "arguments": ""})
        call["arguments"] += piece["function"]["arguments"]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    if text != CALL_RECIPIENT_FIRST:          # its arguments hold "<|" themselves
        assert not any("<|" in value for d in deltas for key, value in d.items() if key != "tool_calls")


def test_a_stream_sends_reasoning_before_the_answer_and_the_call_name_first():
    deltas, s = stream(CALL, 3, HarmonyFields(reasoning=True, tools=True), ToolPlan("auto", parser=OpenAIHarmonyParser()))
    first_reasoning = next(i for i, d in enumerate(deltas) if "reasoning" in d)
    first_call = next(i for i, d in enumerate(deltas) if "tool_calls" in d)
    assert first_reasoning < first_call < len(deltas) - 3
    assert deltas[first_call]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert s.finish_reason("stop") == "tool_calls"


def test_what_the_fields_leave_out():
    no_reasoning, _ = stream(ANSWER, 4, HarmonyFields(reasoning=False, tools=False))
    assert joined(no_reasoning, "reasoning") is None and joined(no_reasoning, "content") == read_output(ANSWER).content
    no_tools, s = stream(PREAMBLE, 4, HarmonyFields(reasoning=True, tools=False))
    assert not any("tool_calls" in d for d in no_tools) and s.finish_reason("stop") == "stop"
    two = PREAMBLE.replace("<|call|>", "<|end|>") + CALL[CALL.index("<|start|>"):]
    one, _ = stream(two, 6, HarmonyFields(reasoning=True, tools=True, max_calls=1))
    assert {p["index"] for d in one for p in d.get("tool_calls", [])} == {0}
    message, parsed = harmony_message(HarmonyFields(reasoning=True, tools=True, max_calls=1), two)
    assert len(message["tool_calls"]) == len(parsed.tool_calls) == 1


def test_which_requests_read_harmony():
    both = ServerOptions(enable_auto_tool_choice=True, tool_call_parser="openai", reasoning_parser="openai_gptoss")
    auto = ToolPlan("auto", parser=OpenAIHarmonyParser())
    assert harmony_fields(both, auto) == HarmonyFields(reasoning=True, tools=True)
    assert harmony_fields(both, None) == HarmonyFields(reasoning=True, tools=False)
    assert harmony_fields(both, ToolPlan("named", function="f")) is None          # a grammar writes plain JSON
    assert harmony_fields(ServerOptions(reasoning_parser="openai_gptoss"), None).reasoning
    assert harmony_fields(ServerOptions(), None) is None
    with pytest.raises(ValueError, match="only --tool-call-parser openai reads"):
        ServerOptions(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="openai_gptoss")


def test_a_returned_assistant_message_with_its_reasoning_is_taken_back():
    """A response's message sent back in the next request (reasoning under either name) reaches the template, which
    reads it as `thinking` (GPT-OSS's template renders it before a tool call)."""
    from atom_aot.runtime.text.fast_tokenizer import render_chat
    from atom_aot.server.protocol.requests import ChatCompletionRequest
    message, _ = harmony_message(HarmonyFields(reasoning=True, tools=True), CALL)
    for name in ("reasoning", "reasoning_content"):
        returned = {"role": "assistant", "content": None, name: message["reasoning"],
                    "tool_calls": message["tool_calls"]}
        req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}, returned]})
        rendered = render_chat("{% for m in messages %}[{{ m.thinking }}]{% endfor %}",
                               [m.as_template_input() for m in req.messages], None, None, False, {})
        assert rendered == "[][Need the weather; call get_weather.]"


# -- live: the tiny llama server, its output forced into harmony by a regex (byte-level pieces spell the markers);
# its end-of-text token (<|im_end|>, kept in the text with the special tokens) follows GPT-OSS's <|return|> / <|call|>
FORCED_ANSWER = r"<\|channel\|>analysis<\|message\|>Think (a|b)\.<\|end\|><\|start\|>assistant<\|channel\|>final<\|message\|>Hi\.<\|return\|>"
FORCED_CALL = (r"<\|channel\|>analysis<\|message\|>Call\.<\|end\|><\|start\|>assistant<\|channel\|>commentary "
               r'to=functions\.get_weather <\|constrain\|>json<\|message\|>\{"city": "(Oslo|Rome)"\}<\|call\|>')


@pytest.fixture(scope="module")
def harmony_client(tiny_llama_eager_artifact, tmp_path_factory):
    yield from reasoning_client(tiny_llama_eager_artifact, tmp_path_factory.mktemp("server"),
                                "--enable-auto-tool-choice", "--tool-call-parser", "openai",
                                "--reasoning-parser", "openai_gptoss")


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_live_server_returns_reasoning_content_and_calls(harmony_client, stream):
    check_reasoning_and_call(*harmony_client, FORCED_ANSWER, FORCED_CALL, stream)
