"""Command-line flags generated from config dataclasses: one place for names, choices and defaults.

A field opts in with `flag(...)` metadata; `add_arguments` turns the dataclass into argparse
options, `from_namespace` reads them back into the dataclass (so its `__post_init__` validates
them before anything heavy runs), and `to_argv` writes an instance back as a command line (the
build child process, the "rebuild with" hint of a refused artifact).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable


def flag(default: Any, *names: str, help: str, choices: tuple | None = None, parse: Callable[[str], Any] | None = None,
         render: Callable[[Any], str] | None = None, negate: str | None = None) -> Any:
    """A dataclass field that is also a command-line option.

    names: the option strings (first is canonical); parse/render convert a non-trivial value
    (e.g. a tuple of sizes) from and to its text; negate: for a bool defaulting to True, the flag
    that turns it off (e.g. --no-prefix-caching). A bool defaulting to False is a store_true flag.
    """
    meta = {"flags": names, "help": help, "choices": choices, "parse": parse, "render": render, "negate": negate}
    return dataclasses.field(default=default, metadata={"cli": meta})


def cli_fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "cli" in f.metadata]


def add_arguments(parser: argparse.ArgumentParser | Any, cls, defaults: dict | None = None,
                  exclude: tuple[str, ...] = (), underscore_aliases: bool = False) -> None:
    """Add one option per flagged field of `cls` (defaults may be overridden per tool; a tool that
    spells a field its own way excludes it and adds its own option). underscore_aliases: also
    accept `--kv_cache_dtype` for `--kv-cache-dtype` (ATOM's and vLLM's older spelling)."""
    defaults = defaults or {}
    for f in cli_fields(cls):
        if f.name in exclude:
            continue
        meta = f.metadata["cli"]
        names = _with_underscore_aliases(meta["flags"]) if underscore_aliases else meta["flags"]
        default = defaults.get(f.name, f.default)
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"], "default": default}
        if isinstance(f.default, bool) and meta["parse"] is None:
            if meta["negate"]:
                parser.add_argument(meta["negate"], dest=f.name, action="store_false", help=meta["help"],
                                    default=default)
                continue
            parser.add_argument(*names, action="store_true", **kwargs)
            continue
        if meta["choices"] is not None:
            kwargs["choices"] = meta["choices"]
        kwargs["type"] = _argument_type(meta["parse"]) if meta["parse"] else _scalar_type(f)
        if default is not None:
            kwargs["help"] += f" (default: {meta['render'](default) if meta['render'] else default})"
        parser.add_argument(*names, **kwargs)


def _with_underscore_aliases(names: tuple[str, ...]) -> tuple[str, ...]:
    aliases = tuple("--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:])
    return names + aliases


def from_namespace(cls, args: argparse.Namespace, **overrides):
    """An instance of `cls` from parsed flags (fields without flags keep their defaults)."""
    values = {f.name: getattr(args, f.name) for f in cli_fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


def to_argv(obj, skip: tuple[str, ...] = (), only_changed: bool = True) -> list[str]:
    """The command line that reproduces `obj`'s flagged fields (those differing from the default)."""
    argv: list[str] = []
    for f in cli_fields(type(obj)):
        value = getattr(obj, f.name)
        if f.name in skip or (only_changed and value == f.default):
            continue
        meta = f.metadata["cli"]
        if isinstance(f.default, bool) and meta["parse"] is None:
            if meta["negate"] and not value:
                argv.append(meta["negate"])
            elif not meta["negate"] and value:
                argv.append(meta["flags"][0])
            continue
        if value is None:
            continue
        argv += [meta["flags"][0], meta["render"](value) if meta["render"] else str(value)]
    return argv


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse shows a type's ValueError as "invalid <function name> value"; keep our message instead."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def _scalar_type(f: dataclasses.Field) -> Callable[[str], Any]:
    hint = str(f.type)
    if hint.startswith("int"):
        return int
    if hint.startswith("float"):
        return float
    return str
