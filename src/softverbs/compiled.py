"""One source, two speeds: which of softverbs' modules run compiled.

The hot modules (:data:`MODULES`) are ordinary ``.py`` files and the only
implementation.  ``pip install`` compiles them with Cython in pure-Python mode
when Cython and a C compiler are present (``setup.py``); the extension module
is then installed beside its ``.py`` and Python's import system prefers it.
Without a compiler nothing is compiled and the package runs interpreted: the
behaviour is the same, only slower.  A few of the modules have a ``.pxd``
beside them that makes their hottest classes C extension types with typed
attributes; the ``.py`` stays valid Python for the interpreted mode.

``SOFTVERBS_PURE=1`` runs the ``.py`` files even where the compiled modules
are installed, so one install can be tested both ways: ``softverbs/__init__``
calls :func:`install_pure_hook` before any of these modules is imported, and
the hook finds each of them as source.  :func:`mode` says which is running
(``softverbs --version``, ``softverbs devinfo``, ``softverbs.COMPILED``).

This module is imported by ``setup.py`` from the source tree, so it imports
nothing of softverbs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

#: the modules compiled when a compiler is there (dotted names; never a package's __init__)
MODULES: tuple[str, ...] = (
    "softverbs.layout",
    "softverbs.hostmem",
    "softverbs.engine.completer",
    "softverbs.engine.congestion",  # the window and pacing asked per packet
    "softverbs.engine.core",
    "softverbs.engine.hca",
    "softverbs.engine.memory",
    "softverbs.engine.psn",
    "softverbs.engine.qp",
    "softverbs.engine.qpstate",
    "softverbs.engine.requester",
    "softverbs.engine.responder",
    "softverbs.engine.rings",
    "softverbs.engine.wr",
    "softverbs.wire.codec",
    "softverbs.wire.opcodes",
    "softverbs.wire.packet",
    "softverbs.device.core",
    "softverbs.device.memory",
    "softverbs.device.qp",  # the doorbell, on every post through the service
    "softverbs.device.protocol",
    "softverbs.service.server",
    "softverbs.fabric.runtime",
    "softverbs.fabric.udp",  # the UDP fabric's receive and send, on every datagram
    "softverbs.verbs.base",
    "softverbs.verbs.cq",
    "softverbs.verbs.provider",
    "softverbs.verbs.qp",
    "softverbs.verbs.sge",  # every work request's scatter/gather list
    "softverbs.verbs.wr",
)

#: The modules whose ``.pxd`` files link them at the C level: one ``cimport``s
#: another's extension types or functions, so a compiled one cannot run beside
#: an interpreted one (its typed fields reject the Python class, its import of
#: the other's C functions fails).  If any of them is stale, or has no compiled
#: module (it failed to compile), all run from source.
#: tests/test_pxd.py checks that every module a ``.pxd`` cimports, and the
#: module cimporting it, is here.
LINKED: frozenset[str] = frozenset({
    "softverbs.engine.completer",
    "softverbs.engine.congestion",
    "softverbs.engine.core",
    "softverbs.engine.hca",
    "softverbs.engine.memory",
    "softverbs.engine.psn",
    "softverbs.engine.qp",
    "softverbs.engine.requester",
    "softverbs.engine.responder",
    "softverbs.engine.rings",
    "softverbs.engine.wr",
    "softverbs.wire.codec",  # cimports Packet
    "softverbs.device.memory",  # cimports engine.memory (current_pass)
    "softverbs.fabric.runtime",  # cimports HCA and Packet
    "softverbs.fabric.udp",  # cimports Runtime, HCA, Packet and BurstMerger
    "softverbs.service.server",  # cimports Runtime
    "softverbs.wire.opcodes",
    "softverbs.wire.packet",
    "softverbs.verbs.base",
    "softverbs.verbs.cq",
    "softverbs.verbs.qp",
    "softverbs.verbs.sge",
    "softverbs.verbs.wr",
})  # fmt: skip

#: the environment switch that runs the .py files even where compiled ones exist
PURE_ENV = "SOFTVERBS_PURE"


def pure_requested() -> bool:
    """Whether ``SOFTVERBS_PURE`` asks for the interpreted modules."""
    return os.environ.get(PURE_ENV, "").strip().lower() not in ("", "0", "no", "false")


#: a compiled module older than its .py (or its .pxd) by more than this (seconds) is
#: stale (edited after the build); the margin covers an install that writes the
#: .py just after the extension
STALE_AFTER = 2.0

#: the modules found stale and imported from source instead
stale: set[str] = set()

#: the modules of :data:`LINKED` that have no compiled module (one that failed to
#: compile): the others of :data:`LINKED` then run from source too
uncompiled: set[str] = set()


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Imports a module of :data:`MODULES` from its ``.py`` when interpreted
    mode is asked for, or when its compiled module is stale; otherwise it
    leaves the module to the ordinary finders (which prefer the extension).

    An extension module of the same package that is not in :data:`MODULES` is
    a leftover of an older build (a module compiled once and no longer listed):
    its ``.py`` runs, and it is recorded in :data:`stale`."""

    def __init__(self, pure: bool) -> None:
        self.pure = pure

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not path or not fullname.startswith(_packages()):
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            base = os.path.join(entry, leaf)
            if not os.path.isfile(base + ".py"):
                continue
            built = _built(base)
            if built is None:
                return None  # not compiled: the ordinary finders take the .py
            if fullname not in MODULES:
                stale.add(fullname)  # a leftover of an older build
            elif not self.pure:
                if _is_stale(base, built):
                    stale.add(fullname)
                elif not (fullname in LINKED and _linked_stale(entry, fullname)):
                    return None
            return importlib.util.spec_from_file_location(fullname, base + ".py")
        return None


def _packages() -> tuple[str, ...]:
    """The top packages of :data:`MODULES`, as prefixes (``"softverbs."``)."""
    return tuple({name.partition(".")[0] + "." for name in MODULES})


def _built(base: str) -> str | None:
    """The extension module beside ``base`` + ``.py``, if one is there."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.isfile(base + suffix):
            return base + suffix
    return None


def _is_stale(base: str, built: str) -> bool:
    """Whether ``base``'s .py or .pxd was edited after ``built`` was."""
    newest = max(os.path.getmtime(base + ext) for ext in (".py", ".pxd")
                 if os.path.isfile(base + ext))  # fmt: skip
    return newest > os.path.getmtime(built) + STALE_AFTER


def _linked_stale(entry: str, fullname: str) -> bool:
    """Whether a module linked with ``fullname`` (:data:`LINKED`; ``entry`` is
    ``fullname``'s package directory, the others are found from the same root) is
    stale, or was not compiled; it is then recorded in :data:`stale` or
    :data:`uncompiled`."""
    root = entry
    for _ in range(fullname.count(".")):  # up from the package to the top package's parent
        root = os.path.dirname(root)
    found = False
    for other in LINKED:
        base = os.path.join(root, *other.split("."))
        built = _built(base)
        if built is None and os.path.isfile(base + ".py"):
            uncompiled.add(other)
            found = True
        elif built is not None and _is_stale(base, built):
            stale.add(other)
            found = True
    return found


def install_pure_hook() -> None:
    """Import the listed modules from source under ``SOFTVERBS_PURE``, or where stale."""
    if not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst(pure_requested()))


def _is_compiled(name: str) -> bool:
    module = sys.modules.get(name)
    spec = module.__spec__ if module is not None else None
    if spec is None:
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:
            return False
    return isinstance(spec.loader if spec else None, importlib.machinery.ExtensionFileLoader)


def compiled_modules() -> list[str]:
    """The modules of :data:`MODULES` that import (or have imported) compiled."""
    return [name for name in MODULES if _is_compiled(name)]


def mode() -> str:
    """``compiled (N of M modules)``, or ``interpreted`` with the reason."""
    done = compiled_modules()
    if done:
        note = f"; stale, run from source: {', '.join(sorted(stale))}" if stale else ""
        if uncompiled:
            note += f"; not compiled, so its links run from source: {', '.join(sorted(uncompiled))}"
        return f"compiled ({len(done)} of {len(MODULES)} modules, Cython{note})"
    if pure_requested():
        return f"interpreted ({PURE_ENV} is set)"
    return "interpreted (no compiled modules installed)"
