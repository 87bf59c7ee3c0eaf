"""Tool calls read from a model's text, as vLLM's parsers of the same names read them:

- `hermes` (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any
  number of them; the text before the first is the message content.
- `llama3_json` (Llama 3.x): the whole output is `{"name": ..., "parameters": {...}}` (several joined by
  `;`), optionally after `<|python_tag|>`; no content.

- `deepseek_v3` (DeepSeek-V3, R1) and `deepseek_v31` (DeepSeek-V3.1): calls between DeepSeek's markers, the
  arguments' JSON as written (server/serving/deepseek_tool_parsers.py).
- `glm45` (GLM-4.5, GLM-4.6) and `qwen3_coder` (Qwen3-Coder): a name and its arguments one by one in tags, each value
  typed by the tool's JSON schema (server/serving/xml_tool_parsers.py).
- `openai` (GPT-OSS): harmony messages to `functions.NAME` (server/serving/harmony.py); its streams and reasoning go
  through server/serving/harmony_stream.py, since harmony's content is not a prefix of the text.

A text that does not parse as calls is plain content (vLLM does the same). `streamable` says how much
of a growing text is surely content, so a stream never shows the start of a call as text, and
`partial_calls` reads the calls of a growing text as far as they go, so a stream can send a call's name
as soon as it is written and its arguments as they come. A call's `arguments` are the JSON text of the
value as the model wrote it (vLLM re-serializes it, which changes only blanks), so what a stream sends
adds up to what the whole text parses to.
"""
from __future__ import annotations

import json
import re

from atom_aot.server.serving.deepseek_tool_parsers import DeepSeekV3Parser, DeepSeekV31Parser
from atom_aot.server.serving.harmony import read_output
from atom_aot.server.serving.markers import held_prefix
from atom_aot.server.serving.tool_call_types import ParsedOutput, PartialCall, ToolCall
from atom_aot.server.serving.xml_tool_parsers import Glm45Parser, Qwen3CoderParser


def call_of(obj, arguments_keys: tuple[str, ...]) -> ToolCall:
    """A call from its decoded JSON ({"name": ..., <arguments key>: {...}}); ValueError if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call is an object with a string name")
    arguments = next((obj[key] for key in arguments_keys if key in obj), {})
    return ToolCall(obj["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))


_DECODER = json.JSONDecoder()
_NAME = r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"'


def read_call(body: str, arguments_keys: tuple[str, ...]) -> PartialCall | None:
    """`{"name": "...", "<key>": <value>}` read from the start of `body` as far as it goes (name first, as
    the models write it); None when the body cannot be, or cannot yet be seen to be, a call in that order."""
    named = re.match(_NAME, body)
    if named is None:
        return None
    name = json.loads(f'"{named.group(1)}"')
    head = re.compile(_NAME + r'\s*,\s*"(?:%s)"\s*:\s*' % "|".join(map(re.escape, arguments_keys))).match(body)
    if head is None:
        return PartialCall(name, "", False, None)
    start = head.end()
    try:
        value, end = _DECODER.raw_decode(body, start)
    except ValueError:
        value, end = None, None
    if end is not None and (isinstance(value, (dict, list)) or end < len(body)):   # a scalar may go on
        arguments = value if isinstance(value, str) else body[start:end]
        closing = re.compile(r"\s*\}").match(body, end)
        return PartialCall(name, arguments, True, closing.end() if closing else None)
    if body[start:start + 1] in ("", '"'):
        return PartialCall(name, "", False, None)           # a string value is sent whole, unescaped
    return PartialCall(name, body[start:].rstrip("} \t\r\n<"), False, None)


def parsed_call(body: str, arguments_keys: tuple[str, ...]) -> ToolCall:
    """The call a complete body holds (ValueError if it holds none), its arguments as the model wrote them."""
    call = call_of(json.loads(body), arguments_keys)
    partial = read_call(body, arguments_keys)
    if partial is not None and partial.complete and partial.name == call.name:
        return ToolCall(call.name, partial.arguments, call.id)
    return call


class HermesParser:
    START, END = "<tool_call>", "</tool_call>"
    MARKERS = (START, END)          # kept in the text where the tokenizer holds them as special tokens
    KEYS = ("arguments", "parameters")
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedOutput:
        start = text.find(self.START)
        if start < 0:
            return ParsedOutput(text, [])
        try:
            calls = [parsed_call(body, self.KEYS) for body in self._CALL.findall(text)]
        except ValueError:
            return ParsedOutput(text, [])
        return ParsedOutput(text[:start] or None, calls)

    def streamable(self, text: str) -> int:
        start = text.find(self.START)
        return start if start >= 0 else len(text) - held_prefix(text, self.START)

    def partial_calls(self, text: str) -> list[PartialCall]:
        """The calls begun so far; the last one's body may hold the first characters of the end marker."""
        calls = []
        for section in text.split(self.START)[1:]:
            body = section.split(self.END)[0]
            call = read_call(body[:len(body) - held_prefix(body, self.END)], self.KEYS)
            if call is None:
                break
            calls.append(call)
        return calls


class Llama3JsonParser:
    PYTHON_TAG = "<|python_tag|>"
    KEYS = ("parameters", "arguments")

    def parse(self, text: str) -> ParsedOutput:
        body = self._body(text)
        if not body.startswith("{"):
            return ParsedOutput(text, [])
        calls, at = [], 0
        try:
            while at < len(body):
                _, end = _DECODER.raw_decode(body, at)
                calls.append(parsed_call(body[at:end], self.KEYS))
                at = _skip_separator(body, end)
        except ValueError:
            return ParsedOutput(text, [])
        return ParsedOutput(None, calls)

    def partial_calls(self, text: str) -> list[PartialCall]:
        body, calls, at = self._body(text), [], 0
        while at < len(body):
            call = read_call(body[at:], self.KEYS)
            if call is None:
                break
            calls.append(call)
            if call.end is None:
                break
            rest = body[at + call.end:].lstrip()
            if not rest.startswith(";"):
                break
            at = len(body) - len(rest[1:].lstrip())
        return calls

    def _body(self, text: str) -> str:
        return text.strip().removeprefix(self.PYTHON_TAG).strip()

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


class OpenAIHarmonyParser:
    """GPT-OSS's calls: the harmony messages addressed to functions (server/serving/harmony.py); the content is the final
    answer (and any preamble), the reasoning left out (server/serving/harmony_stream.py reads it)."""

    def parse(self, text: str) -> ParsedOutput:
        out = read_output(text)
        return ParsedOutput(out.content, [ToolCall(name, arguments) for name, arguments in out.calls])


TOOL_PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser, "openai": OpenAIHarmonyParser,
                "deepseek_v3": DeepSeekV3Parser, "deepseek_v31": DeepSeekV31Parser, "glm45": Glm45Parser,
                "qwen3_coder": Qwen3CoderParser}


def tool_parser(name: str, schemas: dict[str, dict] | None = None):
    """The parser `--tool-call-parser NAME` names, for a request whose tools have these parameters' schemas
    (function name -> JSON schema; the parsers that type values by them read them)."""
    parser = TOOL_PARSERS[name]
    return parser(schemas) if getattr(parser, "READS_SCHEMAS", False) else parser()
