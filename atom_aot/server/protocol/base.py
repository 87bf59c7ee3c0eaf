"""What every request model shares: strict parsing, refusal by name of the fields a model does not
take (NOT_IMPLEMENTED says why, for those of OpenAI's or vLLM's API that this server lacks), and
text that must be valid Unicode: JSON can carry a lone UTF-16 surrogate (`"\\ud800"`), which no
tokenizer encodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Unimplemented:
    """A field of OpenAI's API (or of other OpenAI-compatible servers) that this server lacks."""
    why: str                 # what is missing, and what the client can do
    no_ops: tuple = ()       # values besides null that ask for nothing, so they are accepted

    def asks_nothing(self, value) -> bool:
        return value is None or any(type(value) is type(v) and value == v for v in self.no_ops)


_TOOLS = "the legacy functions API is not implemented; send tools and tool_choice"
_STRUCTURED = ("this form of structured output is not implemented; use response_format, guided_json, guided_regex, "
               "guided_choice or guided_grammar")

# To implement one: add the field to the request model(s) (protocol.py) and delete its row here.
NOT_IMPLEMENTED: dict[str, Unimplemented] = {
    "tools": Unimplemented("tools are taken by /v1/chat/completions", ([],)),
    "tool_choice": Unimplemented("tools are taken by /v1/chat/completions", ("none",)),
    "parallel_tool_calls": Unimplemented("tools are taken by /v1/chat/completions", (True,)),
    "functions": Unimplemented(_TOOLS, ([],)),
    "function_call": Unimplemented(_TOOLS, ("none",)),
    "guided_decoding_backend": Unimplemented("the guided decoding backend is xgrammar, always", ("xgrammar",)),
    "guided_whitespace_pattern": Unimplemented(_STRUCTURED),
    "structural_tag": Unimplemented(_STRUCTURED),
    "best_of": Unimplemented("best_of is not implemented; ask for n choices and pick one yourself", (1,)),
    "use_beam_search": Unimplemented("beam search is not implemented", (False,)),
    "suffix": Unimplemented("suffix (fill in the middle) is not implemented", ("",)),
    "modalities": Unimplemented("only text output is implemented", (["text"],)),
    "audio": Unimplemented("only text output is implemented"),
    "prediction": Unimplemented("predicted outputs are not implemented"),
    "reasoning_effort": Unimplemented("reasoning controls are not implemented"),
    "continuous_usage_stats": Unimplemented("usage on every chunk is not implemented; include_usage sends it "
                                            "once, in the last chunk", (False,)),
}


def valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode: a lone UTF-16 surrogate (\\u{ord(text[e.start]):04x}) at character "
                         f"{e.start}; send UTF-8 text (in JSON, a \\u escape of a surrogate must be one of a "
                         f"high-low pair)") from None
    return text


Text = Annotated[str, AfterValidator(valid_unicode)]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _only_accepted_fields(cls, data):
        """The model's fields are the accepted ones: refuse the others by name (see NOT_IMPLEMENTED)."""
        if not isinstance(data, dict):
            return data
        accepted = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        extra = [name for name in data if name not in accepted]
        for name in extra:
            row = NOT_IMPLEMENTED.get(name)
            if row is None:
                taken = _listed([f.alias or n for n, f in cls.model_fields.items()])
                raise refusal(name[:80], "unknown_parameter", f"{name[:80]}: unknown field; this object takes {taken}")
            if not row.asks_nothing(data[name]):
                raise refusal(name, "unsupported_parameter", f"{name} is not supported by this server: {row.why}")
        return {k: v for k, v in data.items() if k not in extra} if extra else data


def _listed(names: list[str], max_chars: int = 360) -> str:
    """Field names for a message, as many as fit `max_chars` (a request object takes dozens)."""
    shown, length = [], 0
    for name in names:
        if length + len(name) + 2 > max_chars:
            return ", ".join(shown) + f" and {len(names) - len(shown)} more (docs/server.md lists them)"
        shown.append(name)
        length += len(name) + 2
    return ", ".join(shown)


def refusal(field: str, code: str, message: str) -> PydanticCustomError:
    """errors.validation_error turns this into a 400 whose param is the field."""
    return PydanticCustomError("unsupported_field", "{message}", {"field": field, "code": code, "message": message})
