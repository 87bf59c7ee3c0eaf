"""The live check the reasoning parsers share (tests/test_harmony.py, tests/test_reasoning_parsers.py): a tiny model's
server whose output a regex forces into the family's format (byte-level pieces spell the markers), asked through the
openai SDK for an answer with reasoning and for a tool call, whole and streamed."""
from __future__ import annotations

import json
from pathlib import Path

import openai

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def reasoning_client(artifact: Path, log_dir: Path, *flags: str):
    """A fixture's body: (client, model) of a live server started with `flags`, stopped after."""
    from test_server_support import API_KEY, ServerProcess
    proc = ServerProcess(artifact, log_dir, *flags)
    try:
        server = proc.wait_healthy()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        yield client, client.models.list().data[0].id
    finally:
        proc.stop()


def check_reasoning_and_call(client: openai.OpenAI, model: str, forced_answer: str, forced_call: str, stream: bool):
    """`forced_answer` writes the reasoning "Think a." or "Think b." and the answer "Hi."; `forced_call` the reasoning
    "Call." and a call of get_weather for Oslo or Rome."""
    ask = dict(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=400, temperature=1.0, seed=5)
    answer = dict(ask, extra_body={"guided_regex": forced_answer})
    call = dict(ask, tools=WEATHER, extra_body={"guided_regex": forced_call})
    if not stream:
        message = client.chat.completions.create(**answer).choices[0].message
        assert message.content == "Hi." and message.model_extra["reasoning"] in ("Think a.", "Think b.")
        assert message.model_extra["reasoning_content"] == message.model_extra["reasoning"]
        choice = client.chat.completions.create(**call).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning"] == "Call."
        [tool_call] = choice.message.tool_calls
        assert tool_call.function.name == "get_weather" and json.loads(tool_call.function.arguments)["city"] in (
            "Oslo", "Rome")
        return
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**answer, stream=True) if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Hi."
    reasoning = [(d.model_extra or {}).get("reasoning") or "" for d in deltas]
    assert "".join(reasoning) in ("Think a.", "Think b.")
    assert reasoning == [(d.model_extra or {}).get("reasoning_content") or "" for d in deltas]
    assert not any(d.content for d in deltas[:max(i for i, r in enumerate(reasoning) if r) + 1])   # reasoning first
    chunks = [c for c in client.chat.completions.create(**call, stream=True) if c.choices]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    arguments = "".join(t.function.arguments or "" for c in chunks for t in c.choices[0].delta.tool_calls or [])
    assert json.loads(arguments)["city"] in ("Oslo", "Rome")
