"""The request bodies of the OpenAI API, as strict pydantic models.

Strict: a string where a number belongs is a 400, not a silent conversion. The sampling fields' ranges are
SamplingParams' rules, checked once when the request becomes SamplingParams (serving/common.py choice_params,
whose 400 names the field); here only what the OpenAI API bounds more tightly than the engine does (temperature
at most 2, repetition_penalty at most 10, logit_bias within +-100) and the int32 bound of counts and token ids.
What depends on the loaded model or on the server's limits (its name, context length and vocabulary; how many
prompts and choices) is checked where they are known (serving/common.py).

Each model's fields are what its endpoint accepts; any other field is refused by name, never
dropped (base.py). Structured outputs are in structured_fields.py.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

# NOT_IMPLEMENTED: re-exported, callers know it from here
from atom_aot.server.protocol.base import NOT_IMPLEMENTED, Strict, Text, refusal, valid_unicode  # noqa: F401
from atom_aot.server.protocol.bookkeeping_fields import BookkeepingFields
from atom_aot.server.protocol.structured_fields import StructuredFields
from atom_aot.server.protocol.vllm_fields import ChatRenderFields, TemplateFields, VllmTextFields

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_BAD_WORDS = 128
INT64_MAX = 2 ** 63 - 1
INT32_MAX = 2 ** 31 - 1          # counts and token ids: no context or vocabulary comes near it
MAX_LOGIT_BIAS_KEY_DIGITS = len(str(INT32_MAX))
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class StreamOptions(Strict):
    include_usage: bool | None = False


class SamplingFields(StructuredFields, BookkeepingFields, VllmTextFields):
    """What both endpoints take. `model` may be left out: it then means the served model (as vLLM)."""
    model: Text | None = None
    temperature: Annotated[float, Field(le=2)] | None = None        # OpenAI's cap; >= 0 is SamplingParams' rule
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: Count | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: Annotated[int, Field(ge=-(2 ** 63), le=INT64_MAX)] | None = None   # int64, as OpenAI
    n: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = 1    # the real upper bound is a server option (--max-n)
    # logits processors, with vLLM's meanings (runtime/sampling/logits_processors.py)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: Annotated[float, Field(le=10)] | None = None   # > 0 is SamplingParams' rule
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None   # token id (as text) -> bias
    min_tokens: Count | None = None
    bad_words: Annotated[list[Annotated[Text, Field(min_length=1)]], Field(max_length=MAX_BAD_WORDS)] | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None   # only these may be sampled
    cache_salt: Annotated[Text, Field(min_length=1)] | None = None    # prefix-cache blocks shared only with its equals
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None   # vLLM's per-prompt-token format
    priority: Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)] | None = None   # --scheduling-policy priority

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_keys(cls, value):
        """Token ids in ASCII decimal ("\\u0663" is a digit to str.isdigit, not to a client)."""
        bad = next((key for key in value or {} if not (key.isascii() and key.isdigit())
                    or len(key) > MAX_LOGIT_BIAS_KEY_DIGITS), None)
        if bad is not None:
            shown = bad if len(bad) <= 24 else f"{bad[:24]}... ({len(bad)} characters)"
            raise ValueError(f"logit_bias keys must be token ids written in decimal digits (at most "
                             f"{MAX_LOGIT_BIAS_KEY_DIGITS}), got {shown!r}")
        return value

    @model_validator(mode="after")
    def _min_tokens_within_max_tokens(self):
        name, limit = self.max_tokens_asked
        if self.min_tokens and limit is not None and self.min_tokens > limit:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed {name} ({limit})")
        return self

    @property
    def max_tokens_asked(self) -> tuple[str, int | None]:
        """The field that bounds the output, by its client-facing name, and its value."""
        return "max_tokens", self.max_tokens

    @property
    def token_bias(self) -> dict[int, float]:
        return {int(key): bias for key, bias in (self.logit_bias or {}).items()}

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
        for s in strings:
            valid_unicode(s)
        return value

    @model_validator(mode="after")
    def _prompt_logprobs_not_streamed(self):
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs are not available with stream=true (as in vLLM): they come once, "
                             "in the whole response")
        return self

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


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class FunctionCall(Strict):
    name: Text
    arguments: Text                  # JSON text


class ToolCallMessage(Strict):
    """A call the assistant made, sent back in the conversation."""
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall

    def as_template_input(self) -> dict:
        """Templates read the arguments as an object (vLLM passes them so); text that is not JSON stays text."""
        try:
            arguments = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": arguments}}


class FunctionDefinition(Strict):
    name: Text
    description: Text | None = None
    parameters: dict | None = None       # a JSON schema
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: Text


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallMessage] | None = None     # assistant
    tool_call_id: Text | None = None                    # tool
    # an assistant turn's reasoning as a response returned it (harmony_stream.py): the template reads it (as
    # `thinking` / `reasoning_content`, runtime/text/fast_tokenizer.py), so a client may send its messages back whole
    reasoning: Text | None = None
    reasoning_content: Text | None = None

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
        if self.tool_calls:
            message["tool_calls"] = [call.as_template_input() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if reasoning is not None:
            message["reasoning"] = reasoning
        return message


# apply_chat_template's own arguments, which the request decides
TEMPLATE_ARGUMENTS = frozenset({"conversation", "messages", "tools", "documents", "chat_template",
                                "add_generation_prompt", "continue_final_message", "tokenize", "return_dict"})


def tool_dicts(tools: list[Tool] | None) -> list[dict] | None:
    """The tools as the chat template takes them."""
    return [tool.model_dump(exclude_none=True) for tool in tools] if tools else None


def template_variables_only(value: dict | None) -> dict | None:
    taken = sorted(set(value or {}) & TEMPLATE_ARGUMENTS)
    if taken:
        raise ValueError(f"chat_template_kwargs: {', '.join(taken)} cannot be set here (the request's own "
                         f"fields set them)")
    return value


class ChatCompletionRequest(SamplingFields, ChatRenderFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    prompt: None = None      # ATOM's alias of `messages`, moved there before validation (see below)
    max_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True     # false: at most one call (the first), as vLLM
    chat_template_kwargs: dict[str, Any] | None = None   # extra template variables, e.g. enable_thinking

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value):
        return template_variables_only(value)

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self):
        choice, names = self.tool_choice, [tool.function.name for tool in self.tools or []]
        if choice not in (None, "none") and not names:
            raise ValueError("tool_choice needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among the tools "
                             f"({', '.join(names)})")
        return self

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        """As in OpenAI's API: "auto" when tools are given and tool_choice is not, "none" without tools."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def template_tools(self) -> list[dict] | None:
        return tool_dicts(self.tools)

    @model_validator(mode="before")
    @classmethod
    def _prompt_means_messages(cls, data):
        """ATOM's chat endpoint takes `prompt` for `messages`: a list of messages, or a string that
        is one user message."""
        if not isinstance(data, dict) or data.get("prompt") is None:
            return data
        if "messages" in data:
            raise refusal("prompt", "invalid_value", "prompt: send messages or prompt (its alias), not both")
        prompt = data["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return {**{k: v for k, v in data.items() if k != "prompt"}, "messages": messages}

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return value

    @property
    def max_tokens_asked(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens_asked[1]


TokenIds = list[Annotated[int, Field(ge=0)]]     # any size: checked against the vocabulary


class CompletionRequest(SamplingFields):
    prompt: Any
    echo: bool | None = False
    add_special_tokens: bool | None = True       # the tokenizer's BOS (and the like) before a text prompt
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value):
        return normalize_prompt(value)

    @model_validator(mode="after")
    def _checks(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be >= 1 (0 is allowed only with echo=true, to score the prompt)")
        return self


def normalize_prompt(value) -> list[str | list[int]]:
    """OpenAI's four prompt forms (a string, strings, token ids, lists of token ids) as a list of
    prompts, each a string or a token-id list."""
    shape = "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(value, str):
        return [valid_unicode(value)]
    if not isinstance(value, list) or not value:
        raise ValueError(shape + (" (got an empty list)" if value == [] else ""))
    if all(_is_token_id(t) for t in value):
        return [list(value)]
    if all(isinstance(p, str) for p in value):
        for i, p in enumerate(value):
            try:
                valid_unicode(p)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
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


class TokenizeTextRequest(Strict):
    """POST /tokenize with a prompt (vLLM's TokenizeCompletionRequest)."""
    model: Text | None = None
    prompt: Text
    add_special_tokens: bool | None = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(TemplateFields):
    """POST /tokenize with messages, rendered by the chat template as chat completions does."""
    model: Text | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_special_tokens: bool | None = False      # the template already wrote them
    return_token_strs: bool | None = False
    tools: list[Tool] | None = None              # rendered by the template, as chat completions renders them
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value):
        return template_variables_only(value)

    @property
    def template_tools(self) -> list[dict] | None:
        return tool_dicts(self.tools)


class DetokenizeRequest(Strict):
    model: Text | None = None
    tokens: TokenIds
