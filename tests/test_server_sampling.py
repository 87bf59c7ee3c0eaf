"""vLLM's sampling and structured-output request fields through the official openai SDK, live (one
server on the eager tiny-llama artifact): penalties, logit_bias, min_tokens, bad_words change the
output as vLLM's do; response_format and guided_* outputs parse and validate (random weights: only the
grammar's mask makes them valid); tool calls, named and required (forced by a grammar) and auto (read by
the hermes parser), whole and streamed."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from test_server_compat import client, model_name, post, root  # noqa: F401 (fixtures)
from test_server_support import ServerProcess

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tiny_llama_eager_artifact, tmp_path_factory):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("server"), "--enable-auto-tool-choice",
                         "--tool-call-parser", "hermes")
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def tokens_of(root):
    return lambda text: post(root, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]


def test_penalties_change_greedy_output(client, model_name):
    plain = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    for fields in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"extra_body": {"repetition_penalty": 3.0}}):
        extra = {"ignore_eos": True, **fields.pop("extra_body", {})}
        penalized = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0,
                                              extra_body=extra, **fields).choices[0].text
        assert penalized != plain, fields


def test_logit_bias_forces_a_token_in_chat(client, model_name, tokens_of):
    forced = tokens_of(" fox")[-1]
    reply = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=1.0, seed=3, logit_bias={str(forced): 100},
                                           extra_body={"ignore_eos": True})
    assert tokens_of(reply.choices[0].message.content) == tokens_of(" fox" * 4)


def test_min_tokens_delays_eos(client, model_name, tokens_of):
    eos_text = "<|im_end|>"
    eos = tokens_of(eos_text)[-1]
    for min_tokens, count in ((0, 1), (6, 7)):
        out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20, temperature=0,
                                        logit_bias={str(eos): 100}, extra_body={"min_tokens": min_tokens})
        assert out.usage.completion_tokens == count and out.choices[0].finish_reason == "stop"


def test_bad_words_are_never_completed(client, model_name, tokens_of):
    """"Hello" (one token) biased up is all the model says; banned as a word it never appears, banned
    twice over ("HelloHello": two tokens, whose steps run synchronously) it never appears twice in a row."""
    [hello] = tokens_of("Hello")
    ask = dict(model=model_name, prompt=PROMPT, max_tokens=12, temperature=0, logit_bias={str(hello): 50})
    assert client.completions.create(**ask, extra_body={"ignore_eos": True}).choices[0].text == "Hello" * 12
    for words, ok in ((["Hello"], lambda ids: hello not in ids),
                      (["HelloHello"], lambda ids: hello in ids and [hello, hello] not in [ids[i:i + 2] for i in
                                                                                        range(len(ids))])):
        out = client.completions.create(**ask, logprobs=0, extra_body={"ignore_eos": True, "bad_words": words})
        ids = [tokens_of(token)[0] if tokens_of(token) else None for token in out.choices[0].logprobs.tokens]
        assert ok(ids), (words, out.choices[0].text)


# -- structured outputs --------------------------------------------------------------------------
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "sure", "tags"],
          "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]}, "sure": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}}
CHAT = [{"role": "user", "content": "Answer in JSON"}]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_outputs_parse_and_validate(client, model_name, seed):
    """Random weights, sampled at temperature 1: only the grammar's mask makes the output valid."""
    reply = client.chat.completions.create(
        model=model_name, messages=CHAT, max_tokens=60, temperature=1.0, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_vllm_guided_fields_on_both_endpoints(client, model_name):
    regex = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20, temperature=1.0, seed=4,
                                      extra_body={"guided_regex": "[a-c]{3}-[0-9]{2}"}).choices[0]
    assert re.fullmatch("[a-c]{3}-[0-9]{2}", regex.text) and regex.finish_reason == "stop"
    choices = ["red", "green", "blue and more"]
    for seed in range(3):
        picked = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=20, temperature=1.0,
                                                seed=seed, extra_body={"guided_choice": choices})
        assert picked.choices[0].message.content in choices
    guided = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=60, temperature=0.7, seed=5,
                                       extra_body={"guided_json": SCHEMA}).choices[0]
    jsonschema.validate(json.loads(guided.text), SCHEMA)
    nested = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20, temperature=0.7, seed=5,
                                       extra_body={"structured_outputs": {"regex": "(yes|no)!"}}).choices[0]
    assert nested.text in ("yes!", "no!")


def test_json_object_mode(client, model_name, tokens_of):
    """A JSON object (as OpenAI and vLLM mean json_object), even with "[" and "]" biased up; "}" and EOS
    biased up so that random weights close it at once."""
    close, eos = tokens_of("}")[-1], tokens_of("<|im_end|>")[-1]
    array = {str(tokens_of(bracket)[-1]): 60 for bracket in ("[", "]")}
    reply = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=30, temperature=0,
                                           response_format={"type": "json_object"},
                                           logit_bias={str(close): 40, str(eos): 40, **array})
    assert json.loads(reply.choices[0].message.content) == {}


def test_streamed_structured_output(client, model_name):
    stream = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=60, temperature=1.0, seed=7,
                                            stream=True, extra_body={"guided_json": SCHEMA})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, words", [
    ({"guided_regex": "(("}, "does not compile"),
    ({"guided_json": {"type": 5}}, "does not compile"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "one structured output"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"guided_decoding_backend": "outlines", "guided_regex": "a"}, "xgrammar"),
])
def test_bad_structured_outputs_are_refused(client, model_name, body, words):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5, extra_body=body)
    assert words in str(error.value)


# -- tool calls ----------------------------------------------------------------------------------
CITY = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "unit": {"enum": ["C", "F"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "additionalProperties": False, "properties": {}}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_named_tool_choice_forces_a_valid_call(client, model_name):
    reply = client.chat.completions.create(model=model_name, messages=ASK, tools=TOOLS, tool_choice=NAMED,
                                           max_tokens=40, temperature=1.0, seed=1)
    choice = reply.choices[0]
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.type == "function" and call.id
    jsonschema.validate(json.loads(call.function.arguments), CITY)
    assert choice.finish_reason == "stop" and not choice.message.content


def test_named_tool_call_streams_its_arguments(client, model_name):
    chunks = list(client.chat.completions.create(model=model_name, messages=ASK, tools=TOOLS, tool_choice=NAMED,
                                                 max_tokens=40, temperature=1.0, seed=2, stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0][0].function.name == "get_weather" and deltas[0][0].id
    arguments = "".join(d[0].function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), CITY)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_calls_one_of_the_tools(client, model_name, stream, tokens_of):
    """Random weights would add calls until max_tokens: "]" and EOS are biased up (the grammar still
    allows them only where the array may end)."""
    close, eos = tokens_of("]")[-1], tokens_of("<|im_end|>")[-1]
    ask = dict(model=model_name, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=1.0,
               seed=3, logit_bias={str(close): 30, str(eos): 30})
    if stream:
        chunks = list(client.chat.completions.create(**ask, stream=True))
        calls = [call for c in chunks if c.choices and c.choices[0].delta.tool_calls for call in c.choices[0].delta.tool_calls]
        finish_reason = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**ask).choices[0]
        calls, finish_reason = choice.message.tool_calls, choice.finish_reason
    assert calls and finish_reason == "tool_calls"
    for call in calls:
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            jsonschema.validate(arguments, CITY)
        else:
            assert call.function.name == "get_time" and arguments == {}


HERMES_CALL = (r'Checking\.<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "unit": "C"\}\}\n'
               r'</tool_call>')
TWO_CALLS = HERMES_CALL + r'\n<tool_call>\n\{"name": "get_time", "arguments": \{\}\}\n</tool_call>'


def streamed_calls(chunks) -> list[dict]:
    """Tool calls put together from a stream's deltas as a client does: by index, arguments concatenated."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": "", "deltas": 0})
            call["id"] = call["id"] or piece.id
            call["name"] = call["name"] or (piece.function.name if piece.function else None)
            call["arguments"] += (piece.function.arguments or "") if piece.function else ""
            call["deltas"] += 1
    return [calls[i] for i in sorted(calls)]


def ask_hermes(client, model_name, regex: str, stream: bool, **fields):
    ask = dict(model=model_name, messages=ASK, tools=TOOLS, max_tokens=150, temperature=1.0, seed=4,
               extra_body={"guided_regex": regex}, **fields)
    if stream:
        chunks = list(client.chat.completions.create(**ask, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return content, streamed_calls(chunks), chunks[-1].choices[0].finish_reason
    choice = client.chat.completions.create(**ask).choices[0]
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
    return choice.message.content, calls, choice.finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reads_hermes_calls_from_the_text(client, model_name, stream):
    """The model's text is forced (a regex) into Hermes' format; the parser turns it into tool_calls,
    streamed as the text comes: the name first, then the arguments in pieces."""
    content, calls, finish_reason = ask_hermes(client, model_name, HERMES_CALL, stream)
    assert content == "Checking." and finish_reason == "tool_calls"
    [call] = calls
    assert call["name"] == "get_weather" and call["id"] and json.loads(call["arguments"])["city"] in ("Paris", "Rome")
    assert not stream or call["deltas"] > 3


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_returns_the_first_call(client, model_name, stream):
    _, calls, _ = ask_hermes(client, model_name, TWO_CALLS, stream)
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    _, calls, finish_reason = ask_hermes(client, model_name, TWO_CALLS, stream, parallel_tool_calls=False)
    assert [c["name"] for c in calls] == ["get_weather"] and finish_reason == "tool_calls"


def test_conversation_with_tool_results_and_tool_choice_none(client, model_name):
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    choice = client.chat.completions.create(model=model_name, messages=messages, tools=TOOLS, tool_choice="none",
                                            max_tokens=5, temperature=0).choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")


# -- stop strings at the edges of max_tokens --------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_completed_by_the_last_allowed_token(client, model_name, tokens_of, stream):
    """"Hello" is all the model says; the stop string needs three of them and max_tokens allows three."""
    [hello] = tokens_of("Hello")
    ask = dict(model=model_name, prompt=PROMPT, temperature=0, logit_bias={str(hello): 50}, stop=["lloHelloHe"],
               extra_body={"ignore_eos": True})
    short = client.completions.create(**ask, max_tokens=2).choices[0]
    assert (short.text, short.finish_reason) == ("HelloHello", "length")
    if stream:
        chunks = list(client.completions.create(**ask, max_tokens=3, stream=True))
        text, reason = "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**ask, max_tokens=3).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert (text, reason) == ("He", "stop")


def test_chat_template_kwargs_reach_the_template(client, model_name):
    """enable_thinking (Qwen3's) and the like are template variables; the template's own arguments are not."""
    client.chat.completions.create(model=model_name, messages=ASK, max_tokens=2,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    with pytest.raises(openai.BadRequestError, match="add_generation_prompt"):
        client.chat.completions.create(model=model_name, messages=ASK, max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
