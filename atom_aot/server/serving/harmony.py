"""GPT-OSS's harmony output format, read from the model's text: reasoning, answer and tool calls.

After the prompt's `<|start|>assistant` the model writes messages

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>...<|return|>

each a header (role, `<|channel|>` name, an optional recipient `to=...` before or after the channel, an optional
content type, bare or after `<|constrain|>`), `<|message|>`, the content, and `<|end|>` (more follows),
`<|return|>` (the answer is done) or `<|call|>` (a tool call is done). As vLLM's `openai_gptoss` reasoning parser
and `openai` tool parser read it: the `analysis` channel is reasoning; a message to `functions.NAME` is a call of
NAME with the content as its arguments; `final` (and `commentary` without a recipient: a preamble shown to the
user) is the content. Messages to the built-in tools (browser, python, container) are reasoning, as in vLLM.

Why not the `openai-harmony` package that vLLM uses: it reads token ids through its own o200k encoding, which
tiktoken downloads at first use (a server here has no network, and the tests' tokenizers are tiny ones); the
format is these seven special tokens and a one-line header, which the model's own tokenizer decodes to text when
special tokens are kept (the server asks for them: serving_chat.py), so it is read from that text here. (A content
that spells a marker as ordinary text is read as that marker: the one thing token ids would tell apart.)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from atom_aot.server.serving.markers import held_prefix

START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
TERMINATORS = (END, RETURN, CALL)
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CONSTRAINED = re.compile(re.escape(CONSTRAIN) + r"\s*(\S+)")


@dataclass(frozen=True)
class HarmonyMessage:
    role: str
    channel: str | None
    recipient: str | None          # "functions.get_weather", "browser.search", ... None: to the user
    content_type: str | None       # "json", ...
    content: str                   # so far, where the message is still open
    header_done: bool              # its <|message|> has come (before that its header may still grow)
    ended: bool                    # a terminator closed it

    @property
    def kind(self) -> str:
        """What the reader makes of it: "call" (a function call), "reasoning" or "content"."""
        if self.recipient is not None:
            return "call" if self.recipient.startswith(FUNCTIONS) else "reasoning"
        return "reasoning" if self.channel == "analysis" else "content"


def parse_messages(text: str) -> list[HarmonyMessage]:
    """The messages of an assistant's output text (special tokens kept), the last possibly open. The first needs
    no `<|start|>` (the prompt ends with `<|start|>assistant`)."""
    pieces = text.split(START)
    return [_message(piece) for i, piece in enumerate(pieces) if piece or i > 0]


def _message(piece: str) -> HarmonyMessage:
    head, found, body = piece.partition(MESSAGE)
    ends = [(body.find(t), t) for t in TERMINATORS if t in body]
    end = min(ends)[0] if ends else len(body)
    role_part, _, channel_part = head.partition(CHANNEL)
    words = role_part.split()
    role = words[0] if words and not words[0].startswith("to=") else "assistant"
    recipient = _RECIPIENT.search(head)
    constrained = _CONSTRAINED.search(channel_part)
    rest = [w for w in channel_part.replace(CONSTRAIN, " ").split() if not w.startswith("to=")]
    content_type = constrained.group(1) if constrained else (rest[1] if len(rest) > 1 else None)
    return HarmonyMessage(role, rest[0] if rest else None, recipient.group(1) if recipient else None, content_type,
                          body[:end], bool(found), bool(ends))


@dataclass(frozen=True)
class HarmonyOutput:
    reasoning: str | None                # the reasoning messages' contents, one per line
    content: str | None                  # the messages to the user, likewise
    calls: list[tuple[str, str]]         # (function name, arguments as written)


def read_output(text: str) -> HarmonyOutput:
    """A whole output as message fields; a text with no harmony message in it is all content."""
    messages = parse_messages(text)
    if not any(m.header_done for m in messages):
        return HarmonyOutput(None, text or None, [])
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    calls = []
    for m in filter(lambda m: m.header_done, messages):
        if m.kind == "call":
            calls.append((m.recipient.removeprefix(FUNCTIONS), m.content))
        else:
            parts[m.kind].append(m.content)
    return HarmonyOutput("\n".join(parts["reasoning"]) or None, "\n".join(parts["content"]) or None, calls)


def held_back(content: str) -> int:
    """How many characters at the end of an open message may be the start of the marker that closes it."""
    return max(held_prefix(content, marker) for marker in (*TERMINATORS, START))
