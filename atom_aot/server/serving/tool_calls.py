"""Tool calling for chat completions, as vLLM does it.

- `auto` (the default when a request has tools): the model writes calls in its family's format,
  read by the server's `--tool-call-parser` (needs `--enable-auto-tool-choice`, as in vLLM).
- `required`: a grammar forces a JSON array of one or more {"name", "parameters"} objects, one of the tools each.
- a named function: a grammar forces that function's arguments (its parameters' JSON schema).
- `none`: plain text (the template still sees the tools, as vLLM's default).

`parallel_tool_calls: false` keeps the first call only (required: a grammar of one call), as vLLM.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Literal

from atom_aot.runtime.sampling_params import GrammarSpec
from atom_aot.server.options import ServerOptions
from atom_aot.server.protocol.errors import bad_request
from atom_aot.server.protocol.requests import ChatCompletionRequest
from atom_aot.server.serving.markers import HiddenTokens, other_specials
from atom_aot.server.serving.tool_parsers import ParsedOutput, PartialCall, ToolCall, call_of, tool_parser

ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    mode: Literal["auto", "required", "named"]
    parser: object | None = None          # auto: one of TOOL_PARSERS
    function: str | None = None           # named: the function every output calls
    grammar: GrammarSpec | None = None    # required, named
    max_calls: int | None = None          # 1 with parallel_tool_calls false
    hidden: HiddenTokens | None = None    # auto: the text keeps special tokens (the parser's markers are); the others

    @property
    def keeps_special_tokens(self) -> bool:
        """The output is decoded with its special tokens kept, since the parser reads some."""
        return self.hidden is not None

    @property
    def kept_markers(self) -> tuple[str, ...]:
        """The parser's markers, where the text keeps special tokens for them (a reasoning parser leaves them in)."""
        return tuple(getattr(self.parser, "MARKERS", ())) if self.keeps_special_tokens else ()

    def parse(self, text: str) -> ParsedOutput:
        if self.hidden is not None:
            text = self.hidden.visible(text)
        if self.mode == "named":
            return ParsedOutput(None, [ToolCall(self.function, text)])
        if self.mode == "required":
            try:
                return ParsedOutput(None, [call_of(obj, ("parameters",)) for obj in json.loads(text)])
            except (ValueError, TypeError):      # cut short by max_tokens: what was written is the content
                return ParsedOutput(text, [])
        parsed = self.parser.parse(text)
        return ParsedOutput(parsed.content, parsed.tool_calls[:self.max_calls])

    def finish_reason(self, parsed: ParsedOutput, reason: str | None) -> str | None:
        """vLLM's: "tool_calls" when auto found calls or required ended its array; a named call "stops"."""
        called = parsed.tool_calls and (self.mode == "auto" or (self.mode == "required" and reason == "stop"))
        return "tool_calls" if called else reason


def tool_plan(options: ServerOptions, req: ChatCompletionRequest, tokenizer=None) -> ToolPlan | None:
    """How this request's tools are called; None: plain text. With `tokenizer`, a parser whose markers it holds as
    special tokens has them kept in the text."""
    choice = req.effective_tool_choice
    max_calls = 1 if req.parallel_tool_calls is False else None
    if choice == "none":
        return None
    if choice == "auto":
        if not options.enable_auto_tool_choice:
            raise bad_request('tool_choice "auto" (the default when tools are given) needs the server started with '
                              '--enable-auto-tool-choice and --tool-call-parser; or send tool_choice "required", '
                              '"none" or a named function', param="tool_choice", code="invalid_value")
        parser = tool_parser(options.tool_call_parser, {t.function.name: t.function.parameters or {}
                                                        for t in req.tools or []})
        return ToolPlan("auto", parser=parser, max_calls=max_calls,
                        hidden=hidden_tokens(tokenizer, getattr(parser, "MARKERS", ())))
    if req.response_format is not None or req.grammar_spec is not None:
        raise bad_request(f"tool_choice {choice if isinstance(choice, str) else 'naming a function'} is decoded with "
                          f"a grammar, so it cannot be combined with another structured output", param="tool_choice",
                          code="invalid_value")
    if choice == "required":
        return ToolPlan("required", grammar=GrammarSpec("json_schema", json.dumps(_required_schema(req, max_calls))))
    function = next(tool.function for tool in req.tools if tool.function.name == choice.function.name)
    return ToolPlan("named", function=function.name,
                    grammar=GrammarSpec("json_schema", json.dumps(function.parameters or ANY_OBJECT)))


@functools.lru_cache(maxsize=8)
def hidden_tokens(tokenizer, markers: tuple[str, ...]) -> HiddenTokens | None:
    """The parser's view of `other_specials`: those tokens removed from its text; None where no marker is special."""
    others = None if tokenizer is None or not markers else other_specials(tokenizer, markers)
    return None if others is None else HiddenTokens(others)


def _required_schema(req: ChatCompletionRequest, max_calls: int | None) -> dict:
    """vLLM's: an array of at least one call (at most max_calls), each naming one of the tools with its
    parameters."""
    calls = [{"properties": {"name": {"type": "string", "enum": [tool.function.name]},
                             "parameters": tool.function.parameters or ANY_OBJECT},
              "required": ["name", "parameters"]} for tool in req.tools]
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
    return schema if max_calls is None else {**schema, "maxItems": max_calls}


@dataclass
class _Streamed:
    """What a stream has sent of one call."""
    id: str
    arguments_sent: int


@dataclass
class ToolCallStream:
    """One choice's stream: text deltas become content deltas while the text is surely content, and
    tool_calls deltas as calls are written: a call's id and name once its name is written, then its
    arguments as they come (the parser's partial read; the last delta completes them from the whole
    text's parse, which the partial read is a prefix of). `required` sends its calls at the end."""
    plan: ToolPlan
    text: str = ""                   # what the parser reads: the output without the plan's hidden tokens
    raw: str = ""                    # the output as decoded
    sent: int = 0                    # characters of text already sent as content (or, named, arguments)
    call: ToolCall | None = field(default=None)
    streamed: list[_Streamed] = field(default_factory=list)

    def delta(self, delta_text: str, finished: bool) -> dict:
        self.raw += delta_text
        self.text = self.raw if self.plan.hidden is None else self.plan.hidden.visible(self.raw, finished)
        if self.plan.mode == "named":
            return self._named_delta(delta_text)
        if finished:
            return self._final_delta()
        if self.plan.mode == "required":
            return {}
        delta = self._content_until(self.plan.parser.streamable(self.text))
        calls = self._partial_deltas(self.plan.parser.partial_calls(self.text)[:self.plan.max_calls])
        return {**delta, "tool_calls": calls} if calls else delta

    def finish_reason(self, reason: str | None) -> str | None:
        return self.plan.finish_reason(self.plan.parse(self.text), reason)

    def _final_delta(self) -> dict:
        parsed = self.plan.parse(self.text)
        content_end = len(parsed.content or "") if parsed.tool_calls else len(self.text)
        delta = self._content_until(content_end)
        calls = []
        for index, call in enumerate(parsed.tool_calls):
            if index < len(self.streamed):
                rest = call.arguments[self.streamed[index].arguments_sent:]
                calls += [{"index": index, "function": {"arguments": rest}}] if rest else []
            else:
                calls.append({"index": index, **call.as_openai()})
        return {**delta, "tool_calls": calls} if calls else delta

    def _partial_deltas(self, partials: list[PartialCall]) -> list[dict]:
        calls = []
        for index, partial in enumerate(partials):
            if index == len(self.streamed):
                header = ToolCall(partial.name, partial.arguments)
                self.streamed.append(_Streamed(header.id, len(partial.arguments)))
                calls.append({"index": index, **header.as_openai()})
                continue
            done = self.streamed[index]
            if len(partial.arguments) > done.arguments_sent:
                calls.append({"index": index, "function": {"arguments": partial.arguments[done.arguments_sent:]}})
                done.arguments_sent = len(partial.arguments)
        return calls

    def _content_until(self, end: int) -> dict:
        if end <= self.sent:
            return {}
        piece, self.sent = self.text[self.sent:end], end
        return {"content": piece}

    def _named_delta(self, delta_text: str) -> dict:
        if self.call is None:
            self.call = ToolCall(self.plan.function, "")
            return {"tool_calls": [{"index": 0, **self.call.as_openai(), "function": {
                "name": self.plan.function, "arguments": delta_text}}]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": delta_text}}]} if delta_text else {}
