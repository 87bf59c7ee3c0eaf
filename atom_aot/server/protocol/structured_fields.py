"""Structured outputs, as OpenAI (response_format) and vLLM (guided_*, structured_outputs) ask for
them: at most one per request, and one field of `structured_outputs`; a second is a 400 naming both."""
from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from atom_aot.runtime.sampling_params import GrammarSpec
from atom_aot.server.protocol.base import Strict, Text

class JsonSchemaFormat(Strict):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    name: Text
    description: Text | None = None
    json_schema: dict | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format: json_schema is given exactly when type is 'json_schema'")
        return self


class StructuredOutputsParams(Strict):
    """vLLM's `structured_outputs` object: one of its fields."""
    json_: dict | bool | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: Annotated[list[Text], Field(min_length=1)] | None = None
    grammar: Text | None = None
    json_object: bool | None = None
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _one_field(self):
        named = [name for name, value in (("json", self.json_), ("regex", self.regex), ("choice", self.choice),
                                          ("grammar", self.grammar), ("json_object", self.json_object or None))
                 if value is not None]
        if len(named) > 1:
            raise ValueError(f"one of json, regex, choice, grammar and json_object, not several; this request has "
                             f"{' and '.join(named)}")
        return self


class StructuredFields(Strict):
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
