"""The package's shape, read from its source (ast, so imports inside functions count too):
which layer may import which, and the size limits of files and functions."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "atom_aot"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60

# layer -> layers it must not import (a layer is atom_aot.<name>, or atom_aot/<name>.py)
FORBIDDEN = {
    "build": {"runtime", "server", "entrypoints"},
    "runtime": {"build", "server", "entrypoints"},
    "server": {"build", "entrypoints"},
    "artifact": {"torch", "build", "runtime", "server", "models", "ops", "entrypoints"},
    "models": {"runtime", "build", "server", "entrypoints"},
    "ops": {"models", "runtime", "build", "server", "entrypoints"},
    "distributed": {"models", "runtime", "build", "server", "entrypoints"},
}

# module -> layers it may import against its layer's rule, and why (one entry per deliberate exception)
EXCEPTIONS = {
    # --load-format dummy-at-load: the runtime draws the weights at load with the build's own draw ->
    # convert -> shard functions, so the numbers are the build's; no other runtime module imports build/
    "runtime/loading/drawn_weights.py": {"build"},
}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def layer_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def imported_layers(tree: ast.Module, path: Path) -> set[str]:
    """The atom_aot layers (and `torch`) a module imports, at any depth."""
    layers = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [_absolute(node, path)]
            if names[0] == "atom_aot":          # from atom_aot import runtime
                names = [f"atom_aot.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "torch":
                layers.add("torch")
            elif parts[0] == "atom_aot" and len(parts) > 1:
                layers.add(parts[1])
    return layers


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)[:-node.level]
    return ".".join(package + ([node.module] if node.module else []))


def parsed() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in modules()]


def test_layers_import_only_what_they_may():
    violations = []
    for path, tree in parsed():
        allowed = EXCEPTIONS.get(path.relative_to(PACKAGE).as_posix(), set())
        bad = imported_layers(tree, path) & FORBIDDEN.get(layer_of(path), set()) - allowed
        violations += [f"{path.relative_to(PACKAGE.parent)} imports {name}" for name in sorted(bad)]
    assert not violations, "\n".join(violations)


def test_no_file_over_the_limit():
    long = [f"{path.relative_to(PACKAGE.parent)}: {n} lines" for path in modules()
            if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long, "\n".join(long)


def test_no_function_over_the_limit():
    long = []
    for path, tree in parsed():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1      # from `def`: decorators excluded
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)


def test_the_package_does_not_import_pytest():
    users = [str(path.relative_to(PACKAGE.parent)) for path, tree in parsed()
             if any(isinstance(n, (ast.Import, ast.ImportFrom)) and _names_pytest(n) for n in ast.walk(tree))]
    assert not users, "\n".join(users)


def _names_pytest(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "pytest"
    return any(alias.name.split(".")[0] == "pytest" for alias in node.names)


@pytest.mark.parametrize("source, layers", [
    ("from atom_aot.build.cache import x", {"build"}),
    ("def f():\n    import atom_aot.runtime.llm_engine", {"runtime"}),
    ("from atom_aot import server", {"server"}),
    ("import torch.nn as nn", {"torch"}),
    ("from ..runtime import config", {"runtime"}),
])
def test_imports_are_found_wherever_they_are(source, layers):
    path = PACKAGE / "server" / "example.py"
    assert imported_layers(ast.parse(source), path) == layers
