"""DeepSeek's tool calls, as vLLM's `deepseek_v3` and `deepseek_v31` parsers read them.

After the content, the calls sit between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each between
`<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`:

    deepseek_v3  (V3, R1):  <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>
    deepseek_v31 (V3.1):    <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>

ARGS is the arguments' JSON object, returned as written. The markers are tokens of DeepSeek's vocabulary; a
tokenizer that holds them as special tokens has them kept in the text (server/serving/tool_calls.py), one
that lacks them spells them as plain text, read the same way. What follows `<｜tool▁calls▁end｜>` is not read
(vLLM's neither). A text whose calls do not all parse (one cut short, arguments that are not a JSON object,
anything but blanks between calls) is all content, as vLLM returns what it cannot parse.
"""
from __future__ import annotations

import json
import re

from atom_aot.server.serving.markers import held_prefix
from atom_aot.server.serving.tool_call_types import ParsedOutput, PartialCall, ToolCall

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class _DeepSeekParser:
    MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    ARGS_END = CALL_END

    def head(self, call: str) -> tuple[str, int | None] | None:
        """The name of the call `call` begins (the text after its begin marker) and where its arguments start
        (None: not yet); None while the name is not written, or when `call` is no call."""
        raise NotImplementedError

    def parse(self, text: str) -> ParsedOutput:
        start = text.find(CALLS_BEGIN)
        calls = None if start < 0 else self._whole_calls(text[start + len(CALLS_BEGIN):])
        if not calls:
            return ParsedOutput(text, [])
        return ParsedOutput(text[:start] or None, calls)

    def streamable(self, text: str) -> int:
        start = text.find(CALLS_BEGIN)
        return start if start >= 0 else len(text) - held_prefix(text, CALLS_BEGIN)

    def partial_calls(self, text: str) -> list[PartialCall]:
        start = text.find(CALLS_BEGIN)
        if start < 0:
            return []
        first, *sections = text[start + len(CALLS_BEGIN):].split(CALLS_END)[0].split(CALL_BEGIN)
        calls = []
        for section in sections if not first.strip() else []:
            call = self._read(section)
            if call is None:
                break
            calls.append(call)
        return calls

    def _whole_calls(self, body: str) -> list[ToolCall] | None:
        first, *sections = body.split(CALLS_END)[0].split(CALL_BEGIN)
        if first.strip():
            return None
        calls = []
        for section in sections:
            call = self._read(section)
            if call is None or call.end is None or section[call.end:].strip() or not _is_object(call.arguments):
                return None
            calls.append(ToolCall(call.name, call.arguments))
        return calls

    def _read(self, section: str) -> PartialCall | None:
        head = self.head(section)
        if head is None:
            return None
        name, start = head
        if start is None:
            return PartialCall(name, "", False, None)
        end = section.find(self.ARGS_END, start)
        if end >= 0:
            return PartialCall(name, section[start:end], True, end + len(self.ARGS_END))
        written = section[start:]
        return PartialCall(name, written[:len(written) - held_prefix(written, self.ARGS_END)], False, None)


class DeepSeekV3Parser(_DeepSeekParser):
    """V3 and R1: the call's type (`function`), the separator, the name on its line, the arguments in a json
    code block."""
    ARGS_END = "\n```" + CALL_END
    FENCE = "```json\n"
    _NAME_LINE = re.compile(r"[^\n]*?" + re.escape(SEP) + r"([^\n]*)\n")

    def head(self, call: str) -> tuple[str, int | None] | None:
        line = self._NAME_LINE.match(call)
        if line is None or not line.group(1).strip():
            return None
        after = call[line.end():]
        if after.startswith(self.FENCE):
            return line.group(1).strip(), line.end() + len(self.FENCE)
        return (line.group(1).strip(), None) if self.FENCE.startswith(after) else None


class DeepSeekV31Parser(_DeepSeekParser):
    """V3.1: the name, the separator, the arguments."""

    def head(self, call: str) -> tuple[str, int | None] | None:
        sep = call.find(SEP)
        if sep < 0 or not call[:sep].strip():
            return None
        return call[:sep].strip(), sep + len(SEP)


def _is_object(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except (ValueError, RecursionError):
        return False
