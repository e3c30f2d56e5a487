"""softverbs' layers import downward only, and no two modules import each other.

The layers, lowest first, are :data:`LAYERS`: a module may import modules of
its own layer's packages and of the layers below it, never above.  The check
reads the source (``ast``), so an import inside a function counts as much as
one at the top; only imports under ``if TYPE_CHECKING:`` are exempt, since
they never run.  ``from softverbs import X`` names the submodule ``X`` where
there is one; anything else from the package itself is the public facade
(``softverbs/__init__``, which resolves its names lazily from verbs, sim,
errors and enums), a layer above the simulation.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import softverbs

SRC = Path(softverbs.__file__).resolve().parent

#: lowest first; a unit is a top-level module or package of softverbs
#: (``service.server`` and ``service.__main__`` split the service package)
LAYERS: list[set[str]] = [
    {"errors", "enums", "layout", "compiled"},
    {"config", "wire"},
    {"engine"},
    {"fabric", "sanitizer", "trace"},
    {"device"},
    {"hostmem"},
    {"verbs"},
    {"cm", "compat", "sim"},
    {"ext", "service", "incast", "testing", "__init__"},
    {"samples"},
    {"cli", "native"},
    {"__main__"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (SRC / rel).with_suffix(".py").exists() or (SRC / rel / "__init__.py").exists()


def _type_only(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


@functools.cache
def imports() -> dict[str, set[str]]:
    """module -> the softverbs modules it imports (at run time)."""
    out: dict[str, set[str]] = defaultdict(set)
    for path in SRC.rglob("*.py"):
        if "compat/pyverbs" in path.as_posix():  # a module tree of aliases (compat/__init__)
            continue
        me = _module(path)
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                names += [f"{node.module}.{a.name}" for a in node.names
                          if _is_module(f"{node.module}.{a.name}")]  # fmt: skip
                if node.module == "softverbs" and len(names) == 1:
                    names = ["softverbs"]  # the facade itself
            else:
                continue
            out[me].update(n for n in names if n.split(".")[0] == "softverbs" and
                           not (n == "softverbs" and len(names) > 1))  # fmt: skip
    return out


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for m in imports()} | {p.stem for p in SRC.glob("*.py")}
    units |= {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert units <= set(RANK), f"give these a layer in LAYERS: {sorted(units - set(RANK))}"


def test_no_module_imports_upward() -> None:
    upward = []
    for me, targets in sorted(imports().items()):
        for target in sorted(targets):
            if RANK[_unit(target)] > RANK[_unit(me)]:
                upward.append(f"{me} -> {target}")
    assert not upward, "imports that run back up a layer:\n" + "\n".join(upward)


def test_no_import_cycles_between_units() -> None:
    """No two layers' units import each other (within one layer, units are independent)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for me, targets in imports().items():
        for target in targets:
            a, b = _unit(me), _unit(target)
            if a != b:
                edges[a].add(b)
    both = sorted(f"{a} <-> {b}" for a in edges for b in edges[a]
                  if a < b and a in edges.get(b, set()))  # fmt: skip
    assert not both, "units that import each other:\n" + "\n".join(both)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more nodes of ``graph``
    (Tarjan), sorted: the modules that import each other in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            group.append(v)
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def cycles(unit: str) -> list[list[str]]:
    """The import circles among ``unit``'s modules; an edge is any run-time
    import, at module level or inside a function (the package's ``__init__``
    is a module like the others)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for me, targets in imports().items():
        if _unit(me) == unit:
            graph[me].update(t for t in targets if _unit(t) == unit and t != me)
    return circles(graph)


def test_no_import_cycles_inside_a_unit() -> None:
    found = {unit: groups for unit in sorted(RANK) if (groups := cycles(unit))}
    assert not found, "modules that import each other in a circle:\n" + "\n".join(
        f"{unit}: {', '.join(m.rsplit('.', 1)[-1] for m in group)}"
        for unit, groups in found.items() for group in groups)  # fmt: skip


def test_the_cycle_finder() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}}) == []


def test_the_scan_sees_imports_in_functions_and_not_type_only_ones() -> None:
    """The scan itself: a module-level import, one inside a function, and a
    TYPE_CHECKING one (ignored), each as the source has it."""
    found = imports()
    assert "softverbs.device.protocol" in found["softverbs.verbs.served"]  # module level
    assert "softverbs.verbs.served" in found["softverbs.verbs.world"]
    assert "softverbs.fabric.pcap" in found["softverbs.verbs.registry"]  # inside a function
    assert "softverbs.sim" not in found["softverbs"]  # the facade names it under TYPE_CHECKING

