"""The request bodies of the OpenAI API, as strict pydantic models.

Strict: a string where a number belongs is a 400, not a silent conversion. Ranges are checked
here so the message names the field; what depends on the loaded model (its name, its context
length, its vocabulary) is checked where the model is known (`serving_common`).
Unknown fields are ignored, as OpenAI-compatible servers do.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

MAX_TOP_LOGPROBS = 20
MAX_N = 128
MAX_STOP_STRINGS = 16

class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool | None = False


class SamplingFields(_Strict):
    """What both endpoints take."""
    model: str
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool | None = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: Annotated[int, Field(ge=-(2 ** 63), le=2 ** 63 - 1)] | None = None   # int64, as OpenAI
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = 1
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    user: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value):
        if value is not None and not isinstance(value, str) and not (
                isinstance(value, list) and all(isinstance(s, str) for s in value)):
            raise ValueError("stop must be a string or a list of strings")
        strings = [value] if isinstance(value, str) else value or []
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(strings)}")
        if any(s == "" for s in strings):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, value):
        if value:
            raise ValueError("presence/frequency penalties are not supported by this server; send 0 or omit it")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream=true")
        return value

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value):
        if value is not None and not isinstance(value, (str, list)):
            raise ValueError("content must be a string or a list of text parts")
        for part in value if isinstance(value, list) else []:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text":
                raise ValueError(f"only text content parts are supported, got {kind!r}")
        return value

    def as_template_input(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    add_generation_prompt: bool | None = True

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(SamplingFields):
    prompt: Any
    echo: bool | None = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value):
        return normalize_prompt(value)

    @model_validator(mode="after")
    def _checks(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be >= 1 (0 is allowed only with echo=true, to score the prompt)")
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        return self


def normalize_prompt(value) -> list[str | list[int]]:
    """OpenAI's four prompt forms (a string, strings, token ids, lists of token ids) as a list of
    prompts, each a string or a token-id list."""
    shape = "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise ValueError(shape + (" (got an empty list)" if value == [] else ""))
    if all(_is_token_id(t) for t in value):
        return [list(value)]
    if all(isinstance(p, str) for p in value):
        return list(value)
    if all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in value):
        return [list(p) for p in value]
    if any(isinstance(t, int) and not isinstance(t, bool) and t < 0 for t in _flatten(value)):
        raise ValueError("token ids must be non-negative integers")
    raise ValueError(shape)


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _flatten(value):
    for item in value:
        if isinstance(item, list):
            yield from item
        else:
            yield item
