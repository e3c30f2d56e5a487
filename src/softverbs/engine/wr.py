"""What the requester and the completer both know about send work requests.

The requester starts a send WQE and the completer finishes it; both need the
same static facts about its ``ibv_wr_opcode`` (:data:`WR_INFO`: how it
executes, which WC opcode reports it) and the same rule for moving a WQE
along :data:`~.rings.WQE_MOVES`.  They live here, below both, so that neither
part imports the other's module for them.
"""

from __future__ import annotations

from enum import IntEnum

from softverbs.engine.rings import WQE_MOVES, WR_DRIVER1, SendWQE, WqeState
from softverbs.enums import (
    IBV_WC_BIND_MW,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_LOCAL_INV,
    IBV_WC_RDMA_READ,
    IBV_WC_RDMA_WRITE,
    IBV_WC_SEND,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM,
    IBV_WR_SEND_WITH_INV,
)
from softverbs.wire.opcodes import Op, Transport


class WrClass(IntEnum):
    """How the requester executes a WR opcode."""

    SEND = 0
    WRITE = 1
    READ = 2
    ATOMIC = 3
    LOCAL = 4  #: executed inside the device: LOCAL_INV, BIND_MW


# (class, imm, inv) -> operations for (FIRST, MIDDLE, LAST, ONLY)
_MSG_OPS: dict[tuple[WrClass, bool, bool], tuple[Op, Op, Op, Op]] = {
    (WrClass.SEND, False, False): (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_ONLY),
    (WrClass.SEND, True, False): (
        Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST_WITH_IMMEDIATE, Op.SEND_ONLY_WITH_IMMEDIATE,
    ),
    (WrClass.SEND, False, True): (
        Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST_WITH_INVALIDATE, Op.SEND_ONLY_WITH_INVALIDATE,
    ),
    (WrClass.WRITE, False, False): (
        Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST, Op.RDMA_WRITE_ONLY,
    ),
    (WrClass.WRITE, True, False): (
        Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    ),
}  # fmt: skip


class WrInfo:
    """Static facts about one ``ibv_wr_opcode``."""

    __slots__ = ("imm", "inv", "klass", "ops", "rd", "wc_opcode")

    def __init__(self, klass: WrClass, wc_opcode: int, imm: bool = False, inv: bool = False):
        self.klass = klass
        self.wc_opcode = wc_opcode
        self.imm = imm
        self.inv = inv
        #: a READ or an atomic: answered by responses, limited by max_rd_atomic
        self.rd = klass in (WrClass.READ, WrClass.ATOMIC)
        #: SEND, WRITE: BTH transport -> the message's (FIRST, MIDDLE, LAST, ONLY) opcodes
        #: (keyed by the Transport members: a QP's transport, one of them, is found by
        #: identity; a plain int of the same value finds the same entry)
        self.ops: dict[int, tuple[int, int, int, int]] = {}
        base = _MSG_OPS.get((klass, imm, inv))
        if base is not None:
            self.ops = {t: (t | base[0], t | base[1], t | base[2], t | base[3])
                        for t in Transport}  # fmt: skip


#: verbs.h IBV_WC_DRIVER1: the completion of a provider's own local WQE
#: (IBV_WR_DRIVER1, executed through ``SendWQE.local_op``).  pyverbs exposes neither.
WC_DRIVER1 = 135

#: ibv_wr_opcode -> how to execute it and which WC opcode reports it.
WR_INFO: dict[int, WrInfo] = {
    IBV_WR_SEND: WrInfo(WrClass.SEND, IBV_WC_SEND),
    IBV_WR_SEND_WITH_IMM: WrInfo(WrClass.SEND, IBV_WC_SEND, imm=True),
    IBV_WR_SEND_WITH_INV: WrInfo(WrClass.SEND, IBV_WC_SEND, inv=True),
    IBV_WR_RDMA_WRITE: WrInfo(WrClass.WRITE, IBV_WC_RDMA_WRITE),
    IBV_WR_RDMA_WRITE_WITH_IMM: WrInfo(WrClass.WRITE, IBV_WC_RDMA_WRITE, imm=True),
    IBV_WR_RDMA_READ: WrInfo(WrClass.READ, IBV_WC_RDMA_READ),
    IBV_WR_ATOMIC_CMP_AND_SWP: WrInfo(WrClass.ATOMIC, IBV_WC_COMP_SWAP),
    IBV_WR_ATOMIC_FETCH_AND_ADD: WrInfo(WrClass.ATOMIC, IBV_WC_FETCH_ADD),
    IBV_WR_LOCAL_INV: WrInfo(WrClass.LOCAL, IBV_WC_LOCAL_INV),
    IBV_WR_BIND_MW: WrInfo(WrClass.LOCAL, IBV_WC_BIND_MW),
    WR_DRIVER1: WrInfo(WrClass.LOCAL, WC_DRIVER1),
}


#: the states finished() and pending() compare with, read per message: compiled C
#: integers (wr.pxd), compared with the WQE's state read into a C integer
_I_CANCELLED = int(WqeState.CANCELLED)
_I_ACTIVE = int(WqeState.ACTIVE)


#: every ``ibv_wr_opcode`` with a :class:`WrInfo`, by number (None: none): what
#: :func:`info_of` indexes, where a dictionary lookup was a hash and a probe per call
_BY_OPCODE: tuple[WrInfo | None, ...] = tuple(
    WR_INFO.get(op) for op in range(max(WR_INFO) + 1)
)


def info_of(opcode: int) -> WrInfo:
    """The :class:`WrInfo` of ``opcode`` (KeyError if it has none, as ``WR_INFO[opcode]``)."""
    info = _BY_OPCODE[opcode] if 0 <= opcode < len(_BY_OPCODE) else None
    if info is None:
        raise KeyError(opcode)
    return info


#: :data:`~.rings.WQE_MOVES` as one integer, bit ``8 * state + new`` set for each legal
#: move: ``move`` checks a move with a shift, where a dictionary and a frozenset lookup
#: with enum keys cost about 280 instructions each compiled (two moves per WRITE)
_MOVE_BITS: int = sum(1 << (8 * old + new) for old, news in WQE_MOVES.items() for new in news)
assert max(WqeState) < 8  # the table's fields are 8 bits wide


def move(wqe: SendWQE, new: WqeState) -> None:
    """Move ``wqe`` along :data:`~.rings.WQE_MOVES` (checked in debug runs)."""
    old: int = wqe.state  # compiled, C integers: the check is a shift and a mask
    to: int = new
    assert _MOVE_BITS >> (8 * old + to) & 1, f"WQE {wqe.wr_id}: {wqe.state.name} -> {new.name}"
    wqe.state = new


def finished(wqe: SendWQE) -> bool:
    """Done, failed or cancelled: ready to complete once it reaches the head."""
    state: int = wqe.state  # compiled, a C integer: a C compare, no rich compare of enums
    return state >= _I_CANCELLED


def pending(wqe: SendWQE) -> bool:
    """Started, with packets still to send."""
    state: int = wqe.state
    return state == _I_ACTIVE and wqe.tx < wqe.npkts
