"""The ops table covers every operation: each has a handler (or is the
service's own), a descriptor rule, a doc row and a C header entry, and all of
them come from its one declaration in softverbs/device/ops.py."""

from __future__ import annotations

import inspect
import re

import pytest

from softverbs.device import core, ops, protocol, records
from softverbs.device.records import KIND_NAMES, Op
from softverbs.layout import c_name
from softverbs.service import server

OP_IDS = [op.name for op in ops.OPS]


def test_every_operation_is_in_the_table_once() -> None:
    declared = {name for name, v in vars(ops).items() if isinstance(v, Op)}
    assert declared == {op.name for op in ops.OPS}
    assert len({op.code for op in ops.OPS}) == len(ops.OPS)
    assert [op.code for op in ops.OPS] == sorted(op.code for op in ops.OPS)
    assert {op.code: op for op in ops.OPS} == ops.BY_CODE
    assert {op.name: op for op in ops.OPS} == ops.BY_NAME
    for name, op in ops.BY_NAME.items():
        assert getattr(ops, name) is op  # the constant's name is the operation's


@pytest.mark.parametrize("name", OP_IDS)
def test_each_operation_has_a_handler(name: str) -> None:
    """A device operation's handler is a function of its kind's module taking
    (host, owner, request, resources); the others are the service's own (its
    CM agent answers the CM_* commands)."""
    op = ops.BY_NAME[name]
    local = server._LOCAL.get(op.code)
    if op.handler is None:
        assert local is not None or op.code in server._CM_COMMANDS, (
            f"{name}: no handler, and the service does not answer it")
        return
    params = list(inspect.signature(op.handler).parameters)
    assert len(params) == 4, f"{name}: handler {op.handler.__qualname__}{params}"
    module = op.handler.__module__
    assert module.startswith("softverbs.device."), module


@pytest.mark.parametrize("name", OP_IDS)
def test_each_operation_has_its_descriptor_rule(name: str) -> None:
    op = ops.BY_NAME[name]
    if op.code in server._LOCAL:
        return  # the service's own operations take their descriptors themselves
    assert op.takes in server.TAKES, f"{name} takes {op.takes.name}: the service has no rule"


def test_every_descriptor_rule_is_used_and_documented() -> None:
    used = {op.takes for op in ops.OPS if op.code not in server._LOCAL}
    assert set(server.TAKES) == used
    for takes in used:
        # what passes a descriptor says so in the protocol document's table
        passes = takes not in (records.NOTHING, records.RULES_TEXT)
        assert bool(takes.doc) == passes, takes


@pytest.mark.parametrize("name", OP_IDS)
def test_each_operation_has_a_doc_row(name: str) -> None:
    op = ops.BY_NAME[name]
    rows = [line for line in protocol.markdown().splitlines()
            if line.startswith(f"| {op.code} | `{op.name}` |")]  # fmt: skip
    assert len(rows) == 1
    row = rows[0]
    assert op.request.__name__ in row and op.doc in row
    assert (op.takes.doc or "—") in row
    if op.creates:
        assert f"creates {KIND_NAMES[op.creates]}" in row


@pytest.mark.parametrize("name", OP_IDS)
def test_each_operation_has_a_c_header_entry(name: str) -> None:
    op = ops.BY_NAME[name]
    header = protocol.c_header()
    assert re.search(rf"^#define SV_OP_{op.name} {op.code}$", header, re.M)
    for rec in (op.request, op.reply):
        if rec is not None and rec.size():
            assert f"struct {c_name(rec)} {{" in header, rec.__name__


def test_every_kind_is_created_by_an_operation_and_has_its_record() -> None:
    """Each object kind DESTROY names is made by some operation, and its
    record class (core.KINDS) is the one its handlers build."""
    created = {op.creates for op in ops.OPS if op.creates}
    assert created == set(KIND_NAMES)
    assert set(core.KINDS) == set(KIND_NAMES)
    for kind, cls in core.KINDS.items():
        assert kind == cls.KIND


def test_uses_name_kinds() -> None:
    for op in ops.OPS:
        assert set(op.uses) <= set(KIND_NAMES), op.name
