"""A request body, from bytes to a typed request, refusing on the way what would make a later step
fail instead of answering: a compressed or non-UTF-8 body, NaN and numbers no float or tensor
holds, integers of thousands of digits, nesting deeper than --max-json-depth (pydantic, the chat
template and the grammar compiler all recurse), and lone UTF-16 surrogates in keys or values
(no tokenizer or encoder takes them).

Each refusal is a 400: `invalid_json` for what is not a JSON body this server reads, and
`invalid_value` with the field's path as `param` for a string that is not Unicode.
"""
from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from atom_aot.server.protocol.errors import APIError, bad_request

M = TypeVar("M", bound=BaseModel)

MAX_INT_DIGITS = 4300              # Python's own limit on converting digit strings to int
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")    # only an escape can carry a surrogate in UTF-8 text
_GZIP_MAGIC = b"\x1f\x8b"


class _Refused(ValueError):
    """A number json.loads must not turn into a value; its message is the client's."""


async def read_request(request: Request, model: type[M], max_depth: int) -> M:
    """The body of `request` as `model`; a complaint of the model is the same 400 a typed route gives."""
    body = parse_json_body(await request.body(), request.headers.get("content-encoding"), max_depth)
    return validate(model, body)


def validate(model: type[M], body: Any) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


def parse_json_body(raw: bytes, content_encoding: str | None, max_depth: int) -> Any:
    """The JSON value of a body, checked for depth and surrogates (see the module doc)."""
    if content_encoding and content_encoding.strip().lower() != "identity":
        raise _invalid_json(f"the request body has Content-Encoding {content_encoding[:40]!r}; this server reads "
                            f"uncompressed JSON only: send the body as plain UTF-8 JSON")
    if not raw.strip():
        raise _invalid_json("the request body is missing: send a JSON object")
    text = _utf8(raw)
    try:
        body = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except _Refused as e:
        raise _invalid_json(f"the request body is not valid JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise _invalid_json(f"the request body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") \
            from None
    except RecursionError:
        raise _too_deep(None, max_depth) from None
    check_structure(body, max_depth, surrogates_possible=_SURROGATE_ESCAPE.search(raw) is not None)
    return body


def _utf8(raw: bytes) -> str:
    if raw.startswith(_GZIP_MAGIC):
        raise _invalid_json("the request body looks gzip-compressed; this server reads uncompressed JSON only")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _invalid_json(f"the request body is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} "
                            f"({e.reason}); send JSON encoded as UTF-8") from None


def _no_constant(name: str):
    raise _Refused(f"{name} is not a JSON number; send a finite number (or leave the field out)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(f"the number {text[:40]} is outside the range of a 64-bit float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits is longer than this server reads "
                       f"({MAX_INT_DIGITS} digits at most)")
    return int(text)


def check_structure(body: Any, max_depth: int, surrogates_possible: bool = True) -> None:
    """Refuse nesting deeper than `max_depth` (a bare value is depth 0, `{}` depth 1) and, where the
    text had a surrogate escape, any key or string holding a lone one. Iterative: no recursion."""
    pending = [(body, (), 1)] if isinstance(body, (dict, list)) else []
    if surrogates_possible and isinstance(body, str):
        _check_unicode(body, ())
    while pending:
        value, path, depth = pending.pop()
        if depth > max_depth:
            raise _too_deep(path, max_depth)
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            if surrogates_possible and isinstance(key, str):
                _check_unicode(key, path, is_key=True)
            if isinstance(child, (dict, list)):
                pending.append((child, (*path, key), depth + 1))
            elif surrogates_possible and isinstance(child, str):
                _check_unicode(child, (*path, key))


def _check_unicode(text: str, path: tuple, is_key: bool = False) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = path_text(path)
        what = f"a key of {where or 'the body'}" if is_key else where or "the body"
        raise bad_request(f"{what}: not valid Unicode: a lone UTF-16 surrogate (\\u{ord(text[e.start]):04x}) at "
                          f"character {e.start}; send UTF-8 text (in JSON, a \\u escape of a surrogate must be one "
                          f"of a high-low pair)", param=where or None, code="invalid_value") from None


def _too_deep(path: tuple | None, max_depth: int) -> APIError:
    where = f" (at {path_text(path)})" if path else ""
    return _invalid_json(f"the request body nests objects and arrays more than {max_depth} deep{where}, over this "
                         f"server's limit (--max-json-depth raises it)")


def path_text(path: tuple, max_parts: int = 8, max_part_chars: int = 40) -> str:
    """A field's path as `messages.0.content`, shortened: keys are the client's and may be long."""
    parts = [str(p)[:max_part_chars] for p in path[:max_parts]]
    return ".".join(parts) + (".." if len(path) > max_parts else "")


def _invalid_json(message: str) -> APIError:
    return bad_request(message, code="invalid_json")
