"""Tool calls written as a name and its arguments one by one in tags, as vLLM's `glm45` and `qwen3_coder`
parsers read them:

    glm45 (GLM-4.5, GLM-4.6):  <tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...</tool_call>
    qwen3_coder (Qwen3-Coder): <tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n...</function>\\n</tool_call>

Each value is text, typed by the tool's JSON schema (server/serving/typed_arguments.py), and the arguments are
the JSON object of the typed values, in the order written (a key written twice keeps its first value). The text
before the first call is the content. As in vLLM, a Qwen3-Coder call may leave out `<tool_call>` and a parameter
its `</parameter>` (the next parameter or `</function>` ends it). A text whose calls do not all parse (one cut
short before its `</tool_call>` / `</function>`, anything but blanks between its parts) is all content.
Streams send a call's name once it is written, then each argument as its value closes; a value the schema
declares a string goes out as it is written (vLLM's qwen3_coder streams those too), so what a stream sends adds
up to the whole text's parse.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from atom_aot.server.serving.markers import held_prefix
from atom_aot.server.serving.tool_call_types import ParsedOutput, PartialCall, ToolCall, is_function_name
from atom_aot.server.serving.typed_arguments import (STRING_TYPES, glm_value, property_schema, qwen_text, qwen_value,
                                                     type_of)


@dataclass(frozen=True)
class TagFormat:
    call_start: str                       # what begins a call (the text before the first is the content)
    name_end: str                         # what ends the name (consumed) ...
    name_also_ends_at: tuple[str, ...]    # ... or these (left for what follows)
    key_open: str
    key_close: str
    value_open: str                       # after the key and blanks ("" when the key's tag opens the value)
    value_close: str                      # what ends a value (consumed) ...
    value_also_ends_at: tuple[str, ...]   # ... or these (left for what follows)
    call_close: str


@dataclass(frozen=True)
class _ReadCall:
    name: str
    params: list[tuple[str, str]]           # the closed parameters: key, value as written
    open_param: tuple[str, str] | None      # a parameter whose value is being written: key, value so far
    end: int | None                         # offset in the section past the call's close, once written


class _TaggedParser:
    READS_SCHEMAS = True
    FORMAT: TagFormat
    CONTENT_ENDS: tuple[str, ...]         # markers that end the content

    def __init__(self, schemas: dict[str, dict] | None = None):
        self.schemas = schemas or {}      # function name -> its parameters' JSON schema

    def value(self, function: str, key: str, raw: str):
        raise NotImplementedError

    def string_so_far(self, function: str, key: str, raw: str) -> str | None:
        """The text a value being written surely begins with, if the schema makes it a string; else None."""
        raise NotImplementedError

    def parse(self, text: str) -> ParsedOutput:
        start, calls = self._content_end(text), []
        for section in text.split(self.FORMAT.call_start)[1:]:
            call = self._read(section)
            if call is None or call.end is None:
                return ParsedOutput(text, [])
            calls.append(ToolCall(call.name, self._arguments(call)))
        return ParsedOutput(text[:start] or None, calls) if calls else ParsedOutput(text, [])

    def streamable(self, text: str) -> int:
        start = self._content_end(text)
        return start if start < len(text) else len(text) - max(held_prefix(text, m) for m in self.CONTENT_ENDS)

    def partial_calls(self, text: str) -> list[PartialCall]:
        calls = []
        for section in text.split(self.FORMAT.call_start)[1:]:
            call = self._read(section)
            if call is None:
                break
            calls.append(PartialCall(call.name, self._arguments(call), call.end is not None, call.end))
            if call.end is None:
                break
        return calls

    def _content_end(self, text: str) -> int:
        return min((i for i in (text.find(m) for m in self.CONTENT_ENDS) if i >= 0), default=len(text))

    def _read(self, section: str) -> _ReadCall | None:
        """The call `section` (the text after a call's start) holds as far as it is written; None while its name
        is not, or when the name is none."""
        fmt = self.FORMAT
        ends = [(i, m) for i, m in ((section.find(m), m) for m in (fmt.name_end, *fmt.name_also_ends_at)) if i >= 0]
        if not ends:
            return None
        at, marker = min(ends)
        name = section[:at].strip()
        if not is_function_name(name):
            return None
        return _ReadCall(name, *_read_params(section, at + len(marker) if marker == fmt.name_end else at, fmt))

    def _arguments(self, call: _ReadCall) -> str:
        """The arguments' JSON text; of a call not yet closed, the part that is surely theirs."""
        values = {}
        for key, raw in call.params:
            values.setdefault(key, self.value(call.name, key, raw))
        text = json.dumps(values, ensure_ascii=False)
        if call.end is not None:
            return text
        so_far = None
        if call.open_param is not None and call.open_param[0] not in values:
            so_far = self.string_so_far(call.name, *call.open_param)
        if so_far is not None:
            key = json.dumps(call.open_param[0], ensure_ascii=False)
            return text[:-1] + (", " if values else "") + f"{key}: " + json.dumps(so_far, ensure_ascii=False)[:-1]
        return text[:-1] if values else ""


def _read_params(body: str, at: int, fmt: TagFormat) -> tuple[list, tuple[str, str] | None, int | None]:
    """The parameters from `at` on: the closed ones, the one being written, and the end of the call's close."""
    params = []
    while True:
        at = _past_blanks(body, at)
        if body.startswith(fmt.call_close, at):
            return params, None, at + len(fmt.call_close)
        key_end = body.find(fmt.key_close, at + len(fmt.key_open))
        if not body.startswith(fmt.key_open, at) or key_end < 0:
            return params, None, None          # more to come, or no call: not closed either way
        key, at = body[at + len(fmt.key_open):key_end].strip(), key_end + len(fmt.key_close)
        if fmt.value_open:
            at = _past_blanks(body, at)
            if not body.startswith(fmt.value_open, at):
                return params, None, None
            at += len(fmt.value_open)
        ends = [(i, m) for i, m in ((body.find(m, at), m) for m in (fmt.value_close, *fmt.value_also_ends_at)) if i >= 0]
        if not ends:
            written = body[at:]
            held = max(held_prefix(written, m) for m in (fmt.value_close, *fmt.value_also_ends_at))
            return params, (key, written[:len(written) - held]), None
        end, marker = min(ends)
        params.append((key, body[at:end]))
        at = end + len(marker) if marker == fmt.value_close else end


def _past_blanks(text: str, at: int) -> int:
    return len(text) - len(text[at:].lstrip()) if at < len(text) else at


class Glm45Parser(_TaggedParser):
    MARKERS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    FORMAT = TagFormat("<tool_call>", "\n", ("<arg_key>", "</tool_call>"), "<arg_key>", "</arg_key>", "<arg_value>",
                       "</arg_value>", (), "</tool_call>")
    CONTENT_ENDS = ("<tool_call>",)

    def value(self, function: str, key: str, raw: str):
        return glm_value(raw, property_schema(self.schemas, function, key))

    def string_so_far(self, function: str, key: str, raw: str) -> str | None:
        return raw.strip() if type_of(property_schema(self.schemas, function, key)) == "string" else None


class Qwen3CoderParser(_TaggedParser):
    MARKERS = ("<tool_call>", "</tool_call>")
    FORMAT = TagFormat("<function=", ">", (), "<parameter=", ">", "", "</parameter>", ("<parameter=", "</function>"),
                       "</function>")
    CONTENT_ENDS = ("<tool_call>", "<function=")

    def value(self, function: str, key: str, raw: str):
        return qwen_value(raw, property_schema(self.schemas, function, key))

    def string_so_far(self, function: str, key: str, raw: str) -> str | None:
        prop = property_schema(self.schemas, function, key)
        if prop is not None and (type_of(prop) or "string") not in STRING_TYPES:
            return None
        so_far = qwen_text(raw)
        return None if "null".startswith(so_far.lower()) else so_far      # "null" would be null
