"""The server's bounds on what a structured output may ask to compile (server/protocol/grammar_limits.py): each one
over its limit is a 400 naming the limit and its flag; within them, nothing is refused; a schema nested
thousands deep is measured without recursion."""
from __future__ import annotations

import json

import pytest

from atom_aot.runtime.sampling_params import GrammarSpec
from atom_aot.server.options import ServerOptions
from atom_aot.server.protocol.errors import APIError
from atom_aot.server.protocol.grammar_limits import check_structured_output, check_tools, json_depth, schema_alternatives

OPTIONS = ServerOptions()


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def schema(value) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(value))


def enum(count: int, length: int = 8) -> dict:
    return {"type": "string", "enum": [f"{i:0{length}d}" for i in range(count)]}


OVER = [
    ("max_json_schema_bytes", "--max-json-schema-bytes", schema({"description": "x" * 70000}),
     "JSON schema is 70019 bytes, over this server's limit of 65536"),
    ("max_json_schema_depth", "--max-json-schema-depth", schema(nested(40)), "JSON schema nests 41 deep"),
    ("max_grammar_choices", "--max-grammar-choices", schema(enum(1025)), "JSON schema lists 1025 alternatives"),
    ("max_grammar_choices", "--max-grammar-choices", schema({"anyOf": [enum(600), enum(600)]}),
     "lists 1202 alternatives"),
    ("max_grammar_choices", "--max-grammar-choices", GrammarSpec("choice", choices=tuple("ab" * 1025)),
     "guided_choice lists 2050 choices"),
    ("max_grammar_length", "--max-grammar-length", GrammarSpec("choice", choices=("a" * 40000, "b" * 30000)),
     "choices are 70000 characters together"),
    ("max_grammar_length", "--max-grammar-length", GrammarSpec("ebnf", 'root ::= "' + "a" * 70000 + '"'),
     "grammar is 70011 characters"),
    ("max_regex_length", "--max-regex-length", GrammarSpec("regex", "a" * 4097), "regex is 4097 characters"),
]


@pytest.mark.parametrize("option, flag, spec, what", OVER, ids=[f"{o[0]}-{i}" for i, o in enumerate(OVER)])
def test_a_structured_output_over_a_limit_is_a_400_naming_its_flag(option, flag, spec, what):
    with pytest.raises(APIError) as error:
        check_structured_output(OPTIONS, spec)
    assert error.value.status == 400 and error.value.code == "limit_exceeded"
    assert what in error.value.message and f"({flag} raises it)" in error.value.message
    check_structured_output(ServerOptions(**{option: 10 ** 6}), spec)       # raised, it passes


def test_too_many_tools_is_a_400_naming_its_flag():
    with pytest.raises(APIError) as error:
        check_tools(OPTIONS, [{}] * 129)
    assert error.value.status == 400 and error.value.param == "tools" and "(--max-tools raises it)" in str(error.value)
    check_tools(OPTIONS, [{}] * 128)
    check_tools(OPTIONS, None)


@pytest.mark.parametrize("spec", [
    None, GrammarSpec("json_object"), schema(nested(30)), schema(enum(1024)), GrammarSpec("regex", "a" * 4096),
    GrammarSpec("choice", choices=("yes", "no")), GrammarSpec("ebnf", 'root ::= "a" | "b"'),
    schema({"properties": {"enum": {"type": "string"}}, "examples": [{"enum": list(range(5000))}]}),
])
def test_within_the_limits_nothing_is_refused(spec):
    check_structured_output(OPTIONS, spec)


def test_depth_is_read_without_recursion_and_strings_do_not_count():
    deep = "[" * 100000 + "]" * 100000
    assert json_depth(deep) == 100000
    assert json_depth(json.dumps({"a": "[[[{{{", "b": ['"\\"[']})) == 2
    with pytest.raises(APIError, match="nests 100000 deep"):
        check_structured_output(ServerOptions(max_json_schema_bytes=10 ** 6), GrammarSpec("json_schema", deep))


def test_a_schema_that_is_not_json_is_a_400():
    with pytest.raises(APIError, match="is not valid JSON") as error:
        check_structured_output(OPTIONS, GrammarSpec("json_schema", '{"type": '))
    assert error.value.status == 400


def test_alternatives_count_enum_values_and_branches_but_not_data():
    assert schema_alternatives({"oneOf": [{"enum": [1, 2, 3]}, {"const": 4}],
                                "default": {"enum": [5, 6]}}) == 2 + 3
