"""The QP engine's three parts own their state, and WQEs move by the table.

``QPEngine`` holds a requester, a completer and a responder (softverbs.engine
.core says who does what).  Each owns its progress: no two parts keep a
field of the same name (a shared name was how the old mixin design let one
half shadow the other).  A send WQE's state moves only along
``rings.WQE_MOVES``; the engine asserts each move, so every test that
drives the engine also checks the table.
"""

from __future__ import annotations

import inspect
from typing import Any

from engine_kit import Bench

from softverbs.engine.rings import WQE_MOVES, SendWQE, WqeState
from softverbs.engine.wr import move as _move


def _fields(obj: Any) -> set[str]:
    """An object's fields: its __dict__, or (an extension type, compiled with
    its .pxd) the fields its type declares, which are data descriptors."""
    if hasattr(obj, "__dict__"):
        return set(vars(obj))
    return {name for name, v in vars(type(obj)).items()
            if inspect.isdatadescriptor(v) and not name.startswith("__")}  # fmt: skip


def test_each_part_owns_its_state() -> None:
    qp = Bench(pmtu=256).a.qp
    links = {"qp", "req", "comp"}
    parts = {"req": qp.req, "comp": qp.comp, "resp": qp.resp}
    fields = {name: _fields(p) - links for name, p in parts.items()}
    assert all(fields.values())
    for a in fields:
        for b in fields:
            if a < b:
                assert not fields[a] & fields[b], (a, b, fields[a] & fields[b])
    assert not (set().union(*fields.values()) & _fields(qp)), "a part shadows the QP"


def test_the_wqe_table() -> None:
    finished = {WqeState.CANCELLED, WqeState.DONE, WqeState.FAILED}
    assert {s for s, moves in WQE_MOVES.items() if not moves} == finished
    reach, todo = {WqeState.QUEUED}, [WqeState.QUEUED]
    while todo:
        for nxt in WQE_MOVES[todo.pop()] - reach:
            reach.add(nxt)
            todo.append(nxt)
    assert reach == set(WqeState)
    wqe = SendWQE(1, 0, True, [], 0)
    _move(wqe, WqeState.ACTIVE)
    _move(wqe, WqeState.DONE)
    try:
        _move(wqe, WqeState.FAILED)
    except AssertionError as exc:
        assert "DONE -> FAILED" in str(exc)
    else:
        raise AssertionError("a finished WQE moved on")
