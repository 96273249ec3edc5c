"""The library is a one-way stack: models -> encoding -> index/search -> eval -> training (README, "Layout").

Every ``import`` in every module under ``embedlib/`` (at the top or inside a function) is read with ``ast``; a
module may import its own layer and the layers below it, never one above. Modules do not import each other
in a cycle. Shared ground (``errors``, ``config``, ``storage``, ``data``) imports nothing above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import embedlib

ROOT = Path(embedlib.__file__).parent
# Package -> its place in the stack; the shared ground is 0.
STACK = {
    "errors": 0, "config": 0, "storage": 0, "data": 0, "submitted": 0, "provenance": 0, "local_ray": 0,
    "models": 1,
    "encoding": 2,
    "index": 3, "search": 3,
    "eval": 4,
    "training": 5, "objectives": 5,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def package_of(path: Path) -> str:
    return module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]


def imported_modules(source: str, package: str) -> set[str]:
    """The embedlib modules a module of ``package`` imports (``from pkg import mod`` is ``pkg.mod`` only)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}")}
            found |= submodules or {base}
    return {name for name in found if name == "embedlib" or name.startswith("embedlib.")}


def layer(module: str) -> int | None:
    """The stack place of ``embedlib.<package>...``; None for the package root (a lazy re-export facade)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    assert parts[1] in STACK, f"{module}: package {parts[1]!r} has no place in the stack (add it to STACK)"
    return STACK[parts[1]]


def is_package(module: str) -> bool:
    return (ROOT.parent / module.replace(".", "/") / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
    return {
        module_name(path): imported_modules(path.read_text(), package_of(path)) for path in sorted(ROOT.rglob("*.py"))
    }


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in import_graph().items()
        for target in sorted(targets)
        if layer(module) is not None and layer(target) is not None and layer(target) > layer(module)
    ]
    assert not upward, "imports against the stack order:\n" + "\n".join(upward)


def test_modules_import_each_other_in_no_cycle():
    """Package ``__init__`` files (lazy re-exports) are left out: the cycles that count are between modules."""
    graph = {
        module: {t for t in targets if not is_package(t) and is_module(t)}
        for module, targets in import_graph().items()
        if not is_package(module)
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [module, target]))
            elif target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_walk_finds_imports_inside_functions_and_relative_ones():
    source = "def f():\n    from embedlib.eval import metrics\n    from ..index import sharded\n"
    assert imported_modules(source, "embedlib.models") == {"embedlib.eval.metrics", "embedlib.index.sharded"}
    assert layer("embedlib.eval.metrics") > layer("embedlib.models.tiny")
