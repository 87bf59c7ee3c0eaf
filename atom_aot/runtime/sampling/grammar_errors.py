"""A grammar that does not compile, said in our words: which part of the request and what is wrong, without
the grammar library's source locations ("/project/cpp/json_schema_converter.cc:936: Check failed: ...") or
its echo of the whole input. Torch-free, xgrammar-free: the compile worker and the engine both use it."""
from __future__ import annotations

import re

# what each kind of spec is called in a message (the request field it came from may have several names)
SPEC_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object grammar", "regex": "regex",
              "choice": "choices", "ebnf": "grammar"}
_LOG_PREFIX = re.compile(r"^\s*\[[0-9:.]+\]\s*")                        # "[03:10:52] "
_SOURCE_LOCATION = re.compile(r"\S*\.(?:cc|cpp|cxx|c|h|hpp|py):\d+:?\s*")  # "/project/cpp/x.cc:83: "
_CHECK_FAILED = re.compile(r"Check failed: .*? is (?:false|true):\s*")
_ECHO = re.compile(r"\s*The (?:JSON )?string is:.*$", re.DOTALL)
MAX_REASON_CHARS = 300


def compile_error_message(kind: str, error: BaseException) -> str:
    """The request's error for `error`, raised compiling a spec of `kind` (a GrammarSpec kind)."""
    return f"the {SPEC_NAMES.get(kind, kind)} of this request's structured output does not compile: {reason(error)}"


def reason(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "it nests too deeply"
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    text = _ECHO.sub("", _CHECK_FAILED.sub("", _SOURCE_LOCATION.sub("", _LOG_PREFIX.sub("", text)))).strip()
    if not text:
        return "the grammar library refused it without saying why"
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."
