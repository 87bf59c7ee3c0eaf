"""A tool call's argument values, written by the model as text, typed by the tool's JSON schema as vLLM's
`glm45` and `qwen3_coder` parsers type them (server/serving/xml_tool_parsers.py). A value that does not fit its
type stays the text it is (vLLM's fallback; vLLM makes a boolean that is neither true nor false false): the
call is never lost to it."""
from __future__ import annotations

import ast
import json
import math

STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
INTEGER_TYPES = ("int", "uint", "long", "short", "unsigned")


def property_schema(schemas: dict[str, dict], function: str, key: str) -> dict | None:
    """The schema of `function`'s parameter `key`; None when the tool or the parameter is not declared."""
    properties = (schemas.get(function) or {}).get("properties")
    prop = properties.get(key) if isinstance(properties, dict) else None
    return prop if isinstance(prop, dict) else None


def type_of(prop: dict | None) -> str | None:
    """A property's JSON type, lower-case; the first that is not "null" of a list of types."""
    kind = (prop or {}).get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind.strip().lower() if isinstance(kind, str) else None


def loose_json(value: str):
    """`value` read as JSON, else as a Python literal (a model may write True or single quotes), else the text."""
    for read in (json.loads, ast.literal_eval):
        try:
            parsed = read(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if _is_json(parsed):
            return parsed
    return value


def glm_value(raw: str, prop: dict | None):
    """GLM-4.5's: the text without its surrounding blanks; a declared string as is, anything else read as JSON."""
    value = raw.strip()
    return value if type_of(prop) == "string" else loose_json(value)


def qwen_value(raw: str, prop: dict | None):
    """Qwen3-Coder's: the text without one newline at either end; `null` is null; an undeclared parameter or
    one without a type is a string; integers, numbers and booleans by their type; the rest read as JSON."""
    value = qwen_text(raw)
    kind = type_of(prop) or "string"
    if value.lower() == "null":
        return None
    if prop is None or kind in STRING_TYPES:
        return value
    if kind.startswith(INTEGER_TYPES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        return value if not math.isfinite(number) else int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true" if value.lower() in ("true", "false") else value
    return loose_json(value)


def qwen_text(raw: str) -> str:
    value = raw[1:] if raw.startswith("\n") else raw
    return value[:-1] if value.endswith("\n") else value


def _is_json(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True
