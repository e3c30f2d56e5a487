"""Work requests: ``SGE``, ``SendWR``, ``RecvWR`` (pyverbs ``wr``).

These are the application's descriptions of work.  Posting copies them into
ring entries (the SGE list included), so a WR object may be changed or
reused as soon as ``post_send``/``post_recv`` returns, as with C verbs.
"""

from __future__ import annotations

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
from softverbs.verbs.base import _LIMIT, CStruct, PyverbsCM, as_uint, c_member
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


class _SgeList:
    """A WR's ``sg`` and ``num_sge``, one list: ``num_sge`` is its length, and
    setting it lower drops the SGEs past it (what the C WR's count does)."""

    sg: list[SGE]

    @property
    def num_sge(self) -> int:
        return len(self.sg)

    @num_sge.setter
    def num_sge(self, val: int) -> None:
        self.sg = self.sg[:val]


class RecvWR(_SgeList, CStruct, PyverbsCM):
    """A receive work request: ``RecvWR(wr_id, num_sge, sg, next_wr)``."""

    _c_fields = {"wr_id": 64}
    wr_id: int
    sg: list[SGE]
    next_wr: RecvWR | None

    def __init__(
        self, wr_id: int = 0, num_sge: int = 0, sg: Any = None, next_wr: RecvWR | None = None
    ) -> None:
        # one WR per receive: the fields go straight into the instance dictionary,
        # checked by CStruct.__setattr__'s rule (c_member)
        d = self.__dict__
        d["wr_id"] = c_member(self, "wr_id", wr_id)
        d["sg"] = _sg_list(sg, num_sge)
        d["next_wr"] = next_wr

    def close(self) -> None:
        pass

    def __str__(self) -> str:
        return f"{'WR ID':22}: {self.wr_id:<20}\n{'Num SGE':22}: {self.num_sge:<20}\n"


def recv_wqe(w: RecvWR, max_sge: int, n: int, verb: str) -> RecvWQE:
    """Check a receive WR and turn it into a ring entry (``n``: its place in the
    posted list and ``verb``, for the message)."""
    sg = w.sg
    if len(sg) > max_sge:
        raise einval(f"{verb}: WR #{n} (wr_id={w.wr_id}): {len(sg)} SGEs exceed "
                     f"max_recv_sge={max_sge}")  # fmt: skip
    sges = []
    length = 0
    for s in sg:
        size = s.length
        sges.append((s.addr, size, s.lkey))
        length += size
    return RecvWQE(w.wr_id, sges, length)


_NO_SGE_OPCODES = (IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV)
#: a new SendWR's union members (``ibv_send_wr.wr``): all zero
_UNION_ZERO: dict[str, Any] = {
    "remote_addr": 0, "rkey_remote": 0, "compare_add": 0, "swap": 0, "ah": None,
    "remote_qpn": 0, "remote_qkey": 0, "remote_srqn": 0, "mw": None, "bind_info": None,
    "bind_rkey": 0,
}  # fmt: skip


class SendWR(_SgeList, CStruct, PyverbsCM):
    """A send work request, shaped like pyverbs' ``SendWR``.

    ``send_flags`` defaults to ``IBV_SEND_SIGNALED``, as in pyverbs.
    """

    _c_fields = {"wr_id": 64, "opcode": 32, "imm_data": 32, "send_flags": 32,
                 "remote_addr": 64, "rkey_remote": 32, "compare_add": 64, "swap": 64,
                 "remote_qpn": 32, "remote_qkey": 32, "remote_srqn": 32}  # fmt: skip
    wr_id: int
    opcode: int
    sg: list[SGE]
    imm_data: int
    send_flags: int
    next_wr: SendWR | None
    # the union members of ibv_send_wr.wr (set together, zeroed, by __init__)
    remote_addr: int
    rkey_remote: int
    compare_add: int
    swap: int
    ah: AH | None
    remote_qpn: int
    remote_qkey: int
    remote_srqn: int
    mw: MW | None
    bind_info: MWBindInfo | None
    bind_rkey: int

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
        # straight into the instance dictionary, checked by CStruct.__setattr__'s rule
        d = self.__dict__
        d["wr_id"] = c_member(self, "wr_id", wr_id)
        d["opcode"] = c_member(self, "opcode", opcode)
        d["sg"] = _sg_list(sg, num_sge)
        d["imm_data"] = c_member(self, "imm_data", imm_data)
        d["send_flags"] = c_member(self, "send_flags", send_flags)
        d["next_wr"] = next_wr
        d.update(_UNION_ZERO)  # the union members of ibv_send_wr.wr, zeroed

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


_SEND_FLAG_NAMES = {
    IBV_SEND_FENCE: "IBV_SEND_FENCE",
    IBV_SEND_SIGNALED: "IBV_SEND_SIGNALED",
    IBV_SEND_SOLICITED: "IBV_SEND_SOLICITED",
    IBV_SEND_INLINE: "IBV_SEND_INLINE",
    IBV_SEND_IP_CSUM: "IBV_SEND_IP_CSUM",
}


def send_flags_to_str(flags: int) -> str:
    return "".join(name + " " for bit, name in _SEND_FLAG_NAMES.items() if flags & bit)
