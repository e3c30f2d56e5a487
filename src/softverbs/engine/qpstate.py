"""The QP state machine as a table (IBA 10.3.1, Linux ``ib_modify_qp_is_ok``).

:data:`TRANSITIONS` maps ``(current, next)`` to, for each QP type, the
attribute mask a ``modify`` *must* carry and the mask it *may* carry.  A
transition absent from the table is illegal.  :func:`check` is the only
place that judges a modify; the docs' transition table and the unit tests
are generated from the same data.

Modify without ``IBV_QP_STATE`` means "stay in the current state", and is
judged as the transition from the current state to itself (INIT->INIT,
RTS->RTS, SQD->SQD).  ``IBV_QP_CUR_STATE`` may be given where the table
allows it, and must then match the real current state.
"""

from __future__ import annotations

from softverbs.enums import (
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_ALT_PATH,
    IBV_QP_AV,
    IBV_QP_CUR_STATE,
    IBV_QP_DEST_QPN,
    IBV_QP_EN_SQD_ASYNC_NOTIFY,
    IBV_QP_MAX_DEST_RD_ATOMIC,
    IBV_QP_MAX_QP_RD_ATOMIC,
    IBV_QP_MIN_RNR_TIMER,
    IBV_QP_PATH_MIG_STATE,
    IBV_QP_PATH_MTU,
    IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,
    IBV_QP_QKEY,
    IBV_QP_RATE_LIMIT,
    IBV_QP_RETRY_CNT,
    IBV_QP_RNR_RETRY,
    IBV_QP_RQ_PSN,
    IBV_QP_SQ_PSN,
    IBV_QP_STATE,
    IBV_QP_TIMEOUT,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    ibv_qp_attr_mask,
    ibv_qp_state,
    ibv_qp_type,
)
from softverbs.errors import einval

RC, UC, UD, XS, XR = IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV
QP_TYPES = (RC, UC, UD, XS, XR)

# Shorthands for the table.
PKEY, PORT, ACCESS, QKEY = IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_ACCESS_FLAGS, IBV_QP_QKEY
AV, MTU, DQPN, RQPSN = IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN
DEST_RD, RNR_TIMER, ALT = IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER, IBV_QP_ALT_PATH
SQPSN, TIMEOUT, RETRY, RNR_RETRY = IBV_QP_SQ_PSN, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY
RD, CUR, MIG, SQD_NOTIFY = (
    IBV_QP_MAX_QP_RD_ATOMIC,
    IBV_QP_CUR_STATE,
    IBV_QP_PATH_MIG_STATE,
    (IBV_QP_EN_SQD_ASYNC_NOTIFY),
)
RATE = IBV_QP_RATE_LIMIT

Rule = tuple[int, int]  # (required, optional)


def _rules(
    rc: Rule, uc: Rule, ud: Rule, xs: Rule | None = None, xr: Rule | None = None
) -> dict[int, Rule]:
    return {RC: rc, UC: uc, UD: ud, XS: xs or rc, XR: xr or rc}


_NONE: Rule = (0, 0)

#: (current state, next state) -> {qp type: (required mask, optional mask)}
TRANSITIONS: dict[tuple[int, int], dict[int, Rule]] = {
    (IBV_QPS_RESET, IBV_QPS_INIT): _rules(
        rc=(PKEY | PORT | ACCESS, 0),
        uc=(PKEY | PORT | ACCESS, 0),
        ud=(PKEY | PORT | QKEY, 0),
    ),
    (IBV_QPS_INIT, IBV_QPS_INIT): _rules(
        rc=(0, PKEY | PORT | ACCESS),
        uc=(0, PKEY | PORT | ACCESS),
        ud=(0, PKEY | PORT | QKEY),
    ),
    (IBV_QPS_INIT, IBV_QPS_RTR): _rules(
        rc=(AV | MTU | DQPN | RQPSN | DEST_RD | RNR_TIMER, ALT | ACCESS | PKEY),
        uc=(AV | MTU | DQPN | RQPSN, ALT | ACCESS | PKEY),
        ud=(0, PKEY | QKEY),
        xs=(AV | MTU | DQPN | RQPSN, ALT | ACCESS | PKEY),
    ),
    (IBV_QPS_RTR, IBV_QPS_RTS): _rules(
        rc=(SQPSN | TIMEOUT | RETRY | RNR_RETRY | RD, CUR | ALT | ACCESS | RNR_TIMER | MIG),
        uc=(SQPSN, CUR | ALT | ACCESS | MIG),
        ud=(SQPSN, CUR | QKEY),
        # An XRC send QP has no responder, so no MIN_RNR_TIMER (Linux XRC_INI).
        xs=(SQPSN | TIMEOUT | RETRY | RNR_RETRY | RD, CUR | ALT | ACCESS | MIG),
        xr=(SQPSN | TIMEOUT, CUR | ALT | ACCESS | RNR_TIMER | MIG),
    ),
    (IBV_QPS_RTS, IBV_QPS_RTS): _rules(
        rc=(0, CUR | ACCESS | ALT | MIG | RNR_TIMER),
        uc=(0, CUR | ACCESS | ALT | MIG),
        ud=(0, CUR | QKEY),
        xs=(0, CUR | ACCESS | ALT | MIG),
    ),
    (IBV_QPS_RTS, IBV_QPS_SQD): _rules(rc=(0, SQD_NOTIFY), uc=(0, SQD_NOTIFY), ud=(0, SQD_NOTIFY)),
    (IBV_QPS_SQD, IBV_QPS_RTS): _rules(
        rc=(0, CUR | ALT | ACCESS | RNR_TIMER | MIG),
        uc=(0, CUR | ALT | ACCESS | MIG),
        ud=(0, CUR | QKEY),
        xs=(0, CUR | ALT | ACCESS | MIG),
    ),
    (IBV_QPS_SQD, IBV_QPS_SQD): _rules(
        rc=(
            0,
            PORT
            | AV
            | TIMEOUT
            | RETRY
            | RNR_RETRY
            | RD
            | DEST_RD
            | ALT
            | ACCESS
            | PKEY
            | RNR_TIMER
            | MIG,
        ),
        uc=(0, AV | ALT | ACCESS | PKEY | MIG),
        ud=(0, PKEY | QKEY),
        xs=(0, PORT | AV | TIMEOUT | RETRY | RNR_RETRY | RD | ALT | ACCESS | PKEY | MIG),
        xr=(0, PORT | AV | TIMEOUT | DEST_RD | ALT | ACCESS | PKEY | RNR_TIMER | MIG),
    ),
    (IBV_QPS_SQE, IBV_QPS_RTS): {UC: (0, CUR | ACCESS), UD: (0, CUR | QKEY)},
}

_ALL_TYPES: dict[int, Rule] = {t: _NONE for t in QP_TYPES}
for _state in (IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD,
               IBV_QPS_SQE, IBV_QPS_ERR):  # fmt: skip
    TRANSITIONS[(_state, IBV_QPS_RESET)] = dict(_ALL_TYPES)
    TRANSITIONS[(_state, IBV_QPS_ERR)] = dict(_ALL_TYPES)

#: Attributes whose rules depend on nothing but the transition.
ALWAYS_ALLOWED = IBV_QP_STATE | RATE


def mask_names(mask: int) -> str:
    names = [f.name for f in ibv_qp_attr_mask if f.value & mask and f.name]
    known = 0
    for f in ibv_qp_attr_mask:
        known |= f.value
    if mask & ~known:  # reserved bits have no name: show them, or the message says "none"
        names.append(f"unknown bits {mask & ~known:#x}")
    return ", ".join(n for n in names if n) or "none"


def _state_name(state: int) -> str:
    try:
        return ibv_qp_state(state).name or str(state)
    except ValueError:
        return str(state)


def rule(qp_type: int, cur: int, new: int) -> Rule | None:
    """The (required, optional) masks, or None if the transition is illegal."""
    return TRANSITIONS.get((cur, new), {}).get(qp_type)


def check(qp_type: int, cur: int, mask: int, new: int | None, cur_attr: int | None) -> int:
    """Judge a modify; return the next state or raise EINVAL naming the problem."""
    if new is None:
        new = cur
    if mask & IBV_QP_CUR_STATE and cur_attr is not None and cur_attr != cur:
        raise einval(
            f"cur_qp_state says {_state_name(cur_attr)} but the QP is in {_state_name(cur)}"
        )
    r = rule(qp_type, cur, new)
    tname = ibv_qp_type(qp_type).name
    if r is None:
        legal = sorted(_state_name(b) for (a, b), types in TRANSITIONS.items()
                       if a == cur and qp_type in types)  # fmt: skip
        raise einval(
            f"{tname}: {_state_name(cur)} -> {_state_name(new)} is not a legal transition; "
            f"from {_state_name(cur)} the QP can go to {', '.join(legal)}"
        )
    required, optional = r
    missing = required & ~mask
    if missing:
        raise einval(
            f"{tname} {_state_name(cur)} -> {_state_name(new)} requires {mask_names(missing)}; "
            f"the mask lacks it"
        )
    extra = mask & ~(required | optional | ALWAYS_ALLOWED)
    if extra:
        raise einval(
            f"{tname} {_state_name(cur)} -> {_state_name(new)} does not accept "
            f"{mask_names(extra)}; allowed: {mask_names(required | optional)}"
        )
    return new


def transition_table_markdown() -> str:
    """The table of legal transitions (required, then optional in brackets), for docs/."""

    def short(name: str) -> str:
        return name.replace("IBV_QPS_", "").replace("IBV_QPT_", "").replace("IBV_QP_", "")

    head = [short(ibv_qp_type(t).name or "") for t in QP_TYPES]
    lines = ["| transition | " + " | ".join(head) + " |", "|---|" + "---|" * len(QP_TYPES)]
    for (a, b), types in TRANSITIONS.items():
        if b in (IBV_QPS_RESET, IBV_QPS_ERR):
            continue
        cells = []
        for t in QP_TYPES:
            r = types.get(t)
            if r is None:
                cells.append("illegal")
                continue
            req, opt = r
            cell = short(mask_names(req)) if req else "—"
            if opt:
                cell += f" ({short(mask_names(opt))})"
            cells.append(cell)
        name = f"{short(_state_name(a))}→{short(_state_name(b))}"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| any→RESET, any→ERR | " + " | ".join("—" for _ in QP_TYPES) + " |")
    return "\n".join(lines)
