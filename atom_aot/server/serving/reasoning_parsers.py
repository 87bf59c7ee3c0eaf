"""Reasoning read from the text of a think-tag model, as vLLM's reasoning parsers of the same names read it:

- `deepseek_r1` (DeepSeek-R1 and its distillations, QwQ): the chat template ends the prompt with `<think>`, so the
  output starts inside the reasoning; everything before the first `</think>` is reasoning, the rest is content
  (kept as written, a later `</think>` included). An output with no `</think>` (cut short) is all reasoning.
- `qwen3` (Qwen3, Qwen3.5): the same, and a `<tool_call>` written before `</think>` ends the reasoning (the call is
  content, for the tool parser); a second `</think>` is dropped. `chat_template_kwargs: {"enable_thinking": false}`
  makes the whole output content.
- `glm45` (GLM-4.5, GLM-4.6, GLM-4.7): as qwen3, and a `<think>` in the content opens reasoning again; the
  reasoning's trailing blanks are dropped; `thinking` or `enable_thinking` false in `chat_template_kwargs` makes the
  whole output content.

A `<think>` the model writes itself (older templates) is dropped. A prompt that already closes the reasoning (it ends
with `</think>`, as templates write it when thinking is off) makes the whole output content, as vLLM's check of the
prompt does. A structured output (a grammar) writes the output from its first token, so for such a request only
text inside an explicit `<think>...</think>` is reasoning.

A parser's `split` reads a whole output; its `stream` reads one as it grows, piece by piece, holding back what may
be the start of a tag; what a stream returns adds up to `split` of the whole text (the same reader does both).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from atom_aot.server.serving.markers import held_prefix, other_specials, special_texts

START, END, TOOL_CALL = "<think>", "</think>", "<tool_call>"


class ReasoningStream(Protocol):
    def feed(self, piece: str, finished: bool) -> tuple[str, str]:
        """The next piece of the output text -> (reasoning, content) that it surely adds ("" for none)."""


class ReasoningParser(Protocol):
    keeps_special_tokens: bool       # the text must be decoded with special tokens kept (the tags are special)

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A whole output -> (reasoning, content), None for an empty one."""

    def stream(self) -> ReasoningStream:
        """A reader of one output as it grows."""


@dataclass(frozen=True)
class ThinkTags:
    """One family's rules (the module's docstring)."""
    implicit_ends: tuple[str, ...] = ()     # markers that end the reasoning and begin the content
    reopens: bool = False                   # a <think> in the content opens reasoning again
    drops_stray_end: bool = False           # a </think> in the content is dropped
    strips_reasoning_end: bool = False      # the reasoning's trailing whitespace is dropped
    switches: tuple[str, ...] = ()          # chat_template_kwargs that turn thinking off when false

    def thinking(self, template_kwargs: dict | None) -> bool:
        """Whether the request lets the model think: on unless one of the family's switches is given, and then
        while any given one is true (vLLM's reading of enable_thinking / thinking)."""
        given = [value for key, value in (template_kwargs or {}).items() if key in self.switches]
        return not given or any(bool(value) for value in given)


THINK_TAGS = {
    "deepseek_r1": ThinkTags(),
    "qwen3": ThinkTags(implicit_ends=(TOOL_CALL,), drops_stray_end=True, switches=("enable_thinking",)),
    "glm45": ThinkTags(implicit_ends=(TOOL_CALL,), reopens=True, drops_stray_end=True, strips_reasoning_end=True,
                       switches=("thinking", "enable_thinking")),
}


@dataclass(frozen=True)
class ThinkTagParser:
    """How one request's output is read."""
    tags: ThinkTags
    thinking: bool = True                  # False: the whole output is content
    in_reasoning: bool = True              # the output starts inside the reasoning (the prompt opened it)
    keeps_special_tokens: bool = False     # the tags are special tokens: the text is decoded with them kept
    dropped: tuple[str, ...] = ()          # the other special tokens' texts, left out of what is read

    def split(self, text: str) -> tuple[str | None, str | None]:
        reasoning, content = self.stream().feed(text, finished=True)
        return reasoning or None, content or None

    def stream(self) -> ThinkTagStream:
        inside = self.thinking and self.in_reasoning
        return ThinkTagStream(self, reasoning=inside, opened=inside)


@dataclass
class ThinkTagStream:
    parser: ThinkTagParser
    reasoning: bool                    # the text read so far ended inside the reasoning
    opened: bool = False               # a reasoning section has begun (a later <think> opens one only if `reopens`)
    held: str = ""                     # text not yet read: it may be the start of a marker
    tail: str = ""                     # trailing reasoning whitespace not sent yet (strips_reasoning_end)
    pieces: dict[bool, list[str]] = field(default_factory=lambda: {True: [], False: []})

    def feed(self, piece: str, finished: bool) -> tuple[str, str]:
        text, self.held = self.held + piece, ""
        while text:
            markers = self._markers()
            hits = [(text.find(m), -len(m), m) for m in markers if m in text]
            if not hits:
                keep = 0 if finished else max((held_prefix(text, m) for m in markers), default=0)
                self.pieces[self.reasoning].append(text[:len(text) - keep])
                self.held = text[len(text) - keep:]
                break
            at, _, marker = min(hits)
            self.pieces[self.reasoning].append(text[:at])
            self._read(marker)
            text = text[at + len(marker):]
        reasoning, content = ("".join(self.pieces[kind]) for kind in (True, False))
        self.pieces = {True: [], False: []}
        return self._reasoning_part(reasoning), content

    def _markers(self) -> tuple[str, ...]:
        """What may change the reading of the text from here on."""
        tags, dropped = self.parser.tags, self.parser.dropped
        if not self.parser.thinking:
            return dropped
        if self.reasoning:
            return (START, END, *tags.implicit_ends, *dropped)
        opens = tags.reopens or not self.opened
        return ((END,) if tags.drops_stray_end else ()) + ((START,) if opens else ()) + dropped

    def _read(self, marker: str) -> None:
        """Act on a marker found in the text: a special token's text and the tags themselves are left out."""
        if marker in self.parser.dropped:
            return
        if marker in self.parser.tags.implicit_ends:
            self.reasoning = False
            self.pieces[False].append(marker)
        elif marker == END:
            self.reasoning = False
        elif marker == START:
            self.reasoning = self.opened = True

    def _reasoning_part(self, reasoning: str) -> str:
        if not self.parser.tags.strips_reasoning_end:
            return reasoning
        combined = self.tail + reasoning
        sent = combined.rstrip()
        self.tail = combined[len(sent):]
        return sent


def reasoning_fields(text: str | None) -> dict:
    """A message's (or delta's) reasoning under both names vLLM has used: `reasoning` (its current one) and
    `reasoning_content` (the earlier one, which many clients still read)."""
    return {} if text is None else {"reasoning": text, "reasoning_content": text}


def think_tag_parser(name: str, tokenizer, template_kwargs: dict | None, prompt_ids: list[int], constrained: bool,
                     skip_special_tokens: bool | None, tool_markers: tuple[str, ...] = ()) -> ThinkTagParser:
    """How one chat request's output is read by the server's `--reasoning-parser NAME`. `constrained`: a grammar
    writes the output (a structured output); `skip_special_tokens`: the request's; `tool_markers`: the special
    tokens the request's tool-call parser reads (the text is then decoded with special tokens kept, and these
    stay in it for that parser)."""
    tags = THINK_TAGS[name]
    prompt_tail = tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False).rstrip()
    tags_special = bool(special_texts(tokenizer) & {START, END, *tags.implicit_ends})
    others = other_specials(tokenizer, (START, END, *tags.implicit_ends, *tool_markers))
    dropped = ()
    if others is not None and skip_special_tokens is not False:
        dropped = tuple(sorted(others, key=len, reverse=True))
    return ThinkTagParser(tags, thinking=tags.thinking(template_kwargs) and not prompt_tail.endswith(END),
                          in_reasoning=not constrained, keeps_special_tokens=tags_special, dropped=dropped)


class ContentStream(Protocol):
    """What reads the content further (server/serving/tool_calls.py's ToolCallStream)."""
    def delta(self, delta_text: str, finished: bool) -> dict: ...
    def finish_reason(self, reason: str | None) -> str | None: ...


@dataclass
class ReasoningChoiceStream:
    """One chat choice's stream through a reasoning parser: `reasoning` / `reasoning_content` deltas as the
    reasoning is written, then the content, as `content` deltas or through the choice's tool-call stream (which
    then reads the content alone)."""
    reasoning: ReasoningStream
    tools: ContentStream | None = None

    def delta(self, delta_text: str, finished: bool) -> dict:
        thinking, content = self.reasoning.feed(delta_text, finished)
        out = reasoning_fields(thinking or None)
        if self.tools is not None:
            return {**out, **self.tools.delta(content, finished)}
        return {**out, "content": content} if content else out

    def finish_reason(self, reason: str | None) -> str | None:
        return self.tools.finish_reason(reason) if self.tools is not None else reason
