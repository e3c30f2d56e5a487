"""The QP engine is ``class QPEngine(Requester, Responder)`` over ``QPCore``.

A method defined in both halves is silently shadowed by the MRO: the
Responder's version would never run (this happened once).  So the halves
must not share a name, and the abstract hooks of QPCore must be implemented
below it.
"""

from __future__ import annotations

import inspect

from softverbs.engine.core import QPCore
from softverbs.engine.qp import QPEngine
from softverbs.engine.requester import Requester
from softverbs.engine.responder import Responder

_IMPLICIT = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
             "__annotations__", "__firstlineno__", "__static_attributes__"}  # fmt: skip


def own_names(cls: type) -> set[str]:
    return {n for n in vars(cls) if n not in _IMPLICIT}


def test_requester_and_responder_share_no_name() -> None:
    clash = own_names(Requester) & own_names(Responder)
    assert not clash, (
        f"Requester and Responder both define {sorted(clash)}; in QPEngine(Requester, "
        "Responder) the Responder's version would be dead code. Rename one of them."
    )


def test_halves_are_siblings_over_qpcore() -> None:
    assert QPEngine.__mro__[1:4] == (Requester, Responder, QPCore)


def test_halves_do_not_override_each_others_core_hooks() -> None:
    """A name both a half and QPEngine define is fine; a half overriding QPCore's
    hook that the other half also relies on must be the only override."""
    for name in own_names(QPCore):
        owners = [c.__name__ for c in (Requester, Responder) if name in vars(c)]
        assert len(owners) <= 1, f"QPCore.{name} is overridden by both {owners}"


def test_abstract_hooks_are_implemented() -> None:
    for name, member in vars(QPCore).items():
        if not inspect.isfunction(member):
            continue
        src = inspect.getsource(member)
        if "raise NotImplementedError" in src:
            impl = getattr(QPEngine, name)
            assert impl is not member, f"QPEngine does not implement QPCore.{name}"


def test_every_engine_method_resolves_where_it_is_defined() -> None:
    """No method of either half is shadowed in the final class."""
    for half in (Requester, Responder):
        for name, member in vars(half).items():
            if inspect.isfunction(member) and name not in vars(QPEngine):
                assert getattr(QPEngine, name) is member, f"{half.__name__}.{name} is shadowed"
