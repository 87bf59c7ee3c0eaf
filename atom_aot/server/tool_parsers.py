"""Tool calls read from a model's text, as vLLM's parsers of the same names read them:

- `hermes` (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any
  number of them; the text before the first is the message content.
- `llama3_json` (Llama 3.x): the whole output is `{"name": ..., "parameters": {...}}` (several joined by
  `;`), optionally after `<|python_tag|>`; no content.

A text that does not parse as calls is plain content (vLLM does the same). `streamable` says how much
of a growing text is surely content, so a stream never shows the start of a call as text.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str                 # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ToolCall]


def call_of(obj, arguments_keys: tuple[str, ...]) -> ToolCall:
    """A call from its decoded JSON ({"name": ..., <arguments key>: {...}}); ValueError if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call is an object with a string name")
    arguments = next((obj[key] for key in arguments_keys if key in obj), {})
    return ToolCall(obj["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (it may be the marker's first half)."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if marker.startswith(text[-n:])), 0)


class HermesParser:
    START, END = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedOutput:
        start = text.find(self.START)
        if start < 0:
            return ParsedOutput(text, [])
        try:
            calls = [call_of(json.loads(body), ("arguments", "parameters")) for body in self._CALL.findall(text)]
        except ValueError:
            return ParsedOutput(text, [])
        return ParsedOutput(text[:start] or None, calls)

    def streamable(self, text: str) -> int:
        start = text.find(self.START)
        return start if start >= 0 else len(text) - _held_prefix(text, self.START)


class Llama3JsonParser:
    PYTHON_TAG = "<|python_tag|>"

    def parse(self, text: str) -> ParsedOutput:
        body = text.strip().removeprefix(self.PYTHON_TAG).strip()
        if not body.startswith("{"):
            return ParsedOutput(text, [])
        decoder, calls, at = json.JSONDecoder(), [], 0
        try:
            while at < len(body):
                obj, at = decoder.raw_decode(body, at)
                calls.append(call_of(obj, ("parameters", "arguments")))
                at = _skip_separator(body, at)
        except ValueError:
            return ParsedOutput(text, [])
        return ParsedOutput(None, calls)

    def streamable(self, text: str) -> int:
        start = text.lstrip()
        if not start or start.startswith("{") or self.PYTHON_TAG.startswith(start[:len(self.PYTHON_TAG)]):
            return 0          # may be a call: the whole output is held until it is parsed
        return len(text)


def _skip_separator(body: str, at: int) -> int:
    """Past the `;` (and blanks) between two calls; ValueError on anything else."""
    rest = body[at:].lstrip()
    if rest and not rest.startswith(";"):
        raise ValueError("calls are separated by ';'")
    return len(body) - len(rest.removeprefix(";").lstrip())


TOOL_PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}
