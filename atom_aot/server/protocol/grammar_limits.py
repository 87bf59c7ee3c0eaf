"""The sizes of a structured output the server takes, checked before anything compiles.

A grammar's compile time grows with its size and shape (an enum of 20,000 long strings took minutes), so
each dimension a client controls has a bound, a `serve` flag (options.py): a JSON schema's bytes, its
nesting depth, the alternatives it lists (enum values, anyOf/oneOf branches) or a guided_choice lists, a
regex's and an EBNF grammar's length, the tools of a chat request. A request over one is answered 400 with
a message naming the limit and the flag that raises it. The engine bounds the compile's time as well
(--grammar-compile-timeout), for shapes small in size and slow to compile all the same.

The checks read the text without recursion: a schema nested thousands deep is measured, never walked by
the call stack.
"""
from __future__ import annotations

import itertools
import json
import re

from atom_aot.runtime.sampling_params import GrammarSpec
from atom_aot.server.options import ServerOptions, flag_of
from atom_aot.server.protocol.errors import APIError, bad_request

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")
_BRANCHES = ("anyOf", "oneOf")
_VALUES = ("enum", "const", "default", "examples")      # data, not schemas: not looked into


def check_structured_output(options: ServerOptions, spec: GrammarSpec | None) -> None:
    """Refuse `spec` (400) if it is over one of the server's grammar limits."""
    if spec is None:
        return
    length = len(spec.value)
    if spec.kind == "json_schema":
        _check_schema(options, spec.value)
    elif spec.kind == "regex":
        _check(options, "max_regex_length", length, f"the structured output's regex is {length} characters")
    elif spec.kind == "ebnf":
        _check(options, "max_grammar_length", length, f"the structured output's grammar is {length} characters")
    elif spec.kind == "choice":
        _check(options, "max_grammar_choices", len(spec.choices), f"guided_choice lists {len(spec.choices)} choices")
        length = sum(len(choice) for choice in spec.choices)
        _check(options, "max_grammar_length", length, f"guided_choice's choices are {length} characters together")


def check_tools(options: ServerOptions, tools: list | None) -> None:
    """Refuse a chat request carrying more tools than the server takes."""
    count = len(tools or ())
    _check(options, "max_tools", count, f"this request has {count} tools", param="tools")


def json_depth(text: str) -> int:
    """How deeply the JSON `text` nests (objects and arrays), read without parsing it."""
    steps = (1 if bracket in "[{" else -1 for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub('""', text)))
    return max(itertools.accumulate(steps), default=0)


def schema_alternatives(schema) -> int:
    """The enum values and anyOf/oneOf branches anywhere in a parsed JSON schema (each is a branch the
    grammar holds)."""
    count, stack = 0, [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if isinstance(value, list) and (key == "enum" or key in _BRANCHES):
                count += len(value)
            if key not in _VALUES:
                stack.append(value)
    return count


def _check_schema(options: ServerOptions, text: str) -> None:
    size = len(text.encode())
    _check(options, "max_json_schema_bytes", size, f"the structured output's JSON schema is {size} bytes")
    depth = json_depth(text)
    _check(options, "max_json_schema_depth", depth, f"the structured output's JSON schema nests {depth} deep")
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise bad_request(f"the JSON schema of this request's structured output is not valid JSON: {e}",
                          code="invalid_value") from None
    count = schema_alternatives(schema)
    _check(options, "max_grammar_choices", count, f"the structured output's JSON schema lists {count} alternatives "
                                                  f"(enum values and anyOf/oneOf branches)")


def _check(options: ServerOptions, option: str, value: int, what: str, param: str | None = None) -> None:
    limit = getattr(options, option)
    if value > limit:
        raise _over(what, limit, option, param)


def _over(what: str, limit: int, option: str, param: str | None) -> APIError:
    return bad_request(f"{what}, over this server's limit of {limit} ({flag_of(option)} raises it)", param=param,
                       code="limit_exceeded")
