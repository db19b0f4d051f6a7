"""Imports run one way: no module of the engine (libs/) or the services imports another that
imports it back, not even for types (a `TYPE_CHECKING` import counts) or inside a function.
Read from the source, so a cycle shows here before it shows as an ImportError that depends on
which module is imported first."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where each tree's top-level packages live, and the trees: the engine and tooling packages
# (libs/quire, libs/quire_tools) and the services (generated gRPC stubs left out).
TREES = ((ROOT / "libs", ROOT / "libs"), (ROOT, ROOT / "services"))


def module_files() -> dict[str, Path]:
    modules = {}
    for base, tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[:2] == ("services", "rpc"):
                continue
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules `name` imports anywhere in its source, packages on the way
    included (importing `a.b.c` runs `a.b` first)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: None if path.name == "__init__.py" else -1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                module = ".".join(parts[:i])
                if module in modules and not f"{name}.".startswith(f"{module}."):
                    found.add(module)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per module that is on one (depth-first search)."""
    found: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            found.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        path.append(module)
        for other in sorted(graph[module]):
            visit(other)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    return found


def test_no_module_imports_itself_back() -> None:
    modules = module_files()
    assert {"quire.block.tables", "quire_tools.make_model", "services.router.main"} <= set(modules)
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    assert "services.router.tool_parsers.base" in graph["services.router.tool_calls"]
    assert "quire.block.allocator" in graph["quire.block.tables"]
    assert cycles(graph) == []


def test_the_search_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
