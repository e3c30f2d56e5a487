"""The ``.pxd`` files agree with their ``.py`` modules and with softverbs.compiled.

A ``.pxd`` beside a hot module (softverbs.compiled.MODULES) is read only when the
module is compiled, so a mistake in it shows in compiled mode alone, and often
only at run time on the path that hits it.  These checks read the sources as text
(no compiler, no build; they run the same in both modes) and name the file and
the fix:

* every ``.pxd`` belongs to a module in ``MODULES`` (otherwise it is never used);
* a module whose ``.pxd`` ``cimport``s another softverbs module, and that module,
  are in ``LINKED`` (a compiled one cannot import an interpreted one's types);
* every attribute a ``cdef class``'s methods set on ``self`` is declared in the
  ``.pxd`` (an extension type has no ``__dict__``: compiled, the assignment
  raises AttributeError);
* every ``cpdef``/``cdef`` function or method declared has a ``def`` of the same
  name, parameters and defaults in the ``.py``;
* no module imports a name that a ``.pxd`` makes a C global (compiled, it is not
  a module attribute, and the import fails).

The parser below knows the subset of Cython the ``.pxd`` files use (see
docs/architecture.md, "One source, two speeds"); a declaration it cannot read
fails the test rather than being skipped.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from softverbs import compiled

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


@dataclass
class Function:
    """A ``cpdef``/``cdef`` function or method: its parameter names, in order, and
    which of them have a default (``=*`` in the .pxd)."""

    name: str
    params: list[str]
    defaults: list[bool]
    line: int


@dataclass
class CClass:
    pxd: str  # the .pxd declaring it
    name: str
    bases: list[str]
    line: int
    attributes: set[str] = field(default_factory=set)
    methods: dict[str, Function] = field(default_factory=dict)


@dataclass
class Pxd:
    path: str  # as messages show it: relative to the tree
    classes: dict[str, CClass] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)
    globals: set[str] = field(default_factory=set)
    cimports: set[str] = field(default_factory=set)


_CLASS = re.compile(r"cdef class (\w+)(?:\(([\w., ]*)\))?:$")
_FUNC = re.compile(r"c(?:p)?def (?:inline )?[\w\s*\[\]]*?\b(\w+)\((.*)\)(?:\s+\w+)*$")
_CIMPORT = re.compile(
    r"(?:from (softverbs[\w.]*) cimport .*|cimport (softverbs[\w.]*)(?: as \w+)?)$"
)
#: a C variable or attribute, a typed memoryview's ``[::1]`` included
_VAR = re.compile(r"cdef (?:public |readonly )?((?:[\w\s*]|\[[:1, ]*\])+?)\s*$")


def _split_params(text: str) -> list[str]:
    """``self, long long index, bint everything=*`` -> the parameters, at depth 0."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "([") - (ch in ")]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out]


def _function(name: str, params: str, line: int) -> Function:
    names, defaults = [], []
    for p in _split_params(params):
        decl, _, default = p.partition("=")
        names.append(decl.split()[-1].lstrip("*"))
        defaults.append(bool(default))
    return Function(name, names, defaults, line)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """The lines with code, comments cut, a declaration continued in open
    parentheses joined into one, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    depth = 0
    for number, raw in enumerate(text.splitlines(), 1):
        code = raw.split("#", 1)[0].rstrip()
        if depth:
            out[-1] = (out[-1][0], out[-1][1] + " " + code.strip())
        elif code.strip():
            out.append((number, code))
        depth += code.count("(") - code.count(")")
    return out


def parse_pxd(path: Path, root: Path = ROOT) -> Pxd:
    """The declarations of one .pxd: its cdef classes (attributes, methods), its
    module-level functions and C globals, and the softverbs modules it cimports."""
    pxd = Pxd(str(path.relative_to(root)))
    current: CClass | None = None
    for number, text in _logical_lines(path.read_text()):
        if text.lstrip().startswith("@"):
            continue  # a decorator (@cython.locals...): the types of locals
        indented = text[0].isspace()
        line = text.strip()
        if not indented:
            current = None
        where = f"{pxd.path}:{number}"
        if m := _CLASS.match(line):
            assert not indented, f"{where}: a nested cdef class"
            bases = [b.strip().rpartition(".")[2] for b in (m.group(2) or "").split(",")]
            current = CClass(pxd.path, m.group(1), [b for b in bases if b], number)
            pxd.classes[current.name] = current
        elif m := _CIMPORT.match(line):
            pxd.cimports.add(m.group(1) or m.group(2))
        elif line in ("cimport cython", "pass") or line.startswith("from libc"):
            continue
        elif m := _FUNC.match(line):
            fn = _function(m.group(1), m.group(2), number)
            (current.methods if current else pxd.functions)[fn.name] = fn
        elif line.startswith("cdef ") and "(" not in line:
            first, *rest = line.split(",")
            m = _VAR.match(first)
            assert m, f"{where}: cannot read the declaration {line!r}"
            names = [m.group(1).split()[-1].lstrip("*")] + [r.strip().lstrip("*") for r in rest]
            assert all(n.isidentifier() for n in names), f"{where}: cannot read {line!r}"
            (current.attributes if current else pxd.globals).update(names)
        else:
            raise AssertionError(f"{where}: a .pxd line this test cannot read: {line!r}")
    return pxd


def _module(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts)


def _pxds() -> dict[str, Pxd]:
    return {_module(p): parse_pxd(p) for p in sorted(SRC.rglob("*.pxd"))}


def _self_attributes(cls: ast.ClassDef) -> dict[str, int]:
    """The attributes ``cls``'s own methods assign on ``self``, with a line each."""
    found: dict[str, int] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or not fn.args.args:
            continue
        me = fn.args.args[0].arg
        for node in ast.walk(fn):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                for leaf in ast.walk(t):
                    if (
                        isinstance(leaf, ast.Attribute)
                        and isinstance(leaf.value, ast.Name)
                        and leaf.value.id == me
                        and isinstance(leaf.ctx, ast.Store)
                    ):
                        found.setdefault(leaf.attr, leaf.lineno)
    return found


def _signature(fn: ast.FunctionDef) -> tuple[list[str], list[bool]]:
    args = fn.args.posonlyargs + fn.args.args
    first_default = len(args) - len(fn.args.defaults)
    return [a.arg for a in args], [i >= first_default for i in range(len(args))]


def _class_names(cls: ast.ClassDef) -> set[str]:
    """The names ``cls``'s body defines: methods, properties, class attributes."""
    out: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def _imports_from(importer: str, tree: ast.Module) -> list[tuple[str, str, int]]:
    """(module, name, line) for each ``from module import name`` of ``importer``,
    relative imports resolved."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = importer.rsplit(".", node.level)[0]
                module = f"{package}.{module}" if module else package
            out += [(module, alias.name, node.lineno) for alias in node.names]
    return out


def check(pxds: dict[str, Pxd], modules: tuple[str, ...], linked: frozenset[str],
          sources: dict[str, str]) -> list[str]:  # fmt: skip
    """Every disagreement, as a message naming the file, the line and the fix.
    ``sources`` maps a module name to its .py text (every module that may import)."""
    problems: list[str] = []
    trees = {name: ast.parse(text) for name, text in sources.items()}
    declared: dict[str, CClass] = {c.name: c for p in pxds.values() for c in p.classes.values()}
    nodes: dict[tuple[str, str], ast.ClassDef] = {}  # (pxd, class): its class in the .py
    for name, pxd in pxds.items():
        for node in trees[name].body:
            if isinstance(node, ast.ClassDef) and node.name in pxd.classes:
                nodes[pxd.path, node.name] = node

    def attributes(c: CClass) -> set[str]:
        """What an instance may set: the .pxd's attributes and the names of the
        class body (a property's setter), its cdef bases' too."""
        out = c.attributes | (
            _class_names(nodes[key]) if (key := (c.pxd, c.name)) in nodes else set()
        )
        for base in c.bases:
            if base in declared:
                out |= attributes(declared[base])
        return out

    for name, pxd in pxds.items():
        where = pxd.path
        if name not in modules:
            problems.append(
                f"{where}: {name} is not in softverbs.compiled.MODULES, so this "
                ".pxd is never compiled; add the module there or remove the .pxd"
            )
        for other in sorted(pxd.cimports):
            for m in (name, other):
                if m not in linked:
                    problems.append(
                        f"{where}: cimports {other}, so {m} must be in "
                        "softverbs.compiled.LINKED (linked modules run from source "
                        "together)"
                    )
        tree = trees[name]
        py = where.removesuffix(".pxd") + ".py"
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for c in pxd.classes.values():
            cls = nodes.get((where, c.name))
            if cls is None:
                problems.append(f"{where}:{c.line}: cdef class {c.name} has no class in {py}")
                continue
            have = attributes(c)
            for attr, line in sorted(_self_attributes(cls).items()):
                if attr not in have and "__dict__" not in have:
                    problems.append(
                        f"{py}:{line}: {c.name} sets self.{attr}, which {where} "
                        f"does not declare: compiled, an extension type has no "
                        f"__dict__ and this raises AttributeError; declare it in "
                        f"cdef class {c.name} ({where}:{c.line})"
                    )
            methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
            for fn in c.methods.values():
                problems += _compare(fn, methods.get(fn.name), f"{c.name}.", where, py)
        for fn in pxd.functions.values():
            problems += _compare(fn, defs.get(fn.name), "", where, py)
    for importer, tree in trees.items():
        for module, imported, line in _imports_from(importer, tree):
            if module in pxds and imported in pxds[module].globals:
                problems.append(
                    f"{importer}:{line}: imports {imported} from {module}, a C "
                    f"global of {pxds[module].path} that compiled mode does not "
                    "export; import a public Python name instead"
                )
    return problems


def _compare(fn: Function, node: ast.FunctionDef | None, owner: str, where: str,
             py: str) -> list[str]:  # fmt: skip
    if node is None:
        return [f"{where}:{fn.line}: declares {owner}{fn.name}, which {py} does not define"]
    names, defaults = _signature(node)
    if (names, defaults) == (fn.params, fn.defaults):
        return []

    def show(ps: list[str], ds: list[bool]) -> str:
        return ", ".join(p + ("=..." if d else "") for p, d in zip(ps, ds, strict=True))

    return [
        f"{py}:{node.lineno}: {owner}{fn.name}({show(names, defaults)}) differs from its "
        f"declaration {owner}{fn.name}({show(fn.params, fn.defaults)}) at {where}:{fn.line}; "
        "make the .pxd and the .py agree"
    ]


@functools.cache
def _sources() -> dict[str, str]:
    out = {_module(p): p.read_text() for p in SRC.rglob("*.py")}
    out.update({".".join(p.relative_to(ROOT).with_suffix("").parts): p.read_text()
                for p in (ROOT / "tests").rglob("*.py")})  # fmt: skip
    return out


def test_every_pxd_agrees_with_its_module_and_the_compiled_lists() -> None:
    problems = check(_pxds(), compiled.MODULES, compiled.LINKED, _sources())
    assert not problems, "\n".join(problems)


BROKEN_PY = """
class Slot:
    def __init__(self, size, items=None):
        self.size = size
        self.items = items
        self.extra = 0

    def write(self, index, item, more):
        pass

def helper(x):
    return x
"""

BROKEN_PXD = """
from softverbs.engine.rings cimport CQE

cdef long long _SECRET

cdef class Slot:
    cdef public long long size
    cdef public list items

    @cython.locals(i=cython.longlong,
                   j=cython.longlong)
    cpdef write(self, long long index, object item)
    cpdef read(self, long long index)

cpdef long long helper(long long x, long long y=*)
"""


@pytest.mark.parametrize("kind", ["attribute", "signature", "missing", "function", "lists",
                                  "global"])  # fmt: skip
def test_each_mistake_is_named(tmp_path: Path, kind: str) -> None:
    """The checker on a deliberately broken module: each kind of mistake is reported."""
    pkg = tmp_path / "softverbs" / "bad"
    pkg.mkdir(parents=True)
    pxd_path = pkg / "slots.pxd"
    pxd_path.write_text(textwrap.dedent(BROKEN_PXD))
    pxd = parse_pxd(pxd_path, tmp_path)
    sources = {"softverbs.bad.slots": BROKEN_PY,
               "softverbs.bad.user": "from softverbs.bad.slots import _SECRET\n"}  # fmt: skip
    problems = "\n".join(check({"softverbs.bad.slots": pxd}, (), frozenset(), sources))
    expected = {
        "attribute": "Slot sets self.extra, which softverbs/bad/slots.pxd does not declare",
        "signature": "Slot.write(self, index, item, more) differs from its declaration "
                     "Slot.write(self, index, item)",
        "missing": "declares Slot.read, which softverbs/bad/slots.py does not define",
        "function": "helper(x) differs from its declaration helper(x, y=...)",
        "lists": "softverbs.bad.slots is not in softverbs.compiled.MODULES",
        "global": "softverbs.bad.user:1: imports _SECRET from softverbs.bad.slots",
    }  # fmt: skip
    assert expected[kind] in problems, problems
    assert "softverbs.engine.rings must be in softverbs.compiled.LINKED" in problems


def test_an_unreadable_pxd_line_fails_rather_than_passing(tmp_path: Path) -> None:
    path = tmp_path / "odd.pxd"
    path.write_text("ctypedef struct point:\n    int x\n")
    with pytest.raises(AssertionError, match=r"a \.pxd line this test cannot read"):
        parse_pxd(path, tmp_path)


@pytest.mark.parametrize(("edit", "expected"), [
    (("    cdef public object index, dead\n", "    cdef public object index\n"),
     "src/softverbs/engine/rings.py:{dead}: CQE sets self.dead, which "
     "src/softverbs/engine/rings.pxd does not declare"),
    (("cpdef long long offset(self, long long index)",
      "cpdef long long offset(self, long long index, bint wrap=*)"),
     "PackedSlots.offset(self, index) differs from its declaration "
     "PackedSlots.offset(self, index, wrap=...)"),
])  # fmt: skip
def test_a_broken_copy_of_a_real_pxd_is_caught(
    tmp_path: Path, edit: tuple[str, str], expected: str
) -> None:
    """The tree's own rings.pxd, copied and broken as a contributor might: the check
    that passes on the tree fails on the copy, naming the line."""
    real = SRC / "softverbs" / "engine" / "rings.pxd"
    copy = tmp_path / "src" / "softverbs" / "engine" / "rings.pxd"
    copy.parent.mkdir(parents=True)
    text = real.read_text()
    assert edit[0] in text, "rings.pxd changed: update this test's edit"
    copy.write_text(text.replace(edit[0], edit[1]))
    pxds = _pxds()
    pxds["softverbs.engine.rings"] = parse_pxd(copy, tmp_path)
    problems = "\n".join(check(pxds, compiled.MODULES, compiled.LINKED, _sources()))
    py = (SRC / "softverbs" / "engine" / "rings.py").read_text()
    dead = py[: py.index("        self.dead = False")].count("\n") + 1  # where CQE sets it
    assert expected.format(dead=dead) in problems, problems
