"""Work requests: ``SGE``, ``SendWR``, ``RecvWR`` (pyverbs ``wr``).

These are the application's descriptions of work.  Posting copies them into
ring entries (the SGE list included), so a WR object may be changed or
reused as soon as ``post_send``/``post_recv`` returns, as with C verbs.
"""

from __future__ import annotations

import sys
from typing import Any

from softverbs.engine.rings import RecvWQE
from softverbs.enums import (
    IBV_SEND_FENCE,
    IBV_SEND_INLINE,
    IBV_SEND_IP_CSUM,
    IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
    IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_INV,
)
from softverbs.errors import PyverbsUserError, einval
from softverbs.verbs.addr import AH
from softverbs.verbs.base import _LIMIT, CMember, PyverbsCM, as_uint, c_member
from softverbs.verbs.mr import MW, MWBindInfo, inc_rkey
from softverbs.verbs.sge import SGE as SGE


def _sg_list(sg: Any, num_sge: Any) -> list[SGE]:
    """The first ``num_sge`` entries of ``sg`` as a new list, every one an SGE."""
    if type(sg) is list and type(num_sge) is int and num_sge == len(sg) and num_sge < _LIMIT[32]:
        # the usual call, RecvWR(wr_id, len(sges), sges): one pass, one copy
        for s in sg:
            if not isinstance(s, SGE):
                break
        else:
            return sg[:]
    num_sge = as_uint(num_sge, 32, "num_sge")
    if num_sge == 0:
        return []
    if sg is None:
        raise PyverbsUserError(f"num_sge is {num_sge} but no SGE list was given")
    if isinstance(sg, SGE):
        sg = [sg]
    if not isinstance(sg, (list, tuple)):
        raise PyverbsUserError(f"sg must be a list of SGE objects, got {type(sg).__name__}")
    sges = list(sg)
    if len(sges) < num_sge:
        raise PyverbsUserError(f"num_sge is {num_sge} but the SGE list has {len(sges)}")
    for s in sges[:num_sge]:
        if not isinstance(s, SGE):
            raise PyverbsUserError(f"SGE list entries must be SGE objects, got {type(s).__name__}")
    return sges[:num_sge]


def _only_local() -> int:
    """What ``sys.getrefcount`` says of an object that only a local variable holds,
    as this module calls it (compiled and interpreted count the argument
    differently)."""
    o = object()
    return sys.getrefcount(o)


_ONLY_LOCAL = _only_local()


class _SgeList(PyverbsCM):
    """A WR's ``sg`` and ``num_sge``, one list: ``num_sge`` is its length, and
    setting it lower drops the SGEs past it (what the C WR's count does).

    The base of ``SendWR`` and ``RecvWR``.  Their C members (``CMember``) keep
    their values in slots of their own (``_wr_id``, ...): setting one checks it as the member
    takes it (``c_member``, the rule of every C struct the verbs mirror).
    Compiled, extension types (wr.pxd): the slots are C struct fields that the
    post path reads directly, and an instance dictionary holds anything else a
    program (or a provider's QP) hangs on a WR.
    """

    sg: list[SGE]
    next_wr: Any
    _wr_id: int
    wr_id = CMember("wr_id")  #: both kinds' (reads the slot; a store is checked)

    def __dealloc__(self) -> None:
        """Compiled, the destructor of the extension type: the WRs after this one
        that nothing else holds are freed one at a time here, not each by a C call
        nested in the one before (a long ``next_wr`` list would overflow the C
        stack; CPython frees a Python class's instances that way, and interpreted
        this is never called)."""
        w = self.next_wr
        self.next_wr = None
        while isinstance(w, _SgeList) and sys.getrefcount(w) == _ONLY_LOCAL:
            nxt = w.next_wr
            w.next_wr = None
            w = nxt  # frees the one before, whose next_wr is None now
            nxt = None  # (w's only holder is w again)

    @property
    def num_sge(self) -> int:
        return len(self.sg)

    @num_sge.setter
    def num_sge(self, val: int) -> None:
        self.sg = self.sg[:val]


class RecvWR(_SgeList):
    """A receive work request: ``RecvWR(wr_id, num_sge, sg, next_wr)``."""

    _c_fields = {"wr_id": 64}
    next_wr: RecvWR | None

    def __init__(
        self, wr_id: int = 0, num_sge: int = 0, sg: Any = None, next_wr: RecvWR | None = None
    ) -> None:
        self._wr_id = c_member(self, "wr_id", wr_id)
        self.sg = _sg_list(sg, num_sge)
        self.next_wr = next_wr

    def close(self) -> None:
        pass

    def __str__(self) -> str:
        return f"{'WR ID':22}: {self._wr_id:<20}\n{'Num SGE':22}: {self.num_sge:<20}\n"


def recv_wqe(w: object, max_sge: int, n: int, verb: str) -> RecvWQE:
    """Check receive WR #``n`` of a posted list (``verb``, for the message) and
    turn it into a ring entry.  Compiled, the WR and its SGEs are read as C
    struct fields (wr.pxd)."""
    if not isinstance(w, RecvWR):
        raise einval(f"{verb}: WR #{n}: a receive WR list holds RecvWR objects, got "
                     f"{type(w).__name__}")  # fmt: skip
    r = w
    sg = r.sg
    if len(sg) > max_sge:
        raise einval(f"{verb}: WR #{n} (wr_id={r._wr_id}): {len(sg)} SGEs exceed "
                     f"max_recv_sge={max_sge}")  # fmt: skip
    sges = []
    length = 0
    for item in sg:
        s = sge_of(item, n, verb, r._wr_id)
        size = s._length
        sges.append((s._addr, size, s._lkey))
        length += size
    return RecvWQE(r._wr_id, sges, length)


def sge_of(item: object, n: int, verb: str, wr_id: object) -> SGE:
    """``item`` of WR #``n``'s SGE list, which must be an SGE (a program may have
    put anything in ``sg``): EINVAL saying so otherwise."""
    if not isinstance(item, SGE):
        raise einval(f"{verb}: WR #{n} (wr_id={wr_id}): SGE list entries must be SGE "
                     f"objects, got {type(item).__name__}")  # fmt: skip
    return item


_NO_SGE_OPCODES = (IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV)


class SendWR(_SgeList):
    """A send work request, shaped like pyverbs' ``SendWR``.

    ``send_flags`` defaults to ``IBV_SEND_SIGNALED``, as in pyverbs.
    """

    _c_fields = {
        "wr_id": 64, "opcode": 32, "imm_data": 32, "send_flags": 32, "remote_addr": 64,
        "rkey_remote": 32, "compare_add": 64, "swap": 64, "remote_qpn": 32, "remote_qkey": 32,
        "remote_srqn": 32,
    }  # fmt: skip
    _wr_id: int
    _opcode: int
    _imm_data: int
    _send_flags: int
    next_wr: SendWR | None
    # the union members of ibv_send_wr.wr (set together, zeroed, by __init__)
    _remote_addr: int
    _rkey_remote: int
    _compare_add: int
    _swap: int
    ah: AH | None
    _remote_qpn: int
    _remote_qkey: int
    _remote_srqn: int
    mw: MW | None
    bind_info: MWBindInfo | None
    bind_rkey: int
    # the C members: each reads its slot, and a store checks the value (c_member);
    # wr_id is _SgeList's
    opcode = CMember("opcode")
    imm_data = CMember("imm_data")
    send_flags = CMember("send_flags")
    remote_addr = CMember("remote_addr")
    rkey_remote = CMember("rkey_remote")
    compare_add = CMember("compare_add")
    swap = CMember("swap")
    remote_qpn = CMember("remote_qpn")
    remote_qkey = CMember("remote_qkey")
    remote_srqn = CMember("remote_srqn")

    def __init__(
        self,
        wr_id: int = 0,
        opcode: int = IBV_WR_SEND,
        num_sge: int = 0,
        imm_data: int = 0,
        sg: Any = None,
        send_flags: int = IBV_SEND_SIGNALED,
        next_wr: SendWR | None = None,
    ) -> None:
        num_sge = as_uint(num_sge, 32, "num_sge")
        if opcode not in _NO_SGE_OPCODES and (num_sge < 1 or sg is None):
            raise PyverbsUserError("A WR needs at least one SGE")
        self._wr_id = c_member(self, "wr_id", wr_id)
        self._opcode = c_member(self, "opcode", opcode)
        self.sg = _sg_list(sg, num_sge)
        self._imm_data = c_member(self, "imm_data", imm_data)
        self._send_flags = c_member(self, "send_flags", send_flags)
        self.next_wr = next_wr
        # the union members of ibv_send_wr.wr, zeroed
        self._remote_addr = 0
        self._rkey_remote = 0
        self._compare_add = 0
        self._swap = 0
        self.ah = None
        self._remote_qpn = 0
        self._remote_qkey = 0
        self._remote_srqn = 0
        self.mw = None
        self.bind_info = None
        self.bind_rkey = 0

    @classmethod
    def without_sges(cls, wr_id: int, opcode: int, send_flags: int) -> SendWR:
        """A WR whose SGEs are set later, as the ``ibv_wr_*`` builders of QPEx do."""
        wr = cls(wr_id, IBV_WR_LOCAL_INV, send_flags=send_flags)
        wr.opcode = opcode
        return wr

    @property
    def sg_list(self) -> list[SGE]:
        return self.sg

    @sg_list.setter
    def sg_list(self, val: SGE | list[SGE]) -> None:
        self.sg = [val] if isinstance(val, SGE) else list(val)

    @property
    def invalidate_rkey(self) -> int:
        """The R_Key to invalidate (shares storage with ``imm_data``, as in C)."""
        return self.imm_data

    @invalidate_rkey.setter
    def invalidate_rkey(self, val: int) -> None:
        self.imm_data = val

    @property
    def rkey(self) -> int:
        """After ``set_bind_wr``: the rkey the window will have once bound."""
        return self.bind_rkey

    def set_wr_ud(self, ah: AH, rqpn: int, rqkey: int) -> None:
        if not isinstance(ah, AH):
            raise PyverbsUserError(f"ah must be an AH, got {type(ah).__name__}")
        self.ah = ah
        self.remote_qpn = rqpn
        self.remote_qkey = rqkey

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.rkey_remote = rkey
        self.remote_addr = addr

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        self.rkey_remote = rkey
        self.remote_addr = addr
        self.compare_add = compare_add
        self.swap = swap

    def set_bind_wr(self, mw: MW, bind_info: MWBindInfo) -> None:
        self.mw = mw
        self.bind_info = bind_info
        self.bind_rkey = inc_rkey(mw.rkey)

    def set_qp_type_xrc(self, remote_srqn: int) -> None:
        self.remote_srqn = remote_srqn

    def close(self) -> None:
        pass

    def __str__(self) -> str:
        f = "{:22}: {:<20}\n"
        return (f.format("WR ID", self.wr_id) + f.format("Num SGE", self.num_sge)
                + f.format("Opcode", self.opcode)
                + f.format("Send flags", send_flags_to_str(self.send_flags))
                + f.format("Imm Data", self.imm_data))  # fmt: skip


#: the members a WR's copy (``bad_wr``) takes, besides its instance dictionary
RECV_WR_FIELDS = ("wr_id", "sg", "next_wr")
SEND_WR_FIELDS = ("wr_id", "opcode", "sg", "imm_data", "send_flags", "next_wr", "remote_addr",
                  "rkey_remote", "compare_add", "swap", "ah", "remote_qpn", "remote_qkey",
                  "remote_srqn", "mw", "bind_info", "bind_rkey")  # fmt: skip


def copy_wr(src: object, dst: SendWR | RecvWR) -> None:
    """Fill ``dst`` with ``src``'s members and attributes (``bad_wr``, as ibv_post_*
    fills it with the WR that failed; nothing if ``src`` is not a WR)."""
    if not isinstance(src, (SendWR, RecvWR)):
        return
    for name in SEND_WR_FIELDS if isinstance(src, SendWR) else RECV_WR_FIELDS:
        setattr(dst, name, getattr(src, name))
    dst.__dict__.update(src.__dict__)


_SEND_FLAG_NAMES = {
    IBV_SEND_FENCE: "IBV_SEND_FENCE",
    IBV_SEND_SIGNALED: "IBV_SEND_SIGNALED",
    IBV_SEND_SOLICITED: "IBV_SEND_SOLICITED",
    IBV_SEND_INLINE: "IBV_SEND_INLINE",
    IBV_SEND_IP_CSUM: "IBV_SEND_IP_CSUM",
}


def send_flags_to_str(flags: int) -> str:
    return "".join(name + " " for bit, name in _SEND_FLAG_NAMES.items() if flags & bit)
