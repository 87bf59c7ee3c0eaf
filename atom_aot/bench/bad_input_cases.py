"""The bad-input table: requests a hostile or careless client sends, each built on demand (some are
megabytes). `python -m atom_aot.bench.bad_input` sends them to a running server one at a time while a
small request runs beside each; tests/test_server_hardening.py checks the same kinds of input.

A case is one HTTP request: a path, a body as bytes (some are not valid JSON on purpose) and headers.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Callable

JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Case:
    name: str
    path: str                                   # /v1/completions or /v1/chat/completions
    body: Callable[[str], bytes]                # model name -> request body
    headers: dict = field(default_factory=lambda: dict(JSON))
    why: str = ""                               # what the case probes


def _completion(**fields) -> Callable[[str], bytes]:
    return lambda model: json.dumps({"model": model, "prompt": "Hi", "max_tokens": 4, **fields}).encode()


def _chat(**fields) -> Callable[[str], bytes]:
    messages = [{"role": "user", "content": "Hi"}]
    return lambda model: json.dumps({"model": model, "messages": messages, "max_tokens": 4, **fields}).encode()


def _nested(depth: int, leaf=1) -> dict:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def _nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _raw(text: str) -> Callable[[str], bytes]:
    return lambda model: text.replace("MODEL", model).encode("utf-8", "surrogatepass")


def _deep_schema_format_chat(depth: int) -> Callable[[str], bytes]:
    """A chat body whose response_format schema nests `depth` objects, written as text: the dict form
    is too deep for json.dumps itself."""
    schema = '{"type":"object","properties":{"a":' * depth + '{"type":"string"}' + '},"required":["a"]}' * depth
    return _raw('{"model":"MODEL","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,'
                '"response_format":{"type":"json_schema","json_schema":{"name":"out","schema":' + schema + '}}}')


NUMBERS = [
    Case("top_k 1e20", "/v1/completions", _completion(top_k=10**20), why="an int no tensor holds"),
    Case("chat top_k 1e19", "/v1/chat/completions", _chat(top_k=10**19), why="an int no tensor holds"),
    Case("seed -1e20", "/v1/completions", _completion(seed=-10**20)),
    Case("n 1e9", "/v1/completions", _completion(n=10**9)),
    Case("max_tokens 1e20", "/v1/completions", _completion(max_tokens=10**20)),
    Case("logit_bias key of 5000 digits", "/v1/completions", _completion(logit_bias={"9" * 5000: 1})),
    Case("logit_bias key Arabic-Indic digit", "/v1/completions", _completion(logit_bias={"\u0663": 5})),
    Case("logit_bias value 1e300", "/v1/completions", _completion(logit_bias={"3": 1e300})),
    Case("min_tokens > max_tokens", "/v1/completions", _completion(min_tokens=9)),
    Case("integer of 5000 digits", "/v1/completions", _raw('{"model":"MODEL","prompt":"Hi","max_tokens":' + "9" * 5000 + "}")),
]

SHAPES = [
    Case("surrogate in a key", "/v1/completions", _raw('{"model":"MODEL","prompt":"hi","\\ud800":1}')),
    Case("chat_template_kwargs nested 900 deep", "/v1/chat/completions", _chat(chat_template_kwargs=_nested(900))),
    Case("body nested 1500 deep", "/v1/completions", _raw('{"model":"MODEL","prompt":"hi","x":' + "[" * 1500 + "]" * 1500 + "}")),
    Case("tool schema nested 300 deep, named tool_choice", "/v1/chat/completions",
         _chat(tools=[_tool("f", _nested_schema(300))], tool_choice={"type": "function", "function": {"name": "f"}})),
    Case("invalid UTF-8", "/v1/completions", lambda model: b'{"model":"' + model.encode() + b'","prompt":"\xff\xfe"}'),
    Case("gzip body", "/v1/completions", lambda model: gzip.compress(_completion()(model)),
         headers={**JSON, "content-encoding": "gzip"}),
    Case("empty prompt", "/v1/completions", _completion(prompt="")),
    Case("json and regex together", "/v1/completions",
         _completion(structured_outputs={"json": {"type": "object"}, "regex": "zzz"})),
    Case("choice and regex together", "/v1/completions",
         _completion(structured_outputs={"choice": ["a", "b"], "regex": "zzz"})),
]

GRAMMARS = [
    Case("guided_regex of a 1 MB literal", "/v1/completions", _completion(guided_regex="a" * (1 << 20))),
    Case("guided_choice of 100,000 choices", "/v1/completions", _completion(guided_choice=[f"c{i}" for i in range(100_000)])),
    Case("response_format enum of 100,000 strings", "/v1/chat/completions",
         _chat(response_format=_json_schema_format({"enum": [f"e{i}" for i in range(100_000)]}))),
    Case("10,000 tools, tool_choice required", "/v1/chat/completions",
         _chat(tools=[_tool(f"f{i}", {"type": "object", "properties": {}}) for i in range(10_000)],
               tool_choice="required")),
    Case("response_format schema nested 900 deep", "/v1/chat/completions", _deep_schema_format_chat(900)),
    Case("enum of 20,000 strings of 110 characters", "/v1/chat/completions",
         _chat(response_format=_json_schema_format({"enum": [f"{i:0110d}" for i in range(20_000)]}))),
]

CASES: tuple[Case, ...] = (*NUMBERS, *SHAPES, *GRAMMARS)
