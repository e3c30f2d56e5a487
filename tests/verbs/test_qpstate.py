"""The QP state table (SEMANTICS.md section 3), checked exhaustively.

Three layers:

1. ``EXPECTED`` below is written by hand from the markdown table in
   SEMANTICS.md section 3 (RC, UC and UD columns).  The XRC columns follow the
   rules stated under that table (XRC send: UC's INIT->RTR and RC's RTR->RTS
   rows; XRC receive: RC's INIT->RTR row, SQ_PSN and TIMEOUT required at
   RTR->RTS); the rows SEMANTICS does not spell out for XRC follow Linux
   ``ib_modify_qp_is_ok`` (XRC_INI / XRC_TGT).  It is deliberately not derived
   from :data:`softverbs.engine.qpstate.TRANSITIONS`, so a typo there fails here.
2. :func:`softverbs.engine.qpstate.check` is driven over every QP type x
   current state x next state with the exact required mask, with each required
   bit removed and with each foreign bit added, and with random masks.
3. ``QP.modify`` on real QPs: every (current, next) pair, CUR_STATE, modify
   without IBV_QP_STATE, and the attribute range checks.
"""

from __future__ import annotations

import errno
import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softverbs import (
    CQ,
    PD,
    QP,
    AHAttr,
    Context,
    GlobalRoute,
    PyverbsRDMAError,
    QPAttr,
    QPCap,
    QPInitAttr,
    QPInitAttrEx,
)
from softverbs import enums as e
from softverbs.engine import qpstate

# --- the expected table, by hand -----------------------------------------------------------------

RC, UC, UD = e.IBV_QPT_RC, e.IBV_QPT_UC, e.IBV_QPT_UD
XS, XR = e.IBV_QPT_XRC_SEND, e.IBV_QPT_XRC_RECV
QP_TYPES = (RC, UC, UD, XS, XR)
TYPE_NAMES: dict[int, str] = {RC: "RC", UC: "UC", UD: "UD", XS: "XRC_SEND", XR: "XRC_RECV"}

RESET, INIT, RTR, RTS = e.IBV_QPS_RESET, e.IBV_QPS_INIT, e.IBV_QPS_RTR, e.IBV_QPS_RTS
SQD, SQE, ERR = e.IBV_QPS_SQD, e.IBV_QPS_SQE, e.IBV_QPS_ERR
STATES = (RESET, INIT, RTR, RTS, SQD, SQE, ERR)
STATE_NAMES: dict[int, str] = {s: e.ibv_qp_state(s).name[len("IBV_QPS_") :] for s in STATES}


def m(names: str) -> int:
    """'PKEY_INDEX PORT' -> IBV_QP_PKEY_INDEX | IBV_QP_PORT."""
    mask = 0
    for name in names.split():
        mask |= int(getattr(e, "IBV_QP_" + name))
    return mask


def row(required: str, optional: str = "") -> tuple[int, int]:
    return m(required), m(optional)


# The SEMANTICS.md cells, verbatim ("required (optional)").
RC_INIT_RTR = row("AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER",
                  "ALT_PATH ACCESS_FLAGS PKEY_INDEX")  # fmt: skip
UC_INIT_RTR = row("AV PATH_MTU DEST_QPN RQ_PSN", "ALT_PATH ACCESS_FLAGS PKEY_INDEX")
RC_RTR_RTS = row("SQ_PSN TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC",
                 "CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE")  # fmt: skip
RC_RTS_RTS = row("", "CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER")
UC_RTS_RTS = row("", "CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE")
RC_SQD_RTS = row("", "CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE")
UC_SQD_RTS = row("", "CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE")
RC_SQD_SQD = row("", "PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC MAX_DEST_RD_ATOMIC "
                     "ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE")  # fmt: skip
NOTHING = row("")

EXPECTED: dict[tuple[int, int], dict[int, tuple[int, int]]] = {
    (RESET, INIT): {
        RC: row("PKEY_INDEX PORT ACCESS_FLAGS"),
        UC: row("PKEY_INDEX PORT ACCESS_FLAGS"),
        UD: row("PKEY_INDEX PORT QKEY"),
        XS: row("PKEY_INDEX PORT ACCESS_FLAGS"),
        XR: row("PKEY_INDEX PORT ACCESS_FLAGS"),
    },
    (INIT, INIT): {
        RC: row("", "PKEY_INDEX PORT ACCESS_FLAGS"),
        UC: row("", "PKEY_INDEX PORT ACCESS_FLAGS"),
        UD: row("", "PKEY_INDEX PORT QKEY"),
        XS: row("", "PKEY_INDEX PORT ACCESS_FLAGS"),
        XR: row("", "PKEY_INDEX PORT ACCESS_FLAGS"),
    },
    (INIT, RTR): {
        RC: RC_INIT_RTR,
        UC: UC_INIT_RTR,
        UD: row("", "PKEY_INDEX QKEY"),
        XS: UC_INIT_RTR,  # "XRC send QPs follow UC's INIT->RTR row"
        XR: RC_INIT_RTR,  # "XRC receive QPs follow RC's INIT->RTR row"
    },
    (RTR, RTS): {
        RC: RC_RTR_RTS,
        UC: row("SQ_PSN", "CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE"),
        UD: row("SQ_PSN", "CUR_STATE QKEY"),
        # "... and RC's RTR->RTS row" for the required attributes; optional ones as
        # Linux's XRC_INI: with no responder, MIN_RNR_TIMER has no meaning.
        XS: row(
            "SQ_PSN TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC",
            "CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE",
        ),
        XR: row("SQ_PSN TIMEOUT", "CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE"),
    },
    (RTS, RTS): {
        RC: RC_RTS_RTS,
        UC: UC_RTS_RTS,
        UD: row("", "CUR_STATE QKEY"),
        XS: UC_RTS_RTS,  # XRC_INI has no responder: no MIN_RNR_TIMER (Linux)
        XR: RC_RTS_RTS,
    },
    (RTS, SQD): {t: row("", "EN_SQD_ASYNC_NOTIFY") for t in QP_TYPES},
    (SQD, RTS): {
        RC: RC_SQD_RTS,
        UC: UC_SQD_RTS,
        UD: row("", "CUR_STATE QKEY"),
        XS: UC_SQD_RTS,
        XR: RC_SQD_RTS,
    },
    (SQD, SQD): {
        RC: RC_SQD_SQD,
        UC: row("", "AV ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE"),
        UD: row("", "PKEY_INDEX QKEY"),
        XS: row(
            "",
            "PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC ALT_PATH ACCESS_FLAGS "
            "PKEY_INDEX PATH_MIG_STATE",
        ),
        XR: row(
            "",
            "PORT AV TIMEOUT MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX "
            "MIN_RNR_TIMER PATH_MIG_STATE",
        ),
    },
    (SQE, RTS): {
        UC: row("", "CUR_STATE ACCESS_FLAGS"),
        UD: row("", "CUR_STATE QKEY"),
    },
}
for _s in STATES:  # any -> RESET, any -> ERR: nothing required, nothing optional
    EXPECTED[(_s, RESET)] = {t: NOTHING for t in QP_TYPES}
    EXPECTED[(_s, ERR)] = {t: NOTHING for t in QP_TYPES}

#: Attribute bits a modify may name (every ibv_qp_attr_mask member).
ATTR_BITS = tuple(int(f) for f in e.ibv_qp_attr_mask)
#: Accepted on every legal transition (the state itself, and the rate limit).
ALWAYS = int(e.IBV_QP_STATE | e.IBV_QP_RATE_LIMIT)
#: Bits that the table judges (not STATE / RATE_LIMIT).
JUDGED_BITS = tuple(b for b in ATTR_BITS if not b & ALWAYS)


def bit_name(bit: int) -> str:
    return e.ibv_qp_attr_mask(bit).name or hex(bit)


def expected_rule(t: int, cur: int, new: int) -> tuple[int, int] | None:
    return EXPECTED.get((cur, new), {}).get(t)


def judge(t: int, cur: int, new: int, mask: int) -> int:
    """qpstate.check for a modify that names ``new`` (mask gets IBV_QP_STATE)."""
    return qpstate.check(t, cur, mask | e.IBV_QP_STATE, new, cur)


def einval_message(fn: Any, *args: Any) -> str:
    with pytest.raises(PyverbsRDMAError) as info:
        fn(*args)
    assert info.value.error_code == errno.EINVAL, info.value
    return str(info.value)


def case_id(t: int, cur: int, new: int) -> str:
    return f"{TYPE_NAMES[t]}-{STATE_NAMES[cur]}-{STATE_NAMES[new]}"


ALL_CASES = list(itertools.product(QP_TYPES, STATES, STATES))
LEGAL_CASES = [c for c in ALL_CASES if expected_rule(*c) is not None]


# --- 1. the table's content -------------------------------------------------------------------


def test_table_has_exactly_the_expected_transitions() -> None:
    got = {(t, a, b) for (a, b), types in qpstate.TRANSITIONS.items() for t in types}
    want = {(t, a, b) for (a, b), types in EXPECTED.items() for t in types}
    extra = sorted(case_id(*c) for c in got - want)
    missing = sorted(case_id(*c) for c in want - got)
    assert not extra and not missing, f"illegal but in the table: {extra}; missing: {missing}"


@pytest.mark.parametrize("case", LEGAL_CASES, ids=[case_id(*c) for c in LEGAL_CASES])
def test_table_row_matches_semantics(case: tuple[int, int, int]) -> None:
    t, cur, new = case
    want_req, want_opt = expected_rule(t, cur, new) or (0, 0)
    got = qpstate.rule(t, cur, new)
    assert got is not None
    got_req, got_opt = got
    assert qpstate.mask_names(got_req) == qpstate.mask_names(want_req), "required"
    assert qpstate.mask_names(got_opt) == qpstate.mask_names(want_opt), "optional"


def test_expected_table_matches_the_semantics_markdown_states() -> None:
    """The legal-transition sentence of SEMANTICS section 3, checked against EXPECTED."""
    sentence = [(RESET, INIT), (INIT, INIT), (INIT, RTR), (RTR, RTS), (RTS, RTS), (RTS, SQD),
                (SQD, SQD), (SQD, RTS), (SQE, RTS)]  # fmt: skip
    sentence += [(s, RESET) for s in STATES] + [(s, ERR) for s in STATES]
    assert set(EXPECTED) == set(sentence)
    assert set(EXPECTED[(SQE, RTS)]) == {UC, UD}  # "SQE->RTS (UC/UD)"


def test_markdown_generated_from_the_table_lists_every_row() -> None:
    md = qpstate.transition_table_markdown()
    for a, b in EXPECTED:
        if b in (RESET, ERR):
            continue  # summarised by the "any→RESET, any→ERR" row
        assert f"| {STATE_NAMES[a]}→{STATE_NAMES[b]} |" in md
    assert "| any→RESET, any→ERR |" in md


# --- 2. check(), exhaustively --------------------------------------------------------------------


@pytest.mark.parametrize("case", ALL_CASES, ids=[case_id(*c) for c in ALL_CASES])
def test_check_every_type_state_pair(case: tuple[int, int, int]) -> None:
    t, cur, new = case
    rule = expected_rule(t, cur, new)
    if rule is None:
        # (a) illegal: refused whatever the mask, and the message says so
        for mask in (0, *JUDGED_BITS):
            msg = einval_message(judge, t, cur, new, mask)
            assert "not a legal transition" in msg, msg
        return
    required, optional = rule
    # (a) exactly the required mask is accepted, with or without RATE_LIMIT
    assert judge(t, cur, new, required) == new
    assert judge(t, cur, new, required | e.IBV_QP_RATE_LIMIT) == new
    assert judge(t, cur, new, required | optional) == new
    # (b) each required attribute left out -> EINVAL naming it
    for bit in JUDGED_BITS:
        if bit & required:
            msg = einval_message(judge, t, cur, new, required & ~bit)
            assert f"requires {bit_name(bit)};" in msg, msg
    # (c) each attribute that is neither required nor optional -> EINVAL naming it
    for bit in JUDGED_BITS:
        if not bit & (required | optional):
            msg = einval_message(judge, t, cur, new, required | bit)
            assert re.search(rf"does not accept {bit_name(bit)}(;|$)", msg), msg
    # each optional attribute alone is fine
    for bit in JUDGED_BITS:
        if bit & optional:
            assert judge(t, cur, new, required | bit) == new


@pytest.mark.parametrize("t", QP_TYPES, ids=[TYPE_NAMES[t] for t in QP_TYPES])
@pytest.mark.parametrize("cur", STATES, ids=[STATE_NAMES[s] for s in STATES])
def test_check_without_state_bit_is_the_same_state_transition(t: int, cur: int) -> None:
    rule = expected_rule(t, cur, cur)
    if rule is None:
        msg = einval_message(qpstate.check, t, cur, 0, None, None)
        assert "not a legal transition" in msg
    else:
        assert qpstate.check(t, cur, rule[0] | rule[1], None, None) == cur


def test_cur_state_must_match_where_it_is_allowed() -> None:
    mask = e.IBV_QP_STATE | e.IBV_QP_CUR_STATE
    assert qpstate.check(RC, RTS, mask, RTS, RTS) == RTS
    msg = einval_message(qpstate.check, RC, RTS, mask, RTS, RTR)
    assert "cur_qp_state" in msg and "IBV_QPS_RTR" in msg and "IBV_QPS_RTS" in msg
    # cur_qp_state is only looked at when IBV_QP_CUR_STATE is in the mask
    assert qpstate.check(RC, RTS, e.IBV_QP_STATE, RTS, RTR) == RTS


def test_reserved_mask_bits_are_refused_and_named() -> None:
    for bit in range(21, 25):
        msg = einval_message(judge, RC, RTS, RTS, 1 << bit)
        assert hex(1 << bit) in msg, msg


@st.composite
def modify_cases(draw: st.DrawFn) -> tuple[int, int, int, int]:
    t, cur, new = draw(st.sampled_from(ALL_CASES))
    rule = expected_rule(t, cur, new)
    bits = draw(st.sets(st.sampled_from((*JUDGED_BITS, int(e.IBV_QP_RATE_LIMIT)))))
    mask = 0
    for b in bits:
        mask |= b
    if rule is not None and draw(st.booleans()):
        mask |= rule[0]  # often include the required set, so acceptance is explored too
    return t, cur, new, mask


@settings(max_examples=2000, deadline=None)
@given(modify_cases())
def test_random_masks(case: tuple[int, int, int, int]) -> None:
    t, cur, new, mask = case
    rule = expected_rule(t, cur, new)
    ok = rule is not None and (
        mask & rule[0] == rule[0] and mask & ~(rule[0] | rule[1] | ALWAYS) == 0
    )
    if ok:
        assert judge(t, cur, new, mask) == new
    else:
        einval_message(judge, t, cur, new, mask)


# --- 3. through QP.modify on real QPs ----------------------------------------------------------


@pytest.fixture(scope="module")
def ctx() -> Iterator[Context]:
    with Context(name="sv0") as c:
        yield c


@pytest.fixture(scope="module")
def pd(ctx: Context) -> PD:
    return PD(ctx)


@pytest.fixture(scope="module")
def cq(ctx: Context) -> CQ:
    return CQ(ctx, 1000)


def _xrcd_or_skip(ctx: Context) -> Any:
    import softverbs

    cls = getattr(softverbs, "XRCD", None)
    init = getattr(softverbs, "XRCDInitAttr", None)
    if cls is None or init is None:
        reason = ("softverbs cannot create XRC receive QPs yet: there is no XRC domain "
                  "(softverbs.XRCD / softverbs.XRCDInitAttr are missing)")  # fmt: skip
        print(reason)
        pytest.skip(reason)
    import os

    return cls(ctx, init(e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS,
                         os.O_CREAT, -1))  # fmt: skip


def make_qp(ctx: Context, pd: PD, cq: CQ, t: int) -> QP:
    cap = QPCap(max_send_wr=4, max_recv_wr=4)
    if t == XS:
        return QP(ctx, QPInitAttrEx(qp_type=t, pd=pd, scq=cq, cap=cap,
                                    comp_mask=e.IBV_QP_INIT_ATTR_PD))  # fmt: skip
    if t == XR:
        xrcd = _xrcd_or_skip(ctx)
        return QP(ctx, QPInitAttrEx(qp_type=t, xrcd=xrcd, cap=QPCap(0, 0, 0, 0, 0),
                                    comp_mask=e.IBV_QP_INIT_ATTR_XRCD))  # fmt: skip
    return QP(pd, QPInitAttr(qp_type=t, scq=cq, rcq=cq, cap=cap))


def route(ctx: Context, sgid_index: int = 1) -> AHAttr:
    gid = ctx.query_gid(1, 1)
    return AHAttr(is_global=1, port_num=1, gr=GlobalRoute(dgid=gid, sgid_index=sgid_index))


def full_attr(ctx: Context, qp: QP, new: int) -> QPAttr:
    """Valid values for every attribute, so the mask alone decides."""
    a = QPAttr(qp_state=new, cur_qp_state=qp.qp_state, port_num=1, path_mtu=e.IBV_MTU_1024)
    a.pkey_index = 0
    a.qkey = 0x11111111
    a.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    a.ah_attr = route(ctx)
    a.alt_ah_attr = route(ctx)
    a.dest_qp_num = qp.qp_num
    a.rq_psn = 0x100
    a.sq_psn = 0x200
    a.max_dest_rd_atomic = 4
    a.min_rnr_timer = 12
    a.timeout = 14
    a.retry_cnt = 7
    a.rnr_retry = 7
    a.max_rd_atomic = 4
    a.path_mig_state = 0
    a.en_sqd_async_notify = 0
    return a


def step(ctx: Context, qp: QP, new: int) -> None:
    rule = expected_rule(qp.qp_type, qp.qp_state, new)
    assert rule is not None
    qp.modify(full_attr(ctx, qp, new), rule[0] | e.IBV_QP_STATE)
    assert qp.qp_state == new


PATHS: dict[int, tuple[int, ...]] = {
    RESET: (),
    INIT: (INIT,),
    RTR: (INIT, RTR),
    RTS: (INIT, RTR, RTS),
    SQD: (INIT, RTR, RTS, SQD),
    SQE: (INIT, RTR, RTS),  # then the device moves it (UC/UD only)
    ERR: (ERR,),
}


def drive(ctx: Context, qp: QP, target: int) -> None:
    for s in PATHS[target]:
        step(ctx, qp, s)
    if target == SQE:
        qp.engine.set_state(SQE, 0.0)  # an SQ error, as the engine would do
    assert qp.qp_state == target


API_TYPES = (RC, UC, UD, XS, XR)
API_CASES = [(t, cur, new) for t, cur, new in ALL_CASES
             if t in API_TYPES and not (cur == SQE and t not in (UC, UD))]  # fmt: skip


@pytest.mark.parametrize("case", API_CASES, ids=[case_id(*c) for c in API_CASES])
def test_modify_every_pair_on_a_real_qp(
    ctx: Context, pd: PD, cq: CQ, case: tuple[int, int, int]
) -> None:
    t, cur, new = case
    with make_qp(ctx, pd, cq, t) as qp:
        drive(ctx, qp, cur)
        rule = expected_rule(t, cur, new)
        attr = full_attr(ctx, qp, new)
        if rule is None:
            with pytest.raises(PyverbsRDMAError) as info:
                qp.modify(attr, e.IBV_QP_STATE)
            assert info.value.error_code == errno.EINVAL
            assert "not a legal transition" in str(info.value)
            assert qp.qp_state == cur, "an illegal modify must leave the state alone"
            return
        required, optional = rule
        for bit in JUDGED_BITS:
            if bit & required:
                with pytest.raises(PyverbsRDMAError) as info:
                    qp.modify(attr, (required & ~bit) | e.IBV_QP_STATE)
                assert info.value.error_code == errno.EINVAL
                assert bit_name(bit) in str(info.value)
                assert qp.qp_state == cur
        foreign = next((b for b in JUDGED_BITS if not b & (required | optional)), None)
        if foreign is not None:
            with pytest.raises(PyverbsRDMAError) as info:
                qp.modify(attr, required | foreign | e.IBV_QP_STATE)
            assert bit_name(foreign) in str(info.value)
            assert qp.qp_state == cur
        qp.modify(attr, required | e.IBV_QP_STATE)
        assert qp.qp_state == new


def test_modify_without_state_bit_stays(ctx: Context, pd: PD, cq: CQ) -> None:
    with make_qp(ctx, pd, cq, RC) as qp:
        qp.modify(full_attr(ctx, qp, RESET), 0)  # RESET -> RESET
        assert qp.qp_state == RESET
        drive(ctx, qp, INIT)
        a = full_attr(ctx, qp, RTS)  # qp_state is ignored without IBV_QP_STATE
        a.qp_access_flags = e.IBV_ACCESS_REMOTE_READ
        qp.modify(a, e.IBV_QP_ACCESS_FLAGS)
        assert qp.qp_state == INIT
        assert qp.query()[0].qp_access_flags == e.IBV_ACCESS_REMOTE_READ
        assert qp.engine.access == e.IBV_ACCESS_REMOTE_READ
        step(ctx, qp, RTR)
        with pytest.raises(PyverbsRDMAError) as info:  # RTR -> RTR is not legal
            qp.modify(full_attr(ctx, qp, RTS), e.IBV_QP_MIN_RNR_TIMER)
        assert info.value.error_code == errno.EINVAL
        assert qp.qp_state == RTR
        step(ctx, qp, RTS)
        a = full_attr(ctx, qp, RTS)
        a.min_rnr_timer = 3
        qp.modify(a, e.IBV_QP_MIN_RNR_TIMER)
        assert qp.qp_state == RTS and qp.engine.min_rnr_timer == 3


def test_modify_cur_state_mismatch(ctx: Context, pd: PD, cq: CQ) -> None:
    with make_qp(ctx, pd, cq, RC) as qp:
        drive(ctx, qp, RTS)
        a = full_attr(ctx, qp, RTS)
        a.cur_qp_state = RTR
        with pytest.raises(PyverbsRDMAError) as info:
            qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_CUR_STATE)
        assert info.value.error_code == errno.EINVAL
        assert "cur_qp_state" in str(info.value)
        assert qp.qp_state == RTS
        a.cur_qp_state = RTS
        a.qp_state = SQD
        with pytest.raises(PyverbsRDMAError):  # RTS -> SQD does not take CUR_STATE
            qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_CUR_STATE)
        a.qp_state = RTS
        qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_CUR_STATE)
        assert qp.qp_state == RTS


def test_modify_bad_qp_state_value(ctx: Context, pd: PD, cq: CQ) -> None:
    with make_qp(ctx, pd, cq, RC) as qp:
        a = full_attr(ctx, qp, 42)
        msg = einval_message(qp.modify, a, e.IBV_QP_STATE)
        assert "42" in msg
        assert qp.qp_state == RESET


# --- attribute range checks -------------------------------------------------------------------


def _set(attr: QPAttr, name: str, value: Any) -> None:
    if name == "sgid_index":
        attr.ah_attr = route_with(attr.ah_attr, sgid_index=value)
    elif name == "is_global":
        attr.ah_attr = AHAttr(is_global=0, port_num=1)
    else:
        setattr(attr, name, value)


def route_with(ah: AHAttr, sgid_index: int) -> AHAttr:
    return AHAttr(is_global=1, port_num=1, gr=GlobalRoute(dgid=ah.gr.dgid, sgid_index=sgid_index))


BAD_VALUES = [
    # (transition target, field, bad value, words the message must contain)
    (RTS, "timeout", 32, ("timeout", "32", "0..31")),
    (RTS, "retry_cnt", 8, ("retry_cnt", "8", "0..7")),
    (RTS, "rnr_retry", 8, ("rnr_retry", "8", "0..7")),
    (RTR, "path_mtu", 6, ("path_mtu", "6")),
    (RTR, "path_mtu", 0, ("path_mtu", "0")),
    (RTR, "min_rnr_timer", 32, ("min_rnr_timer", "32")),
    (INIT, "port_num", 2, ("port", "2")),
    (INIT, "port_num", 0, ("port", "0")),
    (INIT, "pkey_index", 1, ("pkey_index", "1")),
    (RTR, "sgid_index", 16, ("sgid_index", "16")),
    (RTR, "sgid_index", 2, ("sgid_index", "2")),
    (RTR, "is_global", 0, ("global",)),
    (RTR, "dest_qp_num", 1 << 24, ("dest_qp_num",)),
]


@pytest.mark.parametrize(
    "target,field,value,words", BAD_VALUES, ids=[f"{b[1]}={b[2]}" for b in BAD_VALUES]
)
def test_attribute_range_checks(
    ctx: Context, pd: PD, cq: CQ, target: int, field: str, value: int, words: tuple[str, ...]
) -> None:
    with make_qp(ctx, pd, cq, RC) as qp:
        before = {int(INIT): RESET, int(RTR): INIT, int(RTS): RTR}[target]
        drive(ctx, qp, before)
        saved = qp.query()[0]
        rule = expected_rule(RC, before, target)
        assert rule is not None
        a = full_attr(ctx, qp, target)
        _set(a, field, value)
        msg = einval_message(qp.modify, a, rule[0] | e.IBV_QP_STATE)
        for w in words:
            assert w in msg, f"{w!r} not in {msg!r}"
        assert qp.qp_state == before, "a refused modify must not change the state"
        after = qp.query()[0]
        for name in ("timeout", "retry_cnt", "rnr_retry", "path_mtu", "min_rnr_timer",
                     "pkey_index", "dest_qp_num", "sq_psn", "rq_psn"):  # fmt: skip
            assert getattr(after, name) == getattr(saved, name), name
        # the same modify with a good value goes through
        qp.modify(full_attr(ctx, qp, target), rule[0] | e.IBV_QP_STATE)
        assert qp.qp_state == target


def test_range_check_on_an_optional_attribute(ctx: Context, pd: PD, cq: CQ) -> None:
    with make_qp(ctx, pd, cq, RC) as qp:
        drive(ctx, qp, RTS)
        a = full_attr(ctx, qp, RTS)
        a.min_rnr_timer = 32
        msg = einval_message(qp.modify, a, e.IBV_QP_STATE | e.IBV_QP_MIN_RNR_TIMER)
        assert "min_rnr_timer" in msg
        assert qp.engine.min_rnr_timer == 12


def test_query_reports_what_each_modify_set(ctx: Context, pd: PD, cq: CQ) -> None:
    """QUERY_QP answers every attribute a modify's mask named (device/qp.py
    ``_REMEMBERED``, built from ``enums.QP_ATTR_MASK``), the alternate-path group
    included, and keeps the ones the mask did not name."""
    import dataclasses

    from softverbs.device import records
    from softverbs.device.qp import _REMEMBERED

    remembered = [n for _, names in _REMEMBERED for n in names]
    fields = {f.name for f in dataclasses.fields(records.QPAttrs)}
    assert len(remembered) == len(set(remembered)) and set(remembered) <= fields
    assert fields - set(remembered) == {"qp_state", "cur_qp_state", "sq_draining", "reserved"}
    with make_qp(ctx, pd, cq, RC) as qp:
        drive(ctx, qp, RTS)
        a = full_attr(ctx, qp, RTS)
        a.timeout, a.retry_cnt = 9, 3  # not in this modify's mask: must stay 14, 7
        a.alt_pkey_index, a.alt_port_num, a.alt_timeout = 0, 1, 17
        a.alt_ah_attr = route(ctx)
        a.alt_ah_attr.sl = 5
        a.min_rnr_timer = 20
        qp.modify(a, e.IBV_QP_ALT_PATH | e.IBV_QP_MIN_RNR_TIMER)
        got = qp.query()[0]
        assert (got.alt_port_num, got.alt_timeout, got.alt_ah_attr.sl) == (1, 17, 5)
        assert got.min_rnr_timer == 20
        assert (got.timeout, got.retry_cnt, got.sq_psn, got.rq_psn) == (14, 7, 0x200, 0x100)
        assert got.ah_attr.sgid_index == 1 and got.dest_qp_num == qp.qp_num
