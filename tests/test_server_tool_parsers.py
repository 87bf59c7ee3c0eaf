"""The deepseek_v3, glm45 and qwen3_coder tool-call parsers in a live server (eager tiny-llama artifact), through
the openai SDK: a regex forces the model's text into each family's format, which the server returns as tool_calls,
whole and streamed (name first, then the arguments in pieces), values typed by the tool's schema."""
from __future__ import annotations

import json
import re

import pytest
from test_server_compat import sdk
from test_server_sampling import streamed_calls
from test_server_support import ServerProcess

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ASK = [{"role": "user", "content": "Weather in Paris for three days?"}]
FORCED = {     # parser -> a regex of one call after "Checking."
    "deepseek_v3": r'Checking\.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                   r'\{"city": "(Paris|Rome)", "days": [1-9]\}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "glm45": r"Checking\.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>(Paris|Rome)</arg_value>\n"
             r"<arg_key>days</arg_key>\n<arg_value>[1-9]</arg_value>\n</tool_call>",
    "qwen3_coder": r"Checking\.<tool_call>\n<function=get_weather>\n<parameter=city>\n(Paris|Rome)\n</parameter>\n"
                   r"<parameter=days>\n[1-9]\n</parameter>\n</function>\n</tool_call>",
}


@pytest.fixture(scope="module", params=sorted(FORCED))
def server(request, tiny_llama_eager_artifact, tmp_path_factory):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("server"), "--enable-auto-tool-choice",
                         "--tool-call-parser", request.param)
    proc.parser = request.param
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return sdk(server, "/v1")


@pytest.mark.parametrize("stream", [False, True])
def test_forced_call_comes_back_as_tool_calls(server, client, stream):
    ask = dict(model=client.models.list().data[0].id, messages=ASK, tools=TOOLS, max_tokens=300, temperature=1.0, seed=3,
               extra_body={"guided_regex": FORCED[server.parser]})
    if stream:
        chunks = list(client.chat.completions.create(**ask, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls, finish_reason = streamed_calls(chunks), chunks[-1].choices[0].finish_reason
        assert all(c["deltas"] > 2 for c in calls), "a name first, then the arguments in pieces"
    else:
        choice = client.chat.completions.create(**ask).choices[0]
        content, finish_reason = choice.message.content, choice.finish_reason
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in choice.message.tool_calls or []]
    assert content == "Checking." and finish_reason == "tool_calls"
    [call] = calls
    arguments = json.loads(call["arguments"])
    assert call["name"] == "get_weather" and call["id"] and arguments["city"] in ("Paris", "Rome")
    assert isinstance(arguments["days"], int) and re.fullmatch("[1-9]", str(arguments["days"]))
