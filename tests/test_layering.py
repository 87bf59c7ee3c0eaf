"""The package's shape, read from its source (ast, so imports inside functions count too): which layer and
which runtime sub-package may import which, no import cycle anywhere, and the size limits of files and functions."""
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
    # checkpoint conversion and the random draw: below build and runtime, which both run it
    "weights": {"runtime", "build", "server", "entrypoints"},
}

# module -> layers it may import against its layer's rule, and why (one entry per deliberate exception)
EXCEPTIONS: dict[str, set[str]] = {}

# The runtime's rooms (its sub-packages), bottom to top: each imports only rooms before it. Its flat modules are
# the contracts below them all (config, sampling_params, outputs, transfer) and the composition root above them all.
RUNTIME_ROOMS = ("scheduling", "text", "loading", "sampling", "execution", "spec", "parallel", "engine", "processes")
# room -> what it must not import although the order would allow it, and why
RUNTIME_FORBIDDEN = {
    "scheduling": {"torch"},      # plain Python: unit-tested on any machine
    "engine": {"loading", "execution", "spec", "parallel"},   # the core reaches its runner through a protocol
}
MAX_FLAT_RUNTIME_MODULES = 15


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


def runtime_room(path: Path) -> str | None:
    """The runtime sub-package a module lives in (None: a flat module of runtime/, or not the runtime)."""
    parts = path.relative_to(PACKAGE).parts
    return parts[1] if parts[0] == "runtime" and len(parts) > 2 else None


def imported_rooms(tree: ast.Module, path: Path) -> set[str]:
    """The runtime sub-packages (and `torch`) a module imports, at any depth."""
    rooms = set()
    for name in imported_names(tree, path):
        parts = name.split(".")
        if parts[0] == "torch":
            rooms.add("torch")
        elif parts[:2] == ["atom_aot", "runtime"] and len(parts) > 2 and (PACKAGE / "runtime" / parts[2]).is_dir():
            rooms.add(parts[2])
    return rooms


def imported_names(tree: ast.Module, path: Path) -> list[str]:
    """Every dotted name a module imports (`from a.b import c` gives a.b and a.b.c), at any depth."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path)
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def module_graph() -> dict[str, set[str]]:
    """atom_aot module -> the atom_aot modules it imports (lazy imports included)."""
    def name_of(path: Path) -> str:
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    trees = {name_of(path): (path, tree) for path, tree in parsed()}
    graph = {}
    for module, (path, tree) in trees.items():
        found = set()
        for name in imported_names(tree, path):
            parts = name.split(".")
            while parts and ".".join(parts) not in trees:      # a name inside a module: the module
                parts.pop()
            if parts and ".".join(parts) != module:
                found.add(".".join(parts))
        graph[module] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root), on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child), on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules():
    assert not (found := cycles(module_graph())), "\n".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_between_runtime_sub_packages():
    rooms: dict[str, set[str]] = {}
    for path, tree in parsed():
        if (room := runtime_room(path)) is not None:
            rooms.setdefault(room, set()).update(imported_rooms(tree, path) - {room, "torch"})
    assert not (found := cycles(rooms)), "\n".join(" <-> ".join(c) for c in found)


def test_runtime_rooms_import_only_rooms_below_them():
    violations = []
    for path, tree in parsed():
        room = runtime_room(path)
        if room is None:
            continue
        above = set(RUNTIME_ROOMS[RUNTIME_ROOMS.index(room):]) - {room} if room in RUNTIME_ROOMS else set()
        bad = imported_rooms(tree, path) & (above | RUNTIME_FORBIDDEN.get(room, set()))
        violations += [f"{path.relative_to(PACKAGE.parent)} imports runtime/{name}" for name in sorted(bad)]
    assert not violations, "\n".join(violations)


def test_the_runtime_is_rooms_around_a_few_flat_modules():
    rooms = [p for p in (PACKAGE / "runtime").iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    flat = list((PACKAGE / "runtime").glob("*.py"))
    assert len(rooms) >= 3 and {p.name for p in rooms} == set(RUNTIME_ROOMS)
    assert len(flat) <= MAX_FLAT_RUNTIME_MODULES, sorted(p.name for p in flat)


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


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
