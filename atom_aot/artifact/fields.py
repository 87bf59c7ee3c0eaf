"""Reading untrusted JSON into typed values: every failure is an ArtifactError naming the field."""
from __future__ import annotations

import re
from typing import Any, Callable, TypeVar

from atom_aot.errors import ArtifactError

T = TypeVar("T")
HEX = re.compile(r"[0-9a-f]+")


class Reader:
    """A view of one JSON object inside a named document, e.g. `manifest.json: target`."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise ArtifactError(f"{where} must be a JSON object, got {type(data).__name__}")
        self.data = data
        self.where = where

    def error(self, key: str, why: str) -> ArtifactError:
        return ArtifactError(f"{self.where}.{key} {why}. The artifact is malformed: rebuild it with atom-build.")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self.error(key, "is missing")
            return default
        return self.data[key]

    def typed(self, key: str, kind: type | tuple[type, ...], default: Any = ..., optional: bool = False) -> Any:
        value = self.raw(key, default)
        if value is None and optional:
            return None
        if isinstance(value, bool) and kind in (int, float):      # JSON true is not a number
            raise self.error(key, f"must be {kind.__name__}, got a boolean")
        if kind is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.error(key, f"must be {names}, got {type(value).__name__} {value!r:.60}")
        return value

    def str(self, key: str, default: Any = ..., optional: bool = False, choices: tuple[str, ...] | None = None) -> str:
        value = self.typed(key, str, default, optional)
        if choices is not None and value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {value!r:.60}")
        return value

    def int(self, key: str, default: Any = ..., optional: bool = False, minimum: int | None = None) -> int:
        value = self.typed(key, int, default, optional)
        if value is not None and minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return value

    def float(self, key: str, default: Any = ...) -> float:
        return self.typed(key, float, default)

    def bool(self, key: str, default: Any = ...) -> bool:
        return self.typed(key, bool, default)

    def hex(self, key: str, length: int) -> str:
        value = self.str(key)
        if len(value) != length or not HEX.fullmatch(value):
            raise self.error(key, f"must be {length} lowercase hex digits, got {value!r:.80}")
        return value

    def ints(self, key: str, default: Any = ...) -> tuple[int, ...]:
        value = self.typed(key, list, default)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(key, f"must be a list of integers, got {value!r:.60}")
        return tuple(value)

    def obj(self, key: str, default: Any = ...) -> "Reader":
        return Reader(self.typed(key, dict, default), f"{self.where}.{key}")

    def mapping(self, key: str, read: Callable[["Reader", str], T], default: Any = ...) -> dict[str, T]:
        """A JSON object whose values are objects, each read by `read(reader, its_key)`."""
        section = self.obj(key, default)
        return {k: read(section.obj(k), k) for k in section.data}

    def str_map(self, key: str, default: Any = ...) -> dict[str, str]:
        section = self.obj(key, default)
        return {k: section.str(k) for k in section.data}

    def float_map(self, key: str, default: Any = ...) -> dict[str, float]:
        section = self.obj(key, default)
        return {k: section.float(k) for k in section.data}
