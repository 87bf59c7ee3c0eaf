"""The think-tag reasoning parsers (deepseek_r1, qwen3, glm45) as vLLM's of the same names read outputs: recorded
outputs (with and without the opening tag, cut short before the closing one, empty reasoning, a tool call written
inside the reasoning), streamed in pieces of every size adding up to the whole parse, what a request's template
switches, prompt, grammar and tokenizer change, tool calls read from the content only, the server's options, and
one live server whose output a regex forces into tags."""
from __future__ import annotations

import json

import pytest

from atom_aot.server.args import parse_args
from atom_aot.server.options import ServerOptions
from atom_aot.server.serving.markers import special_texts
from atom_aot.server.serving.reasoning_parsers import (THINK_TAGS, ReasoningChoiceStream, ThinkTagParser,
                                                       think_tag_parser)
from atom_aot.server.serving.tool_calls import ToolCallStream, ToolPlan
from atom_aot.server.serving.tool_parsers import HermesParser
from live_reasoning import check_reasoning_and_call, reasoning_client

R1 = "<think>\nOkay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**."
R1_PROMPT_OPENED = "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**."        # the template wrote <think>
CUT_SHORT = "Let me think about th"
EMPTY_REASONING = "<think>\n\n</think>\n\nHi!"
CLOSED_AT_ONCE = "</think>Hi!"
TWO_ENDS = "Plan.</think>Answer</think> more"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
CALL_AFTER = f"Need weather.</think>\n\n{CALL}"
CALL_INSIDE = f"Need weather.\n{CALL}"
REOPENED = "<think>First.  </think>Part one. <think>Second.\n</think>Part two."
ALL = (R1, R1_PROMPT_OPENED, CUT_SHORT, EMPTY_REASONING, CLOSED_AT_ONCE, TWO_ENDS, CALL_AFTER, CALL_INSIDE, REOPENED,
       "", "<think>", "</think>", "a<thi", "a</thin")

# (parser, text) -> (reasoning, content), as vLLM's parsers return them
RECORDED = [
    ("deepseek_r1", R1, "\nOkay, 2 + 2 is 4.\n", "\n\nThe answer is **4**."),
    ("deepseek_r1", R1_PROMPT_OPENED, "Okay, 2 + 2 is 4.\n", "\n\nThe answer is **4**."),
    ("deepseek_r1", CUT_SHORT, CUT_SHORT, None),
    ("deepseek_r1", EMPTY_REASONING, "\n\n", "\n\nHi!"),
    ("deepseek_r1", CLOSED_AT_ONCE, None, "Hi!"),
    ("deepseek_r1", TWO_ENDS, "Plan.", "Answer</think> more"),
    ("deepseek_r1", CALL_INSIDE, CALL_INSIDE, None),             # DeepSeek writes no <tool_call>: all reasoning
    ("qwen3", R1, "\nOkay, 2 + 2 is 4.\n", "\n\nThe answer is **4**."),
    ("qwen3", R1_PROMPT_OPENED, "Okay, 2 + 2 is 4.\n", "\n\nThe answer is **4**."),
    ("qwen3", CUT_SHORT, CUT_SHORT, None),
    ("qwen3", TWO_ENDS, "Plan.", "Answer more"),
    ("qwen3", CALL_AFTER, "Need weather.", CALL_AFTER.split("</think>")[1]),
    ("qwen3", CALL_INSIDE, "Need weather.\n", CALL_INSIDE[CALL_INSIDE.index("<tool_call>"):]),
    ("qwen3", "", None, None),
    ("glm45", R1, "\nOkay, 2 + 2 is 4.", "\n\nThe answer is **4**."),
    ("glm45", EMPTY_REASONING, None, "\n\nHi!"),
    ("glm45", CUT_SHORT + "  \n", CUT_SHORT, None),
    ("glm45", REOPENED, "First.  Second.", "Part one. Part two."),
]


@pytest.mark.parametrize("name, text, reasoning, content", RECORDED)
def test_recorded_outputs(name, text, reasoning, content):
    assert ThinkTagParser(THINK_TAGS[name]).split(text) == (reasoning, content)


def streamed(parser: ThinkTagParser, text: str, size: int) -> tuple[str, str]:
    stream, reasoning, content = parser.stream(), [], []
    for i in range(0, max(len(text), 1), size):
        r, c = stream.feed(text[i:i + size], finished=i + size >= len(text))
        reasoning.append(r)
        content.append(c)
    return "".join(reasoning), "".join(content)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 8, 9, 1000])
@pytest.mark.parametrize("name", sorted(THINK_TAGS))
def test_streams_add_up_to_the_whole_parse(name, size):
    for thinking in (True, False):
        parser = ThinkTagParser(THINK_TAGS[name], thinking=thinking)
        for text in ALL:
            reasoning, content = parser.split(text)
            assert streamed(parser, text, size) == (reasoning or "", content or ""), (text, thinking)


def test_a_stream_holds_a_split_tag_back_and_sends_reasoning_first():
    stream = ThinkTagParser(THINK_TAGS["qwen3"]).stream()
    assert stream.feed("Hmm.</th", False) == ("Hmm.", "")          # "</th" may begin </think>: held
    assert stream.feed("ink>Hi", False) == ("", "Hi")
    assert stream.feed("<", False) == ("", "")                     # may begin a stray </think>, which qwen3 drops
    assert stream.feed("b>", True) == ("", "<b>")
    glm = ThinkTagParser(THINK_TAGS["glm45"]).stream()
    assert glm.feed("A \n", False) == ("A", "") and glm.feed("B", False) == (" \nB", "")   # trailing blanks wait


def test_thinking_switched_off_by_the_template_kwargs():
    assert not THINK_TAGS["qwen3"].thinking({"enable_thinking": False})
    assert THINK_TAGS["qwen3"].thinking({"thinking": False}) and THINK_TAGS["qwen3"].thinking(None)
    assert not THINK_TAGS["glm45"].thinking({"thinking": False}) and not THINK_TAGS["glm45"].thinking(
        {"enable_thinking": False})
    assert THINK_TAGS["glm45"].thinking({"thinking": False, "enable_thinking": True})
    assert THINK_TAGS["deepseek_r1"].thinking({"enable_thinking": False})         # vLLM's reads no switch
    off = ThinkTagParser(THINK_TAGS["qwen3"], thinking=False)
    assert off.split(R1) == (None, R1) and off.split(CUT_SHORT) == (None, CUT_SHORT)


@pytest.fixture(scope="module")
def qwen3_tokenizer(shipped_folder):
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    return load_tokenizer(shipped_folder("tokenizers/qwen3"))


def test_qwen3s_tags_are_ordinary_tokens_the_text_keeps(qwen3_tokenizer):
    """Qwen3's <think>, </think> and <tool_call> are added tokens that are not special: skip_special_tokens (the
    default) keeps them, so the server decodes as usual and only <|im_end|> and its kind are left out."""
    ids = qwen3_tokenizer("<think>\nhm</think>\n\nHi", add_special_tokens=False).input_ids
    assert len(ids) == 6 and qwen3_tokenizer.decode(ids, skip_special_tokens=True) == "<think>\nhm</think>\n\nHi"
    specials = special_texts(qwen3_tokenizer)
    assert "<|im_end|>" in specials and not {"<think>", "</think>", "<tool_call>"} & specials
    prompt = qwen3_tokenizer("<|im_start|>assistant\n", add_special_tokens=False).input_ids
    parser = think_tag_parser("qwen3", qwen3_tokenizer, None, prompt, constrained=False, skip_special_tokens=None)
    assert not parser.keeps_special_tokens and parser.dropped == () and parser.thinking and parser.in_reasoning


def test_a_prompt_that_closes_the_reasoning_and_a_grammar(qwen3_tokenizer):
    """Qwen3's template with enable_thinking false ends the prompt with an empty, closed think block: the output is
    all content (vLLM's check of the prompt). A grammar writes the output from its first token: only explicit tags
    are reasoning there."""
    closed = qwen3_tokenizer("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False).input_ids
    parser = think_tag_parser("deepseek_r1", qwen3_tokenizer, None, closed, constrained=False, skip_special_tokens=None)
    assert parser.split("Hi</think>") == (None, "Hi</think>")
    opened = qwen3_tokenizer("<|im_start|>assistant\n<think>\n", add_special_tokens=False).input_ids
    assert think_tag_parser("deepseek_r1", qwen3_tokenizer, None, opened, False, None).split("a</think>b") == ("a", "b")
    grammar = think_tag_parser("qwen3", qwen3_tokenizer, None, opened, constrained=True, skip_special_tokens=None)
    assert grammar.split('{"a": 1}') == (None, '{"a": 1}') and grammar.split("<think>x</think>y") == ("x", "y")


def test_special_tags_are_decoded_kept_and_the_other_special_tokens_left_out(tmp_path):
    """A tokenizer whose <think> / </think> are special tokens (skip_special_tokens would erase them): the server
    asks for them kept, and the parser leaves the other special tokens' texts (the end of turn) out."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|user|>",
                            additional_special_tokens=["<think>", "</think>"]).save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.decode(tokenizer("<think>a", add_special_tokens=False).input_ids, skip_special_tokens=True) == "a"
    parser = think_tag_parser("glm45", tokenizer, None, [0], constrained=False, skip_special_tokens=None)
    assert parser.keeps_special_tokens and parser.dropped == ("<|user|>",)
    assert parser.split("<think>a</think>b<|user|>") == ("a", "b")
    assert streamed(parser, "<think>a</think>b<|user|>", 3) == ("a", "b")
    asked = think_tag_parser("glm45", tokenizer, None, [0], constrained=False, skip_special_tokens=False)
    assert asked.split("<think>a</think>b<|user|>") == ("a", "b<|user|>")   # the request asked to see them


def chat_stream(text: str, size: int, name: str = "qwen3") -> tuple[list[dict], ReasoningChoiceStream]:
    plan = ToolPlan("auto", parser=HermesParser())
    stream = ReasoningChoiceStream(ThinkTagParser(THINK_TAGS[name]).stream(), ToolCallStream(plan))
    return [stream.delta(text[i:i + size], finished=i + size >= len(text)) for i in range(0, len(text), size)], stream


@pytest.mark.parametrize("size", [1, 4, 13, 1000])
def test_tool_calls_are_read_from_the_content_only(size):
    for text in (CALL_AFTER, CALL_INSIDE):
        deltas, stream = chat_stream(text, size)
        reasoning = "".join(d.get("reasoning", "") for d in deltas)
        assert reasoning == "".join(d.get("reasoning_content", "") for d in deltas) == "Need weather." + (
            "\n" if text == CALL_INSIDE else "")
        calls = [t for d in deltas for t in d.get("tool_calls", [])]
        assert calls[0]["function"]["name"] == "get_weather"
        assert json.loads("".join(t["function"]["arguments"] for t in calls)) == {"city": "Oslo"}
        assert not "".join(d.get("content", "") for d in deltas).strip()
        assert stream.finish_reason("stop") == "tool_calls"
    deltas, stream = chat_stream(CALL_INSIDE, size, "deepseek_r1")       # a call inside the reasoning is reasoning
    assert not any("tool_calls" in d for d in deltas) and stream.finish_reason("stop") == "stop"


def test_the_servers_options():
    for name in ("deepseek_r1", "qwen3", "glm45"):
        assert ServerOptions(reasoning_parser=name, enable_auto_tool_choice=True, tool_call_parser="hermes")
        with pytest.raises(ValueError, match="--reasoning-parser openai_gptoss reads"):
            ServerOptions(reasoning_parser=name, tool_call_parser="openai")
        assert parse_args(["art", "--reasoning-parser", name]).reasoning_parser == name


# -- live: the tiny llama server, its output forced by a regex (byte-level pieces spell the tags)
FORCED_ANSWER = r"<think>Think (a|b)\.</think>Hi\."
FORCED_CALL = (r'<think>Call\.</think><tool_call>\{"name": "get_weather", "arguments": \{"city": "(Oslo|Rome)"\}\}'
               r"</tool_call>")


@pytest.fixture(scope="module")
def qwen3_client(tiny_llama_eager_artifact, tmp_path_factory):
    yield from reasoning_client(tiny_llama_eager_artifact, tmp_path_factory.mktemp("server"),
                                "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                "--reasoning-parser", "qwen3")


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_live_server_returns_reasoning_and_calls(qwen3_client, stream):
    """Reasoning and content apart, and the hermes call read from the content (a regex is a structured output: the
    reasoning is what the explicit tags hold)."""
    check_reasoning_and_call(*qwen3_client, FORCED_ANSWER, FORCED_CALL, stream)


def test_a_tool_parsers_special_markers_stay_and_the_other_special_tokens_are_left_out(tmp_path):
    """Plain-text think tags, but a tool-call parser whose markers are special tokens: the text is decoded with
    special tokens kept for that parser, so the reasoning parser leaves the others (the end of turn) out of the
    reasoning and the content, and hands the markers on."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|user|>",
                            additional_special_tokens=["<call>", "</call>"]).save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    plain = think_tag_parser("deepseek_r1", tokenizer, None, [0], constrained=False, skip_special_tokens=None)
    assert not plain.keeps_special_tokens and plain.dropped == ()
    parser = think_tag_parser("deepseek_r1", tokenizer, None, [0], constrained=False, skip_special_tokens=None,
                              tool_markers=("<call>", "</call>"))
    assert parser.dropped == ("<|user|>",)
    assert parser.split("a<|user|></think>b<call>x</call><|user|>") == ("a", "b<call>x</call>")
    assert parser.split("a<|user|>") == ("a", None)                       # cut inside the reasoning
    assert streamed(parser, "a<|user|></think>b<call>x</call><|user|>", 2) == ("a", "b<call>x</call>")
