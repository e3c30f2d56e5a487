"""DESIGN principle 1: the engine is sans-IO and deterministic.

No module of ``softverbs.engine`` -- nor any softverbs module it imports --
imports socket, threading, time or random (the clock and the RNG are passed
in).  Checked on the source, through the import graph, so an import hidden
inside a function counts too.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import softverbs.engine

FORBIDDEN = {"socket", "threading", "time", "random", "asyncio", "selectors", "_thread"}
#: Calls that could sneak a forbidden module in without an import statement.
DYNAMIC = {"__import__", "import_module"}


def engine_modules() -> list[str]:
    names = [softverbs.engine.__name__]
    for info in pkgutil.iter_modules(softverbs.engine.__path__):
        names.append(f"{softverbs.engine.__name__}.{info.name}")
    return names


def source_of(module: str) -> tuple[Path, ast.Module]:
    mod = importlib.import_module(module)
    assert mod.__file__ is not None
    path = Path(mod.__file__)
    if path.suffix != ".py":  # compiled (softverbs.compiled): its source is beside it
        path = path.with_name(module.rpartition(".")[2] + ".py")
    return path, ast.parse(path.read_text(), str(path))


def imports_of(tree: ast.Module, module: str) -> set[str]:
    """Every module an import statement anywhere in ``tree`` names (absolute)."""
    out: set[str] = set()
    package = module if module.endswith("__init__") else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            # "from softverbs.engine import psn" imports a submodule
            out.update(f"{name}.{alias.name}" for alias in node.names)
    return out


def dynamic_imports(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(
                fn, ast.Attribute) else ""  # fmt: skip
            if name in DYNAMIC:
                found.append(ast.unparse(node))
    return found


def closure() -> dict[str, set[str]]:
    """softverbs modules reachable from the engine -> the modules each imports."""
    todo = engine_modules()
    seen: dict[str, set[str]] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            continue  # "from x import name" where name is not a module
        _, tree = source_of(name)
        imported = imports_of(tree, name)
        seen[name] = imported
        # follow softverbs modules, but not the top-level package __init__ (it
        # re-exports the whole API, verbs and fabric included, for users)
        todo.extend(m for m in imported if m.startswith("softverbs.") and m not in seen)
    return seen


def test_engine_has_modules() -> None:
    names = engine_modules()
    expected_modules = ("core", "hca", "qp", "requester", "responder", "rings", "memory", "psn",
                        "qpstate")  # fmt: skip
    for expected in expected_modules:
        assert f"softverbs.engine.{expected}" in names


def test_engine_imports_no_io_clock_or_rng() -> None:
    """The engine's own modules import none of them, not even inside a function."""
    bad = []
    for module in engine_modules():
        _, tree = source_of(module)
        for name in imports_of(tree, module):
            if name.split(".")[0] in FORBIDDEN:
                bad.append(f"{module} imports {name}")
    assert not bad, "the engine must stay sans-IO:\n" + "\n".join(bad)


def test_modules_the_engine_uses_bring_no_io_clock_or_rng() -> None:
    """Nor do the softverbs modules it reaches (wire, enums, errors).

    ``threading`` alone is tolerated there: a thread-local (errors.last_errno)
    adds no I/O, no clock and no randomness to the engine.
    """
    bad = []
    for module, imported in sorted(closure().items()):
        if module.startswith("softverbs.engine"):
            continue
        for name in imported:
            top = name.split(".")[0]
            if top in FORBIDDEN - {"threading", "_thread"}:
                bad.append(f"{module} imports {name}")
    assert not bad, "the engine must stay sans-IO:\n" + "\n".join(bad)


def test_engine_closure_stays_below_verbs_and_fabric() -> None:
    """Imports point one way: the engine knows no verbs object and no fabric."""
    bad = [f"{m} imports {n}" for m, imported in closure().items() for n in imported
           if n.startswith(("softverbs.verbs", "softverbs.fabric", "softverbs.compat",
                            "softverbs.cli"))]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_engine_has_no_dynamic_imports() -> None:
    bad = []
    for module in closure():
        _, tree = source_of(module)
        bad += [f"{module}: {call}" for call in dynamic_imports(tree)]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    import time\n    from random import random\n")
    assert {"time", "random", "random.random"} <= imports_of(tree, "softverbs.engine.x")
