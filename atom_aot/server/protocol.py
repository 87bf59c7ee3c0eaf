"""The request bodies of the OpenAI API, as strict pydantic models.

Strict: a string where a number belongs is a 400, not a silent conversion. Ranges are checked
here so the message names the field; what depends on the loaded model or on the server's limits
(its name, context length and vocabulary; how many prompts and choices) is checked where they
are known (`serving_common`).

Each model's fields are what its endpoint accepts; any other field is refused by name, never
dropped: those in NOT_IMPLEMENTED with the reason, all others as unknown. Every string must be
valid Unicode: JSON can carry a lone UTF-16 surrogate (`"\\ud800"`), which no tokenizer encodes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from atom_aot.runtime.sampling_params import GrammarSpec

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16


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

# To implement one: add the field to the request model(s) below and delete its row here.
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


class _Strict(BaseModel):
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
                raise _refusal(name, "unknown_parameter",
                               f"{name}: unknown field; this object takes {', '.join(cls.model_fields)}")
            if not row.asks_nothing(data[name]):
                raise _refusal(name, "unsupported_parameter", f"{name} is not supported by this server: {row.why}")
        return {k: v for k, v in data.items() if k not in extra} if extra else data


def _refusal(field: str, code: str, message: str) -> PydanticCustomError:
    """errors.validation_error turns this into a 400 whose param is the field."""
    return PydanticCustomError("unsupported_field", "{message}", {"field": field, "code": code, "message": message})


class StreamOptions(_Strict):
    include_usage: bool | None = False


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    name: Text
    description: Text | None = None
    json_schema: dict | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format: json_schema is given exactly when type is 'json_schema'")
        return self


class StructuredOutputsParams(_Strict):
    """vLLM's `structured_outputs` object: one of its fields."""
    json_: dict | bool | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: Annotated[list[Text], Field(min_length=1)] | None = None
    grammar: Text | None = None
    json_object: bool | None = None
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class StructuredFields(_Strict):
    """Structured outputs, as OpenAI (response_format) and vLLM (guided_*, structured_outputs) ask for
    them; at most one per request."""
    response_format: ResponseFormat | None = None
    guided_json: dict | bool | Text | None = None
    guided_regex: Text | None = None
    guided_choice: Annotated[list[Text], Field(min_length=1)] | None = None
    guided_grammar: Text | None = None
    structured_outputs: StructuredOutputsParams | None = None

    @model_validator(mode="after")
    def _one_structured_output(self):
        named = [name for name, spec in self._grammar_specs() if spec is not None]
        if len(named) > 1:
            raise ValueError(f"a request takes one structured output; this one has {' and '.join(named)}")
        return self

    @property
    def grammar_spec(self) -> GrammarSpec | None:
        """The grammar asked for; None: free text."""
        return next((spec for _, spec in self._grammar_specs() if spec is not None), None)

    def _grammar_specs(self):
        fmt, so = self.response_format, self.structured_outputs or StructuredOutputsParams()
        yield "response_format", (None if fmt is None or fmt.type == "text" else GrammarSpec("json_object")
                                  if fmt.type == "json_object" else _json_spec(fmt.json_schema.json_schema))
        yield "guided_json", None if self.guided_json is None else _json_spec(self.guided_json)
        yield "guided_regex", None if self.guided_regex is None else GrammarSpec("regex", self.guided_regex)
        yield "guided_choice", None if self.guided_choice is None else GrammarSpec("choice", choices=tuple(
            self.guided_choice))
        yield "guided_grammar", None if self.guided_grammar is None else GrammarSpec("ebnf", self.guided_grammar)
        yield "structured_outputs", (None if not so.model_fields_set else
                                     _json_spec(so.json_) if so.json_ is not None else
                                     GrammarSpec("regex", so.regex) if so.regex is not None else
                                     GrammarSpec("choice", choices=tuple(so.choice)) if so.choice else
                                     GrammarSpec("ebnf", so.grammar) if so.grammar is not None else
                                     GrammarSpec("json_object") if so.json_object else None)


def _json_spec(schema: dict | bool | str | None) -> GrammarSpec:
    """A JSON schema (an object, true, or its text); none means any JSON object, as OpenAI's json_schema
    without a schema."""
    if schema is None or schema is True:
        return GrammarSpec("json_object")
    return GrammarSpec("json_schema", schema if isinstance(schema, str) else json.dumps(schema))


class SamplingFields(StructuredFields):
    """What both endpoints take. `model` may be left out: it then means the served model (as vLLM)."""
    model: Text | None = None
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
    n: Annotated[int, Field(ge=1)] | None = 1       # the upper bound is a server option (--max-n)
    user: Text | None = None
    # logits processors, with vLLM's meanings (runtime/logits_processors.py)
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=10)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None   # token id (as text) -> bias
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    bad_words: list[Annotated[Text, Field(min_length=1)]] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_keys(cls, value):
        bad = next((key for key in value or {} if not key.isdigit()), None)
        if bad is not None:
            raise ValueError(f"logit_bias keys must be token ids, got {bad!r}")
        return value

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
    text: Text


class FunctionCall(_Strict):
    name: Text
    arguments: Text                  # JSON text


class ToolCallMessage(_Strict):
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


class FunctionDefinition(_Strict):
    name: Text
    description: Text | None = None
    parameters: dict | None = None       # a JSON schema
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: Text


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallMessage] | None = None     # assistant
    tool_call_id: Text | None = None                    # tool

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


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    prompt: None = None      # ATOM's alias of `messages`, moved there before validation (see below)
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    add_generation_prompt: bool | None = True
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
            raise _refusal("prompt", "invalid_value", "prompt: send messages or prompt (its alias), not both")
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
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(SamplingFields):
    prompt: Any
    echo: bool | None = False
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


class TokenizeTextRequest(_Strict):
    """POST /tokenize with a prompt (vLLM's TokenizeCompletionRequest)."""
    model: Text | None = None
    prompt: Text
    add_special_tokens: bool | None = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Strict):
    """POST /tokenize with messages, rendered by the chat template as chat completions does."""
    model: Text | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool | None = True
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


class DetokenizeRequest(_Strict):
    model: Text | None = None
    tokens: TokenIds
