"""A chat choice whose text is harmony (GPT-OSS, server/serving/harmony.py): the whole output as message fields, and the
stream of deltas as messages are written.

Reasoning goes out under both names vLLM has used, `reasoning` (its current one) and `reasoning_content` (the
earlier one, which many clients still read), when the server runs `--reasoning-parser openai_gptoss`; calls as
`tool_calls` when the request lets the model call tools (tool_choice auto, `--tool-call-parser openai`): the call's
id and name as soon as its header is written, then its arguments as they come. What a stream sends adds up to
what the whole text reads as.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from atom_aot.server.options import ServerOptions
from atom_aot.server.serving.harmony import FUNCTIONS, START, HarmonyMessage, held_back, parse_messages, read_output
from atom_aot.server.serving.reasoning_parsers import reasoning_fields
from atom_aot.server.serving.tool_calls import ToolPlan
from atom_aot.server.serving.tool_parsers import ParsedOutput, ToolCall


@dataclass(frozen=True)
class HarmonyFields:
    """What a request's harmony output is read into."""
    reasoning: bool                  # the reasoning, as `reasoning` / `reasoning_content`
    tools: bool                      # function calls, as `tool_calls`
    max_calls: int | None = None     # 1 with parallel_tool_calls false


def harmony_fields(options: ServerOptions, plan: ToolPlan | None) -> HarmonyFields | None:
    """How this request's output is read as harmony; None where it is not: the server reads no harmony (neither
    `--reasoning-parser openai_gptoss` nor `--tool-call-parser openai`), or a grammar writes the output (tool_choice
    required or named: plain JSON, read by the plan)."""
    if options.reasoning_parser != "openai_gptoss" and options.tool_call_parser != "openai":
        return None
    if plan is not None and plan.mode != "auto":
        return None
    return HarmonyFields(reasoning=options.reasoning_parser == "openai_gptoss", tools=plan is not None,
                         max_calls=None if plan is None else plan.max_calls)


def harmony_message(fields: HarmonyFields, text: str) -> tuple[dict, ParsedOutput]:
    """The assistant message of a whole output, and what it parsed to (its finish reason follows from that)."""
    out = read_output(text)
    calls = [ToolCall(name, arguments) for name, arguments in out.calls][:fields.max_calls] if fields.tools else []
    message = {"role": "assistant", "content": out.content,
               **(reasoning_fields(out.reasoning) if fields.reasoning else {})}
    if calls:
        message["tool_calls"] = [call.as_openai() for call in calls]
    return message, ParsedOutput(out.content, calls)


@dataclass
class HarmonyStream:
    fields: HarmonyFields
    plan: ToolPlan | None = None     # the request's tool plan (auto), for the finish reason
    text: str = ""
    base: int = 0                    # where the first message not yet wholly sent starts in `text`
    done: int = 0                    # messages before `base`
    sent: dict[int, int] = field(default_factory=dict)        # message number -> characters of it sent
    calls: dict[int, int] = field(default_factory=dict)       # message number -> its tool call's index
    begun: set[str] = field(default_factory=set)              # kinds already sent ("reasoning", "content")

    def delta(self, delta_text: str, finished: bool) -> dict:
        self.text += delta_text
        messages = parse_messages(self.text[self.base:])
        if finished and not self.done and not any(m.header_done for m in messages):
            return self._send("content", 0, self.text, "")        # no harmony in it: all of it is content
        out: dict = {}
        for number, message in enumerate(messages, self.done):
            if message.header_done:
                self._add(out, number, message, finished)
        self._advance(messages)
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        """The plan's finish reason (tool_calls when calls were read) for the whole text."""
        return self.plan.finish_reason(harmony_message(self.fields, self.text)[1], reason) if self.plan else reason

    def _add(self, out: dict, number: int, message: HarmonyMessage, finished: bool) -> None:
        shown = len(message.content) if message.ended or finished else len(message.content) - held_back(message.content)
        start = self.sent.get(number, 0)
        piece = message.content[start:shown]
        if message.kind == "call":
            self._call_delta(out, number, message, piece, first=number not in self.sent)
        elif message.kind == "content" or self.fields.reasoning:
            joined = "\n" if start == 0 and message.kind in self.begun else ""
            for key, value in self._send(message.kind, number, piece, joined).items():
                out[key] = out.get(key, "") + value
        self.sent[number] = max(start, shown)

    def _send(self, kind: str, number: int, piece: str, joined: str) -> dict:
        if not piece:
            return {}
        self.begun.add(kind)
        text = joined + piece
        return reasoning_fields(text) if kind == "reasoning" else {"content": text}

    def _call_delta(self, out: dict, number: int, message: HarmonyMessage, piece: str, first: bool) -> None:
        if not self.fields.tools:
            return
        if first:
            if self.fields.max_calls is not None and len(self.calls) >= self.fields.max_calls:
                return
            self.calls[number] = len(self.calls)
            call = ToolCall(message.recipient.removeprefix(FUNCTIONS), piece)
            out.setdefault("tool_calls", []).append({"index": self.calls[number], **call.as_openai()})
        elif number in self.calls and piece:
            out.setdefault("tool_calls", []).append({"index": self.calls[number], "function": {"arguments": piece}})

    def _advance(self, messages: list[HarmonyMessage]) -> None:
        """Parse later deltas from the first message not yet wholly sent (an ended message is sent whole)."""
        while len(messages) > 1 and messages[0].ended:
            self.base = self.text.find(START, self.base + 1)
            self.done += 1
            messages = messages[1:]
