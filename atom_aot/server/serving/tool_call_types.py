"""What every tool-call parser reads a model's text into (server/serving/tool_parsers.py and the parsers beside it)."""
from __future__ import annotations

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


@dataclass(frozen=True)
class PartialCall:
    """A call as far as the model has written it."""
    name: str | None     # None until the name's string is closed
    arguments: str       # the part of the arguments' JSON text that is surely theirs
    complete: bool       # the arguments' value is closed
    end: int | None      # offset in the body just past the call's own end (brace, end marker), once written


def is_function_name(name: str) -> bool:
    """A name a call may have: no blanks, quotes, braces or tags (text that is not a call, such as a JSON
    object a model wrote in the wrong format, is not taken for one)."""
    return bool(name) and not any(c.isspace() or c in "\"'{}<>" for c in name)
