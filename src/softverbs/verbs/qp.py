"""Queue pairs (pyverbs ``qp``): creation, modify/query, posting.

Posting is the driver half of a NIC: ``post_send`` checks the WR (local
misuse raises at once: EINVAL, ENOMEM), writes a WQE into the send ring and
rings the doorbell; the engine does the rest.  A WR list stops at the first
bad WR, which is reported through ``bad_wr`` and named in the error; the WRs
before it stay posted.

Doorbells and deferred posting (seed 003): a WR carrying
:data:`~softverbs.enums.IBV_SEND_DEFER` is written without ringing.  The
doorbell rings after the last non-deferred WR of a call, which hands every
WQE written so far -- deferred ones included -- to the engine.  When a post
fails, the doorbell rings for everything written before the failure, so no
deferred WR is stranded, and the failed WR produces no completion.
"""

from __future__ import annotations

import ctypes
import errno
import sys
from typing import Any, overload

from softverbs import sanitizer
from softverbs.device import ops, records
from softverbs.device.core import ALLOWED_OPCODES
from softverbs.engine import qpstate
from softverbs.engine.rings import WQ_RQ, WQ_SQ, SendWQE, Sge, WorkRing, ring_slots
from softverbs.engine.wr import WrClass, info_of
from softverbs.enums import (
    IBV_MTU_1024,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QP_STATE,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPT_RAW_PACKET,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    IBV_SEND_DEFER,
    IBV_SEND_FENCE,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
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
    ibv_qp_state,
    ibv_qp_type,
    ibv_wr_opcode,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError, einval, enomem, eopnotsupp
from softverbs.verbs.addr import AH, GID, AHAttr, ah_attr_of, av_of
from softverbs.verbs.base import CStruct, PyverbsCM, PyverbsObject, as_uint, require
from softverbs.verbs.cq import CQBase
from softverbs.verbs.device import LIMITS, Context
from softverbs.verbs.mr import MW, MWBind, MWBindInfo, inc_rkey
from softverbs.verbs.pd import PD
from softverbs.verbs.provider import Attach, check_post, destroy
from softverbs.verbs.sge import SGE
from softverbs.verbs.srq import SRQ
from softverbs.verbs.wr import RecvWR, SendWR, copy_wr, recv_wqe, sge_of
from softverbs.verbs.xrcd import XRCD

SEND_FLAGS = int(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE)
# Plain ints for the checks post_send makes on every WR (IntFlag arithmetic
# builds an enum member per operation).
_DEFER = int(IBV_SEND_DEFER)
_SIGNALED = int(IBV_SEND_SIGNALED)
_INLINE = int(IBV_SEND_INLINE)
_FENCE = int(IBV_SEND_FENCE)
_SOLICITED = int(IBV_SEND_SOLICITED)
_ALLOWED_SEND_FLAGS = SEND_FLAGS | _DEFER
_NOT_SEND_FLAGS = ~_ALLOWED_SEND_FLAGS & 0xFFFFFFFF  #: (send_flags is a 32-bit member)
#: WR classes that address remote memory; enum members as module constants,
#: since a class attribute lookup of an IntEnum member costs several times a global's
_SEND_CLASS = WrClass.SEND
_WRITE = WrClass.WRITE
_READ = WrClass.READ
_ATOMIC = WrClass.ATOMIC
_POST_SEND_STATES = (IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR)
#: the same states as bits (bit ``state`` set), and each QP type's opcodes as bits
#: (bit ``opcode`` set; every opcode is below 64): a shift and a mask per WR, where
#: a tuple or a frozenset lookup costs a few hundred instructions compiled
_POST_SEND_STATE_BITS: int = sum(1 << int(st) for st in _POST_SEND_STATES)
_OPCODE_BITS: dict[int, int] = {int(t): sum(1 << int(op) for op in ops)
                                for t, ops in ALLOWED_OPCODES.items()}  # fmt: skip
assert all(0 <= op < 64 for ops in ALLOWED_OPCODES.values() for op in ops)
_UD = int(IBV_QPT_UD)
_XRC_SEND = int(IBV_QPT_XRC_SEND)
_LOCAL_INV = int(IBV_WR_LOCAL_INV)
_BIND_MW = int(IBV_WR_BIND_MW)


def _name(enum: Any, value: int) -> str:
    try:
        return str(enum(value).name)
    except ValueError:
        return str(value)


class _Where:
    """The 'post_send: WR #n (wr_id=...)' prefix of an error, built only when used."""

    __slots__ = ("n", "verb", "wr")

    def __init__(self, n: int, wr: Any, verb: str = "post_send") -> None:
        self.n = n
        self.wr = wr
        self.verb = verb

    def __format__(self, spec: str) -> str:
        return f"{self.verb}: WR #{self.n} (wr_id={self.wr.wr_id})"

    def __str__(self) -> str:
        return format(self, "")


class QPCap(CStruct, PyverbsObject):
    """``ibv_qp_cap``."""

    _c_fields = dict.fromkeys(("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge",
                               "max_inline_data"), 32)  # fmt: skip

    def __init__(
        self,
        max_send_wr: int = 1,
        max_recv_wr: int = 10,
        max_send_sge: int = 1,
        max_recv_sge: int = 1,
        max_inline_data: int = 0,
    ) -> None:
        super().__init__()
        self.max_send_wr = max_send_wr
        self.max_recv_wr = max_recv_wr
        self.max_send_sge = max_send_sge
        self.max_recv_sge = max_recv_sge
        self.max_inline_data = max_inline_data

    def copy(self) -> QPCap:
        return QPCap(self.max_send_wr, self.max_recv_wr, self.max_send_sge,
                     self.max_recv_sge, self.max_inline_data)  # fmt: skip

    def __str__(self) -> str:
        f = "{:22}: {:<20}\n"
        return "".join(
            f.format(n, getattr(self, n))
            for n in (
                "max_send_wr",
                "max_recv_wr",
                "max_send_sge",
                "max_recv_sge",
                "max_inline_data",
            )
        )


class _CapField:
    """A field of an init attribute's ``cap`` (its QPCap), read and set on the
    init attribute itself, as pyverbs' QPInitAttr flattens them."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _CapField: ...
    @overload
    def __get__(self, obj: _InitAttrBase, objtype: type | None = None) -> int: ...
    def __get__(self, obj: _InitAttrBase | None, objtype: type | None = None) -> int | _CapField:
        if obj is None:
            return self  # read on the class, as a property is
        value: int = getattr(obj.cap, self.name)
        return value

    def __set__(self, obj: _InitAttrBase, val: int) -> None:
        setattr(obj.cap, self.name, val)  # checked there, as a QPCap member


class _InitAttrBase(CStruct, PyverbsObject):
    """Fields common to QPInitAttr and QPInitAttrEx."""

    _c_fields = {"qp_type": 32, "sq_sig_all": -32}

    def __init__(
        self, qp_type: int, qp_context: Any, scq: Any, rcq: Any, srq: SRQ | None,
        cap: QPCap | None, sq_sig_all: int,
    ) -> None:  # fmt: skip
        super().__init__()
        for cq, what in ((scq, "scq"), (rcq, "rcq")):
            if cq is not None and not isinstance(cq, CQBase):
                raise PyverbsUserError(f"Expected CQ/CQEX, got {type(cq)} for {what}")
        require(srq, SRQ, "srq", optional=True)
        require(cap, QPCap, "cap", optional=True)
        self.qp_type = qp_type
        self.qp_context = qp_context
        self.send_cq = scq
        self.recv_cq = rcq
        self.srq = srq
        # pyverbs: without a QPCap every capability is 0
        self.cap = cap.copy() if cap is not None else QPCap(0, 0, 0, 0, 0)
        self.sq_sig_all = sq_sig_all

    # the capability fields, flattened as pyverbs exposes them
    max_send_wr = _CapField()
    max_recv_wr = _CapField()
    max_send_sge = _CapField()
    max_recv_sge = _CapField()
    max_inline_data = _CapField()


class QPInitAttr(_InitAttrBase):
    """``ibv_qp_init_attr``: ``QPInitAttr(qp_type, qp_context, scq, rcq, srq, cap, sq_sig_all)``."""

    def __init__(
        self,
        qp_type: int = IBV_QPT_UD,
        qp_context: Any = None,
        scq: Any = None,
        rcq: Any = None,
        srq: SRQ | None = None,
        cap: QPCap | None = None,
        sq_sig_all: int = 1,
    ) -> None:
        super().__init__(qp_type, qp_context, scq, rcq, srq, cap, sq_sig_all)


class QPInitAttrEx(_InitAttrBase):
    """``ibv_qp_init_attr_ex``, for ``QP(ctx, QPInitAttrEx(...))``."""

    _c_fields = {**_InitAttrBase._c_fields, "comp_mask": 32, "create_flags": 32,
                 "max_tso_header": 16, "source_qpn": 32, "send_ops_flags": 64}  # fmt: skip

    def __init__(
        self,
        qp_type: int = IBV_QPT_UD,
        qp_context: Any = None,
        scq: Any = None,
        rcq: Any = None,
        srq: SRQ | None = None,
        cap: QPCap | None = None,
        sq_sig_all: int = 0,
        comp_mask: int = 0,
        pd: PD | None = None,
        xrcd: Any = None,
        create_flags: int = 0,
        max_tso_header: int = 0,
        source_qpn: int = 0,
        hash_conf: Any = None,
        ind_table: Any = None,
        send_ops_flags: int = 0,
    ) -> None:
        super().__init__(qp_type, qp_context, scq, rcq, srq, cap, sq_sig_all)
        require(pd, PD, "pd", optional=True)
        self.comp_mask = comp_mask
        self.pd = pd
        self.xrcd = xrcd
        self.create_flags = create_flags
        self.max_tso_header = max_tso_header
        self.source_qpn = source_qpn
        self.hash_conf = hash_conf
        self.ind_table = ind_table
        self.send_ops_flags = send_ops_flags


class QPAttr(CStruct, PyverbsObject):
    """``ibv_qp_attr``: the attributes of ``modify`` and ``query``."""

    _c_fields = {
        **dict.fromkeys(("qp_state", "cur_qp_state", "path_mtu", "path_mig_state", "qkey",
                         "rq_psn", "sq_psn", "dest_qp_num", "rate_limit"), 32),
        "qp_access_flags": 32,
        **dict.fromkeys(("pkey_index", "alt_pkey_index"), 16),
        **dict.fromkeys(("en_sqd_async_notify", "sq_draining", "max_rd_atomic",
                         "max_dest_rd_atomic", "min_rnr_timer", "port_num", "timeout",
                         "retry_cnt", "rnr_retry", "alt_port_num", "alt_timeout"), 8),
    }  # fmt: skip

    def __init__(
        self,
        qp_state: int = IBV_QPS_INIT,
        cur_qp_state: int = IBV_QPS_RESET,
        port_num: int = 1,
        path_mtu: int = IBV_MTU_1024,
    ) -> None:
        super().__init__()
        self.qp_state = qp_state
        self.cur_qp_state = cur_qp_state
        self.port_num = port_num
        self.path_mtu = path_mtu
        self.path_mig_state = 0
        self.qkey = 0
        self.rq_psn = 0
        self.sq_psn = 0
        self.dest_qp_num = 0
        self.qp_access_flags = 0
        self.cap = QPCap(0, 0, 0, 0, 0)
        self.ah_attr = AHAttr()
        self.alt_ah_attr = AHAttr()
        self.pkey_index = 0
        self.alt_pkey_index = 0
        self.en_sqd_async_notify = 0
        self.sq_draining = 0
        self.max_rd_atomic = 0
        self.max_dest_rd_atomic = 0
        self.min_rnr_timer = 0
        self.timeout = 0
        self.retry_cnt = 0
        self.rnr_retry = 0
        self.alt_port_num = 0
        self.alt_timeout = 0
        self.rate_limit = 0

    def __str__(self) -> str:
        skip = {"logger", "cap", "ah_attr", "alt_ah_attr"}
        return "".join(f"{k:<22}: {v}\n" for k, v in vars(self).items() if k not in skip)


def _attrs_of(a: QPAttr) -> records.QPAttrs:
    """A pyverbs QPAttr as the device's record (which fields count is the mask's)."""
    return records.QPAttrs(
        av_of(a.ah_attr), av_of(a.alt_ah_attr), a.qp_state, a.cur_qp_state, a.path_mtu,
        a.path_mig_state, a.qkey, a.rq_psn, a.sq_psn, a.dest_qp_num, a.qp_access_flags,
        a.pkey_index, a.alt_pkey_index, a.en_sqd_async_notify, a.sq_draining, a.max_rd_atomic,
        a.max_dest_rd_atomic, a.min_rnr_timer, a.port_num, a.timeout, a.retry_cnt, a.rnr_retry,
        a.alt_port_num, a.alt_timeout, a.rate_limit, 0,
    )  # fmt: skip


def _qp_attr_of(r: records.QPAttrs) -> QPAttr:
    """The inverse of :func:`_attrs_of`."""
    out = QPAttr(qp_state=r.qp_state, cur_qp_state=r.cur_qp_state, port_num=r.port_num,
                 path_mtu=r.path_mtu)  # fmt: skip
    for name in ("path_mig_state", "qkey", "rq_psn", "sq_psn", "dest_qp_num", "qp_access_flags",
                 "pkey_index", "alt_pkey_index", "en_sqd_async_notify", "sq_draining",
                 "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer", "timeout",
                 "retry_cnt", "rnr_retry", "alt_port_num", "alt_timeout", "rate_limit"):
        setattr(out, name, getattr(r, name))
    out.ah_attr = ah_attr_of(r.ah)
    out.alt_ah_attr = ah_attr_of(r.alt_ah)
    return out


class ECE(CStruct, PyverbsCM):
    """``ibv_ece``: Enhanced Connection Establishment options (a vendor's own)."""

    _c_fields = {"vendor_id": 32, "options": 32, "comp_mask": 32}

    def __init__(self, vendor_id: int = 0, options: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        self.vendor_id = vendor_id
        self.options = options
        self.comp_mask = comp_mask

    def __str__(self) -> str:
        f = "{:22}: 0x{:<20x}\n"
        return ("ECE:\n" + f.format("Vendor ID", self.vendor_id)
                + f.format("Options", self.options)
                + f.format("Comp Mask", self.comp_mask))  # fmt: skip


class QP(PyverbsCM):
    """A queue pair: ``QP(pd, QPInitAttr(...), QPAttr?)`` or ``QP(ctx, QPInitAttrEx(...))``.

    Given a ``QPAttr``, the constructor moves RC, UC and XRC QPs to INIT and
    UD QPs to RTS, as pyverbs does.

    The QP's rings are this object's (``sq``, ``rq``): posting writes WQEs
    into them and rings the doorbell; the device judges everything else.
    """

    close_rank = 10
    #: provider (mlx5dv) create flags for the device (records.CreateQP.dv_flags)
    _dv_flags = 0

    def __init__(self, creator: Any, init_attr: Any, qp_attr: QPAttr | None = None) -> None:
        super().__init__()
        require(qp_attr, QPAttr, "qp_attr", optional=True)
        if isinstance(creator, PD):
            require(init_attr, (QPInitAttr, QPInitAttrEx), "init_attr")
            pd: PD | None = creator
            ctx: Context = creator.ctx
        elif isinstance(creator, Context):
            require(init_attr, QPInitAttrEx, "init_attr")
            pd = init_attr.pd
            ctx = creator
        else:
            raise PyverbsUserError(f"QP creator must be a PD or a Context, got {type(creator)}")
        ctx._check_open()
        qp_type = init_attr.qp_type
        if qp_type == IBV_QPT_RAW_PACKET:
            raise eopnotsupp("raw packet QPs are not supported by softverbs")
        if qp_type not in ALLOWED_OPCODES:
            raise einval(f"unknown QP type {qp_type}")
        cap: QPCap = init_attr.cap
        self._ctx = ctx
        self.context = ctx
        self.pd = pd
        self.scq: CQBase | None = init_attr.send_cq
        self.rcq: CQBase | None = init_attr.recv_cq
        self.srq: SRQ | None = init_attr.srq
        self.xrcd = getattr(init_attr, "xrcd", None)
        self.cap = cap.copy()
        self.qp_context = init_attr.qp_context
        self.sq_sig_all = bool(init_attr.sq_sig_all)
        self.send_ops_flags = getattr(init_attr, "send_ops_flags", 0)
        self.create_flags = getattr(init_attr, "create_flags", 0)
        self._unsignaled_run = 0  #: unsignaled WRs posted since the last signaled one
        self._qp_type: int = qp_type
        provider = ctx.provider
        xrc = qp_type in (IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND)
        has_sq = qp_type != IBV_QPT_XRC_RECV
        has_rq = not xrc and self.srq is None
        # Early, for the message and before ring memory is allocated; the device
        # checks again (device.qp.create_qp).
        for name, value, hi in (
            ("max_send_wr", cap.max_send_wr, LIMITS["max_qp_wr"]),
            ("max_recv_wr", cap.max_recv_wr, LIMITS["max_qp_wr"]),
            ("max_send_sge", cap.max_send_sge, LIMITS["max_sge"]),
            ("max_recv_sge", cap.max_recv_sge, LIMITS["max_sge"]),
            ("max_inline_data", cap.max_inline_data, LIMITS["max_inline_data"]),
        ):
            if not isinstance(value, int) or not 0 <= value <= hi:
                raise einval(f"cap.{name}={value!r} exceeds the device limit {hi}")
        self.sq: WorkRing | None = provider.work_ring(
            ring_slots(cap.max_send_wr), True, cap.max_send_sge, cap.max_inline_data, qp_type
        ) if has_sq else None  # fmt: skip
        self.rq: WorkRing | None = provider.work_ring(
            ring_slots(cap.max_recv_wr), False, cap.max_recv_sge, 0, qp_type
        ) if has_rq else None  # fmt: skip
        if self.sq is not None:
            self.sq.capacity = cap.max_send_wr
        if self.rq is not None:
            self.rq.capacity = cap.max_recv_wr
        send_ops = getattr(init_attr, "send_ops_flags", 0) if getattr(
            init_attr, "comp_mask", 0) & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS else 0  # fmt: skip
        body = records.CreateQP(
            send_ops,
            records.QPCaps(cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge,
                       cap.max_inline_data, 0),
            ctx.handle, pd.device_pd if pd is not None else 0, qp_type,
            _handle(self.scq), _handle(self.rcq), _handle(self.srq), _handle(self.xrcd),
            int(self.sq_sig_all), self.create_flags & 0xFFFFFFFF, _slot(self.sq), _slot(self.rq),
            self._dv_flags,
        )  # fmt: skip
        try:
            reply = provider.call(ops.CREATE_QP, body, Attach(sq=self.sq, rq=self.rq))
        except BaseException:
            self._free_rings()
            raise
        self.dev_handle: int = reply.qp
        self._qpn: int = reply.qpn
        self.cap.max_inline_data = reply.caps.max_inline_data  # as the device rounds it
        self._adopt(ctx)
        for parent in (pd, self.scq, self.rcq, self.srq, self.xrcd, ctx if pd is None else None):
            if parent is not None:
                parent.add_ref(self)
        if qp_attr is not None:
            if qp_type in (IBV_QPT_UD,):
                self.to_rts(qp_attr)
            else:
                self.to_init(qp_attr)

    def _adopt(self, ctx: Context) -> None:
        """Make the device's handle and our rings known where events and polls look."""
        ctx.register(self, self.dev_handle)
        rings = ctx.device.rings
        if self.sq is not None:
            rings[(WQ_SQ, self.dev_handle)] = self.sq
        if self.rq is not None:
            rings[(WQ_RQ, self.dev_handle)] = self.rq

    def _free_rings(self) -> None:
        for ring in (self.sq, self.rq):
            if ring is not None:
                self._ctx.provider.free_ring(ring)

    @classmethod
    def opened(cls, ctx: Context, xrcd: Any, handle: int, qpn: int) -> QP:
        """A QP object for an XRC receive QP that another process created
        (``ibv_open_qp``): it can be modified, queried and closed; closing
        drops this handle's reference."""
        qp = cls.__new__(cls)
        PyverbsCM.__init__(qp)
        qp._ctx = qp.context = ctx
        qp.pd = qp.scq = qp.rcq = qp.srq = None
        qp.xrcd = xrcd
        qp.cap = QPCap(0, 0, 0, 0, 0)
        qp.qp_context = None
        qp.sq_sig_all = False
        qp.send_ops_flags = qp.create_flags = 0
        qp._unsignaled_run = 0
        qp._qp_type = IBV_QPT_XRC_RECV
        qp.sq = qp.rq = None
        qp.dev_handle = handle
        qp._qpn = qpn
        qp._adopt(ctx)
        xrcd.add_ref(qp)
        return qp

    # --- properties ------------------------------------------------------------
    @property
    def qp_num(self) -> int:
        return self._qpn

    @property
    def qp_state(self) -> int:
        """The QP's state as the device last published it (it moves QPs to ERR by
        itself); a QP without a send queue asks the device."""
        if self.sq is not None:
            published = self.sq.published_state()
            if published is not None:
                return published
        return int(self._query().state)

    @property
    def qp_type(self) -> int:
        return self._qp_type

    @property
    def engine(self) -> Any:
        """The QP's engine when the device runs in this process, else None (for
        tools and tests; programs never need it)."""
        engine_of = getattr(self._ctx.provider, "engine_of", None)
        return engine_of(records.KIND_QP, self.dev_handle) if engine_of is not None else None

    def __str__(self) -> str:
        return (f"QP\n{'QP type':22}: {_name(ibv_qp_type, self.qp_type):<20}\n"
                f"{'QP state':22}: {_name(ibv_qp_state, self.qp_state):<20}\n"
                f"{'QP num':22}: {self.qp_num:<20}\n")  # fmt: skip

    # --- state transitions ---------------------------------------------------------
    def _get_comp_mask(self, dst: str) -> int:
        cur = {"INIT": IBV_QPS_RESET, "RTR": IBV_QPS_INIT, "RTS": IBV_QPS_RTR}[dst]
        new = {"INIT": IBV_QPS_INIT, "RTR": IBV_QPS_RTR, "RTS": IBV_QPS_RTS}[dst]
        r = qpstate.rule(self.qp_type, cur, new)
        assert r is not None
        return r[0] | IBV_QP_STATE

    def to_init(self, qp_attr: QPAttr) -> None:
        qp_attr.qp_state = IBV_QPS_INIT
        self.modify(qp_attr, self._get_comp_mask("INIT"))

    def to_rtr(self, qp_attr: QPAttr) -> None:
        if self.qp_state != IBV_QPS_INIT:
            self.to_init(qp_attr)
        qp_attr.qp_state = IBV_QPS_RTR
        self.modify(qp_attr, self._get_comp_mask("RTR"))

    def to_rts(self, qp_attr: QPAttr) -> None:
        if self.qp_state != IBV_QPS_RTR:
            self.to_rtr(qp_attr)
        qp_attr.qp_state = IBV_QPS_RTS
        self.modify(qp_attr, self._get_comp_mask("RTS"))

    def modify(self, qp_attr: QPAttr, comp_mask: int) -> None:
        """``ibv_modify_qp``: the device judges it by its state table, against the
        QP's own state (:mod:`softverbs.engine.qpstate`)."""
        self._check_open()
        require(qp_attr, QPAttr, "qp_attr")
        comp_mask = as_uint(comp_mask, 32, "comp_mask")
        body = records.ModifyQP(_attrs_of(qp_attr), self.dev_handle, comp_mask)
        state = self._ctx.provider.call(ops.MODIFY_QP, body).state
        if state == IBV_QPS_RESET:
            self._unsignaled_run = 0
            for ring in (self.sq, self.rq):
                if ring is not None:
                    ring.forget()

    def _query(self) -> records.QueryQPReply:
        return self._ctx.provider.call(ops.QUERY_QP, records.Handle(self.dev_handle, 0))

    def attach_mcast(self, gid: GID, lid: int = 0) -> None:
        """``ibv_attach_mcast``: this UD QP receives the SENDs made to the multicast
        GID ``gid`` (destination QP 0xFFFFFF) on every device of the fabric.
        ``lid`` is InfiniBand's multicast LID; RoCE has none."""
        self._mcast(ops.ATTACH_MCAST, gid, lid)

    def detach_mcast(self, gid: GID, lid: int = 0) -> None:
        """``ibv_detach_mcast``: EINVAL if the QP is not attached to ``gid``."""
        self._mcast(ops.DETACH_MCAST, gid, lid)

    def _mcast(self, op: records.Op[records.Mcast, records.Empty], gid: GID, lid: int) -> None:
        self._check_open()
        require(gid, GID, "gid")
        body = records.Mcast(gid.raw, self.dev_handle, as_uint(lid, 16, "lid"))
        self._ctx.provider.call(op, body)

    def query(self, attr_mask: int = 0) -> tuple[QPAttr, QPInitAttr]:
        """``ibv_query_qp``: (QPAttr, QPInitAttr) with every attribute filled in."""
        self._check_open()
        as_uint(attr_mask, 32, "attr_mask")
        reply = self._query()
        out = _qp_attr_of(reply.attr)
        out.cap = self.cap.copy()
        init = QPInitAttr(qp_type=self.qp_type, qp_context=self.qp_context, scq=self.scq,
                          rcq=self.rcq, srq=self.srq, cap=self.cap,
                          sq_sig_all=int(self.sq_sig_all))  # fmt: skip
        return out, init

    # --- posting -------------------------------------------------------------------------
    def _ring(self, upto: int) -> None:
        """Move the send queue's doorbell to ``upto`` and tell the device."""
        sq = self.sq
        assert sq is not None
        if sq.ring(upto):
            self._ctx.provider.doorbell(self.dev_handle, records.DB_SQ)

    def _state(self) -> int:
        sq = self.sq
        published = sq.published_state() if sq is not None else None
        return published if published is not None else IBV_QPS_RESET

    def post_send(self, wr: SendWR, bad_wr: SendWR | None = None) -> None:
        """Post a list of send WRs (``wr`` and its ``next_wr`` chain)."""
        self._check_open()
        check_post(self._ctx.provider, "post_send", SendWR, wr, bad_wr)
        rt = self._ctx.runtime
        with rt.lock:
            _post_chain(self, wr, bad_wr)
            rt.posted()

    def _build_send(self, w: SendWR, n: int, type1_bind: bool = False) -> SendWQE:
        """The send WQE for WR #``n`` of a post (checked; EINVAL or ENOMEM if it
        cannot be posted).  A provider's QP (``ext/mlx5dv.py``) overrides this to
        add its own WRs and checks."""
        return _send_wqe(self, w, n, type1_bind)

    def _sq_full(self, where: object) -> PyverbsRDMAError:
        """ENOMEM for a post to a full send queue (and the sanitizer's report)."""
        sq = self.sq
        assert sq is not None
        if not sq.capacity:  # not the unsignaled trap: a queue made with no room
            return enomem(f"{where}: the QP was created with max_send_wr=0: its send queue "
                          "holds no WR")  # fmt: skip
        sanitizer.report_here("send-queue-full", [
            ("qp", f"{self.qp_num:#x}"),
            ("send queue", f"{sq.used} of {sq.capacity} slots held by WRs whose completions "
                           f"have not been polled; {self._unsignaled_run} unsignaled WRs "
                           "posted since the last signaled one"),
            ("result", "post_send fails with ENOMEM" + (
                ": only unsignaled WRs hold the queue, and nothing will ever free it; move "
                "the QP to RESET" if self._unsignaled_run >= sq.used else "")),
        ])  # fmt: skip
        return enomem(self._sq_full_message(where))

    def _sq_full_message(self, where: object) -> str:
        sq = self.sq
        assert sq is not None
        size = sq.capacity
        return (
            f"{where}: the send queue is full: {sq.used} of {size} slots are held by WRs "
            f"whose completions have not been polled, and {self._unsignaled_run} unsignaled "
            "WRs were posted since the last signaled one. A slot is freed only when a CQE "
            "of its WR, or of a later WR of this send queue, is polled; unsignaled WRs "
            f"make no CQE. Signal at least one WR every k < max_send_wr ({size}) posts and "
            "poll its completion. If the queue is full of unsignaled WRs that already "
            "completed, nothing will free it: move the QP to RESET (or destroy it)"
        )

    @staticmethod
    def _inline_bytes(sges: list[Sge], where: object) -> bytes:
        from softverbs.device.memory import mapped

        parts = []
        for addr, length, _ in sges:
            if length and not mapped(addr, length):
                raise einval(f"{where}: inline data at [{addr:#x}, +{length}) is not mapped")
            parts.append(ctypes.string_at(addr, length) if length else b"")
        return b"".join(parts)

    @staticmethod
    def _bind_args(wqe: SendWQE, mw: MW | None, info: MWBindInfo | None, new_key: int,
                   where: object, type2: bool) -> None:  # fmt: skip
        from softverbs.enums import IBV_MW_TYPE_1, IBV_MW_TYPE_2

        if mw is None or info is None:
            raise einval(f"{where}: a bind needs a memory window and MWBindInfo (set_bind_wr)")
        want = IBV_MW_TYPE_2 if type2 else IBV_MW_TYPE_1
        if mw.type != want:
            raise einval(
                f"{where}: type {mw.type} windows are bound with "
                + ("QP.bind_mw()" if mw.type == IBV_MW_TYPE_1 else "an IBV_WR_BIND_MW WR")
            )
        wqe.bind_mw, wqe.bind_mr, wqe.bind_rkey = mw.dev_handle, info.mr.dev_handle, new_key
        wqe.bind_addr, wqe.bind_length = info.addr, info.length
        wqe.bind_access = info.mw_access_flags
        mw._rkey = new_key

    def set_ece(self, ece: ECE) -> None:
        """``ibv_set_ece``: ECE options are a vendor's; softverbs has none."""
        self._check_open()
        require(ece, ECE, "ece")
        if ece.vendor_id == 0:
            return  # as pyverbs: nothing to set
        raise PyverbsRDMAError("Failed to set ECE: softverbs devices have no vendor ECE "
                               "options", errno.EOPNOTSUPP)  # fmt: skip

    def query_ece(self) -> ECE:
        """``ibv_query_ece``: EOPNOTSUPP, as on a device without ECE."""
        self._check_open()
        raise PyverbsRDMAError("Failed to query ECE: softverbs devices have no vendor ECE "
                               "options", errno.EOPNOTSUPP)  # fmt: skip

    def query_data_in_order(self, op: int, flags: int = 0) -> int:
        """``ibv_query_qp_data_in_order``: softverbs places the data of a message in
        order (packets that arrive out of order are never placed), so a whole
        message is always written in order."""
        from softverbs.enums import (
            IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES,
            IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS,
            IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG,
        )

        self._check_open()
        as_uint(op, 32, "op")
        if as_uint(flags, 32, "flags") & IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS:
            return int(IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG
                       | IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES)  # fmt: skip
        return 1

    def bind_mw(self, mw: MW, mw_bind: MWBind) -> None:
        """Bind a type 1 window (``ibv_bind_mw``): a BIND_MW WQE on this QP's SQ."""
        require(mw, MW, "mw")
        require(mw_bind, MWBind, "mw_bind")
        wr = SendWR(wr_id=mw_bind.wr_id, opcode=IBV_WR_BIND_MW,
                    send_flags=mw_bind.send_flags)  # fmt: skip
        wr.mw = mw
        wr.bind_info = mw_bind.info
        wr.bind_rkey = inc_rkey(mw.rkey)
        rt = self._ctx.runtime
        with rt.lock:
            sq = self.sq
            if sq is None:
                raise einval("bind_mw: this QP has no send queue")
            try:
                wqe = self._build_send(wr, 0, type1_bind=True)
            except PyverbsRDMAError:
                self._ring(sq.pi)  # never strand deferred WQEs (seed 003)
                rt.posted()
                raise
            sq.push(wqe)
            self._unsignaled_run = 0 if wqe.signaled else self._unsignaled_run + 1
            self._ring(sq.pi)
            rt.posted()

    def post_recv(self, wr: RecvWR, bad_wr: RecvWR | None = None) -> None:
        """Post a list of receive WRs."""
        self._check_open()
        check_post(self._ctx.provider, "post_recv", RecvWR, wr, bad_wr)
        rt = self._ctx.runtime
        with rt.lock:
            try:
                # what holds for the whole list is checked once, and names its first WR
                if self.srq is not None:
                    raise einval(f"{_Where(0, wr, 'post_recv')}: this QP takes its receives "
                                 "from an SRQ; post them to the SRQ")  # fmt: skip
                rq = self.rq
                if rq is None:
                    raise einval(
                        f"{_Where(0, wr, 'post_recv')}: an "
                        f"{_name(ibv_qp_type, self.qp_type)} QP has no receive queue"
                    )
                if self._state() == IBV_QPS_RESET:
                    raise einval(f"{_Where(0, wr, 'post_recv')}: the QP is in RESET; move it "
                                 "to INIT first")  # fmt: skip
                if not rq.capacity:
                    raise enomem(f"{_Where(0, wr, 'post_recv')}: the QP was created with "
                                 "max_recv_wr=0: its receive queue holds no WR")  # fmt: skip
            except PyverbsRDMAError:
                if bad_wr is not None:
                    copy_wr(wr, bad_wr)
                raise
            try:
                _post_recvs(rq, wr, self.cap.max_recv_sge, bad_wr)
            finally:
                # the WRs before a failed one stay posted: the doorbell rings for them
                provider = self._ctx.provider
                if rq.ring(rq.pi) and (provider.rings_rq or self._state() == IBV_QPS_ERR):
                    provider.doorbell(self.dev_handle, records.DB_RQ)
                    rt.posted()

    def _release(self) -> None:
        ctx = self._ctx
        try:
            destroy(ctx.provider, records.KIND_QP, self.dev_handle)
        finally:
            for kind in (WQ_SQ, WQ_RQ):
                ctx.device.rings.pop((kind, self.dev_handle), None)
            self._free_rings()


#: the per-WR hook of a plain QP: a QP class that overrides it gets it called per WR
_BUILD_SEND = QP._build_send


def _post_recvs(rq: WorkRing, wr: RecvWR, max_sge: int, bad_wr: RecvWR | None) -> None:
    """``post_recv``'s loop, under the runtime's lock: each WR's receive WQE
    (``recv_wqe``) into the receive ring.  A WR that fails stops the list (the
    ones before it stay posted) and ``bad_wr`` gets a copy of it.  A module
    function so that the compiled build holds the ring typed (``qp.pxd``)."""
    w: object = wr
    n = 0
    room = rq.capacity - rq.used
    try:
        while w is not None:
            if room <= 0:
                raise enomem(
                    f"{_Where(n, w, 'post_recv')}: the receive queue is full: "
                    f"{rq.used} of {rq.capacity} receive WRs are posted and not yet "
                    "completed and polled"
                )
            rq.push(recv_wqe(w, max_sge, n, "post_recv"))  # which checks w is a RecvWR
            room -= 1
            r: RecvWR = w  # type: ignore[assignment]
            w = r.next_wr
            n += 1
    except PyverbsRDMAError:
        if bad_wr is not None and w is not None:
            copy_wr(w, bad_wr)
        raise


class _SendFacts:
    """What each WR of one post is checked against and built with, read from the
    QP once (``_post_chain``), or per WR for a provider's ``_build_send``.

    Compiled, an extension type (``qp.pxd``), so ``_wqe_of`` reads these as C
    struct fields.  ``room`` and ``unsignaled`` follow the WRs of the post."""

    __slots__ = ("can_post", "max_inline", "max_sge", "opcodes", "qp", "qp_type", "room",
                 "sig_all", "sq", "state", "unsignaled")  # fmt: skip

    def __init__(self, qp: QP) -> None:
        self.qp = qp
        self.qp_type = qp_type = qp._qp_type
        self.sq = sq = qp.sq
        published = sq.published_state() if sq is not None else None
        self.state = state = published if published is not None else IBV_QPS_RESET
        self.can_post = 0 <= state < 64 and bool((_POST_SEND_STATE_BITS >> state) & 1)
        self.opcodes = _OPCODE_BITS.get(qp_type, 0)
        cap = qp.cap
        self.max_sge = cap.max_send_sge
        self.max_inline = cap.max_inline_data
        self.sig_all = bool(qp.sq_sig_all)
        self.room = sq.capacity - sq.used if sq is not None else 0
        self.unsignaled = qp._unsignaled_run


def _post_chain(qp: QP, wr: SendWR, bad_wr: SendWR | None) -> None:
    """``post_send``'s loop, under the runtime's lock: each WR's WQE into the send
    ring, then the doorbell.

    The QP's facts are read once per post (``_SendFacts``) and each WR becomes a
    WQE by ``_wqe_of`` -- or by the QP's own ``_build_send`` where a provider's QP
    overrides it (``ext/mlx5dv.py``).  A module function so that the compiled
    build holds the ring, the WRs and the WQEs typed (``qp.pxd``): the push, the
    reads of the WR and of the WQE are C calls and C struct reads.  A WR that
    fails stops the list: the doorbell rings for the WQEs written before it
    (never strand deferred WQEs, seed 003) and ``bad_wr`` gets a copy of it."""
    sq = qp.sq
    ring_to = int(sq.hdr[sq.DB]) if sq is not None else 0
    f = _SendFacts(qp)
    own = type(qp)._build_send is _BUILD_SEND  # else a provider's hook, per WR
    cur: object = wr
    n = 0
    try:
        while cur is not None:
            if not isinstance(cur, SendWR):
                raise einval(f"post_send: WR #{n}: a send WR list holds SendWR objects, got "
                             f"{type(cur).__name__}")  # fmt: skip
            w = cur
            wqe = _wqe_of(f, w, n, False) if own else qp._build_send(w, n)
            assert sq is not None
            sq.push(wqe)  # sets wqe.index
            f.room -= 1
            f.unsignaled = 0 if wqe.signaled else f.unsignaled + 1
            if not own:
                qp._unsignaled_run = f.unsignaled  # what the hook's next WR reads
            flags = w._send_flags
            if not flags & _DEFER:
                ring_to = wqe.index + 1
            cur = w.next_wr
            n += 1
    except PyverbsRDMAError:
        qp._unsignaled_run = f.unsignaled
        if sq is not None:
            qp._ring(sq.pi)
        qp._ctx.runtime.posted()
        if bad_wr is not None and cur is not None:
            copy_wr(cur, bad_wr)
        raise
    qp._unsignaled_run = f.unsignaled
    qp._ring(ring_to)


def _send_wqe(qp: QP, w: SendWR, n: int, type1_bind: bool) -> SendWQE:
    """``QP._build_send``: WR #``n`` of a post checked and made a send WQE, with
    the QP's facts as they are now."""
    return _wqe_of(_SendFacts(qp), w, n, type1_bind)


def _wqe_of(f: _SendFacts, w: SendWR, n: int, type1_bind: bool) -> SendWQE:
    """WR #``n`` of a post checked against the QP's facts ``f`` and made a send WQE.

    The checks go cheapest first, and an error's prefix (``_Where``) is made
    only when one fails.  Compiled, the facts, the WR, its SGEs and the WQE are
    typed (``qp.pxd``): C struct reads, and the WQE comes from its type's free
    list filled by one C call (``SendWQE._fill``, the engine's list of fields)."""
    qp_type = f.qp_type
    if f.sq is None:
        raise einval(f"{_Where(n, w)}: an {_name(ibv_qp_type, qp_type)} QP has no send queue")
    if not f.can_post:
        raise einval(
            f"{_Where(n, w)}: the QP is in {_name(ibv_qp_state, f.state)}; send WRs may be "
            "posted only in RTS (or SQD, SQE, ERR). Move the QP to RTS first"
        )
    opcode = w._opcode
    if opcode >= 64 or not (f.opcodes >> opcode) & 1:
        raise einval(f"{_Where(n, w)}: opcode {_name(ibv_wr_opcode, opcode)} is not "
                     f"supported on {_name(ibv_qp_type, qp_type)} QPs")  # fmt: skip
    flags = w._send_flags
    if flags & _NOT_SEND_FLAGS:
        raise einval(f"{_Where(n, w)}: unsupported send_flags bits "
                     f"{flags & _NOT_SEND_FLAGS:#x}")  # fmt: skip
    if f.room <= 0:
        f.qp._unsignaled_run = f.unsignaled  # the report's count, as of this WR
        raise f.qp._sq_full(_Where(n, w))
    sg = w.sg
    if len(sg) > f.max_sge:
        raise einval(f"{_Where(n, w)}: {len(sg)} SGEs exceed max_send_sge={f.max_sge}")
    info = info_of(opcode)
    sges: list[Sge] = []
    length = 0
    for item in sg:
        s = sge_of(item, n, "post_send", w._wr_id)
        size = s._length
        sges.append((s._addr, size, s._lkey))
        length += size
    inline: bytes | None = None
    klass = info.klass
    if flags & _INLINE:
        where = _Where(n, w)
        if klass is not _SEND_CLASS and klass is not _WRITE:
            raise einval(f"{where}: IBV_SEND_INLINE applies only to SEND and RDMA WRITE")
        if length > f.max_inline:
            raise einval(f"{where}: {length} bytes of inline data exceed "
                         f"max_inline_data={f.max_inline}")  # fmt: skip
        inline = f.qp._inline_bytes(sges, where)
        sges = []
    # imm_data is ibv_send_wr's __be32: its bytes go on the wire as they lie in
    # memory; the WQE carries the ImmDt value (docs/rings.md)
    imm = _htobe32(w._imm_data) if info.imm else 0
    inv_rkey = w._imm_data & 0xFFFFFFFF if info.inv or opcode == _LOCAL_INV else 0
    rkey: Any = 0
    remote_addr: Any = 0
    compare_add: Any = 0
    swap: Any = 0
    if klass is _WRITE or klass is _READ or klass is _ATOMIC:
        rkey = w._rkey_remote
        remote_addr = w._remote_addr
        if klass is _ATOMIC:
            compare_add = w._compare_add & 0xFFFFFFFFFFFFFFFF
            swap = w._swap & 0xFFFFFFFFFFFFFFFF
    ah: Any = 0
    remote_qpn: Any = 0
    remote_qkey: Any = 0
    xrc_srqn: Any = 0
    if qp_type == _UD:
        if w.ah is None:
            raise einval(f"{_Where(n, w)}: a UD send needs an address handle (set_wr_ud)")
        w.ah._check_open()
        ah = w.ah.dev_handle
        remote_qpn = w._remote_qpn & 0xFFFFFF
        remote_qkey = w._remote_qkey & 0xFFFFFFFF
    elif qp_type == _XRC_SEND:
        xrc_srqn = w._remote_srqn & 0xFFFFFF
    wqe = SendWQE.__new__(SendWQE)
    wqe._fill(w._wr_id, opcode, True if flags & _SIGNALED else f.sig_all, sges, length, inline,
              bool(flags & _FENCE), bool(flags & _SOLICITED), imm, inv_rkey, rkey, xrc_srqn,
              remote_addr, compare_add, swap, ah, remote_qpn, remote_qkey, 0, 0, 0, 0, 0, 0, 0,
              0)  # fmt: skip
    if opcode == _BIND_MW:
        f.qp._bind_args(wqe, w.mw, w.bind_info, w.bind_rkey, _Where(n, w),
                        type2=not type1_bind)  # fmt: skip
    return wqe


def _handle(obj: Any) -> int:
    """The device handle of a parent object (0: none)."""
    return int(obj.dev_handle) if obj is not None else 0


def _slot(ring: WorkRing | None) -> int:
    """Bytes per slot of a ring in shared memory (0: a ring of this process)."""
    return int(getattr(ring.slots, "slot", 0)) if ring is not None else 0


class DataBuffer(PyverbsCM):
    """One inline buffer for ``QPEx.wr_set_inline_data_list`` (``ibv_data_buf``)."""

    def __init__(self, addr: int, length: int) -> None:
        super().__init__()
        self.addr = addr
        self.length = length


class QPEx(QP):
    """An extended QP with the ``wr_*`` posting API (``ibv_qp_ex``).

    ``wr_start`` opens a batch, each ``wr_<opcode>`` call starts a WR and the
    ``wr_set_*`` calls complete it; ``wr_complete`` checks the whole batch,
    writes it and rings the doorbell once; ``wr_abort`` discards it.
    """

    def __init__(self, creator: Any, init_attr: Any, qp_attr: QPAttr | None = None) -> None:
        super().__init__(creator, init_attr, qp_attr)
        self.comp_mask = getattr(init_attr, "comp_mask", 0)
        #: RSS indirection table (pyverbs ``QPEx.ind_table``); softverbs has
        #: no receive WQs, so it is whatever the init attr carried, normally None
        self.ind_table = getattr(init_attr, "ind_table", None)
        self.wr_id = 0
        self.wr_flags = 0
        self._batch: list[SendWR] | None = None

    def _begin(self, opcode: int) -> SendWR:
        from softverbs.enums import ibv_qp_create_send_ops_flags

        if self._batch is None:
            raise einval("wr_* called outside wr_start()/wr_complete()")
        need = _SEND_OPS_FLAG.get(opcode)
        if not self.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS or (
            need is not None and not self.send_ops_flags & need
        ):
            flag = ibv_qp_create_send_ops_flags(need).name if need else "?"
            raise einval(f"this QPEx was not created with {flag} in send_ops_flags")
        wr = SendWR.without_sges(self.wr_id, opcode, self.wr_flags)
        self._batch.append(wr)
        return wr

    def _current(self) -> SendWR:
        if not self._batch:
            raise einval("wr_set_* needs a WR started by a wr_<opcode> call")
        return self._batch[-1]

    def wr_start(self) -> None:
        self._check_open()
        self._batch = []

    def wr_abort(self) -> None:
        self._batch = None

    def wr_complete(self) -> None:
        batch = self._batch
        self._batch = None
        if batch is None:
            raise einval("wr_complete without wr_start")
        if not batch:
            return
        rt = self._ctx.runtime
        with rt.lock:
            sq = self.sq
            assert sq is not None
            try:
                if sq.capacity - sq.used < len(batch):
                    raise self._sq_full(f"wr_complete: batch of {len(batch)}")
                wqes = [self._build_send(w, i) for i, w in enumerate(batch)]
            except PyverbsRDMAError:
                self._ring(sq.pi)  # never strand WQEs deferred before the batch (seed 003)
                rt.posted()
                raise
            for w, wqe in zip(batch, wqes, strict=True):
                sq.push(wqe)
                self._unsignaled_run = 0 if wqe.signaled else self._unsignaled_run + 1
                del w
            self._ring(sq.pi)
            rt.posted()

    # builders
    def wr_send(self) -> None:
        self._begin(IBV_WR_SEND)

    def wr_send_imm(self, data: int) -> None:
        self._begin(IBV_WR_SEND_WITH_IMM).imm_data = _htobe32(data)

    def wr_send_inv(self, invalidate_rkey: int) -> None:
        self._begin(IBV_WR_SEND_WITH_INV).imm_data = invalidate_rkey

    def wr_rdma_write(self, rkey: int, remote_addr: int) -> None:
        self._begin(IBV_WR_RDMA_WRITE).set_wr_rdma(rkey, remote_addr)

    def wr_rdma_write_imm(self, rkey: int, remote_addr: int, data: int) -> None:
        wr = self._begin(IBV_WR_RDMA_WRITE_WITH_IMM)
        wr.set_wr_rdma(rkey, remote_addr)
        wr.imm_data = _htobe32(data)

    def wr_rdma_read(self, rkey: int, remote_addr: int) -> None:
        self._begin(IBV_WR_RDMA_READ).set_wr_rdma(rkey, remote_addr)

    def wr_atomic_cmp_swp(self, rkey: int, remote_addr: int, compare: int, swap: int) -> None:
        self._begin(IBV_WR_ATOMIC_CMP_AND_SWP).set_wr_atomic(rkey, remote_addr, compare, swap)

    def wr_atomic_fetch_add(self, rkey: int, remote_addr: int, add: int) -> None:
        self._begin(IBV_WR_ATOMIC_FETCH_AND_ADD).set_wr_atomic(rkey, remote_addr, add)

    def wr_local_inv(self, invalidate_rkey: int) -> None:
        self._begin(IBV_WR_LOCAL_INV).imm_data = invalidate_rkey

    def wr_atomic_write(self, rkey: int, remote_addr: int, atomic_wr: bytes) -> None:
        """``ibv_wr_atomic_write``: an IBTA 1.5 operation softverbs does not execute
        (a QPEx cannot be created with IBV_QP_EX_WITH_ATOMIC_WRITE)."""
        raise eopnotsupp("wr_atomic_write: softverbs does not execute ATOMIC WRITE")

    def wr_flush(self, rkey: int, remote_addr: int, length: int, ptype: int, level: int) -> None:
        """``ibv_wr_flush``: an IBTA 1.5 operation softverbs does not execute
        (a QPEx cannot be created with IBV_QP_EX_WITH_FLUSH)."""
        raise eopnotsupp("wr_flush: softverbs does not execute FLUSH")

    def wr_bind_mw(self, mw: MW, rkey: int, bind_info: MWBindInfo) -> None:
        wr = self._begin(IBV_WR_BIND_MW)
        wr.mw = mw
        wr.bind_info = bind_info
        wr.bind_rkey = rkey

    # setters
    def wr_set_sge(self, sge: SGE) -> None:
        self._current().sg = [sge]

    def wr_set_sge_list(self, num_sge: int, sg_list: list[SGE]) -> None:
        self._current().sg = list(sg_list[:num_sge])

    def wr_set_ud_addr(self, ah: AH, remote_qpn: int, remote_qkey: int) -> None:
        self._current().set_wr_ud(ah, remote_qpn, remote_qkey)

    def wr_set_xrc_srqn(self, remote_srqn: int) -> None:
        self._current().set_qp_type_xrc(remote_srqn)

    def wr_set_inline_data(self, addr: int, length: int) -> None:
        wr = self._current()
        wr.sg = [SGE(addr, length, 0)]
        wr.send_flags |= IBV_SEND_INLINE

    def wr_set_inline_data_list(self, num_buf: int, buf_list: list[Any]) -> None:
        wr = self._current()
        wr.sg = [SGE(b.addr, b.length, 0) for b in buf_list[:num_buf]]
        wr.send_flags |= IBV_SEND_INLINE


def _htobe32(v: int) -> int:
    v &= 0xFFFFFFFF
    return int.from_bytes(v.to_bytes(4, "big"), sys.byteorder)


def _send_ops_table() -> dict[int, int]:
    from softverbs.enums import ibv_qp_create_send_ops_flags as f

    return {
        IBV_WR_SEND: f.IBV_QP_EX_WITH_SEND,
        IBV_WR_SEND_WITH_IMM: f.IBV_QP_EX_WITH_SEND_WITH_IMM,
        IBV_WR_SEND_WITH_INV: f.IBV_QP_EX_WITH_SEND_WITH_INV,
        IBV_WR_RDMA_WRITE: f.IBV_QP_EX_WITH_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM: f.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
        IBV_WR_RDMA_READ: f.IBV_QP_EX_WITH_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP: f.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD: f.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV: f.IBV_QP_EX_WITH_LOCAL_INV,
        IBV_WR_BIND_MW: f.IBV_QP_EX_WITH_BIND_MW,
    }


_SEND_OPS_FLAG = _send_ops_table()


# --- XRC receive QPs owned by the device (seed 002) ----------------------------------


def _alloc_steps(attr: Any, attr_mask: int) -> list[tuple[records.QPAttrs, int]]:
    """Split one attribute mask into the RESET->INIT and INIT->RTR modifies."""
    steps: list[tuple[records.QPAttrs, int]] = []
    left = attr_mask & ~IBV_QP_STATE
    cur = IBV_QPS_RESET
    for new in (IBV_QPS_INIT, IBV_QPS_RTR):
        rule = qpstate.rule(IBV_QPT_XRC_RECV, cur, new)
        assert rule is not None
        mask = (attr_mask & (rule[0] | rule[1])) | IBV_QP_STATE
        qpstate.check(IBV_QPT_XRC_RECV, cur, mask, new, None)
        record = _attrs_of(attr)
        record.qp_state = new
        steps.append((record, mask))
        left &= ~mask
        cur = new
    if left:
        raise einval(
            f"xrc_rcv_qp_alloc: attributes {qpstate.mask_names(left)} belong to neither "
            "RESET->INIT nor INIT->RTR"
        )
    return steps


def xrc_rcv_qp_alloc(xrcd: XRCD, attr: Any, attr_mask: int) -> int:
    """Create an XRC receive QP owned by the device, move it RESET->INIT->RTR
    with ``attr``/``attr_mask``, and register this process with it.

    Returns the QP number to hand to the sender.  The QP lives until the last
    process registered with it unregisters -- or dies (seed 002).
    """
    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    (init, init_mask), (rtr, rtr_mask) = _alloc_steps(attr, attr_mask)
    body = records.XrcRcvAlloc(init, rtr, xrcd.dev_handle, init_mask, rtr_mask, 0)
    return xrcd.ctx.provider.call(ops.XRC_RCV_QP_ALLOC, body).qpn


def xrc_rcv_qp_register(xrcd: XRCD, qp_num: int) -> None:
    """Register this process with receive QP ``qp_num`` (once; again adds nothing).

    EINVAL if no such QP exists, it is not an XRC receive QP, or it belongs
    to another XRC domain.
    """
    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    xrcd.ctx.provider.call(ops.XRC_RCV_QP_REGISTER, records.XrcQpn(xrcd.dev_handle, qp_num))


def xrc_rcv_qp_unregister(xrcd: XRCD, qp_num: int) -> None:
    """Drop this process's registration; the last one destroys the QP."""
    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    xrcd.ctx.provider.call(ops.XRC_RCV_QP_UNREGISTER, records.XrcQpn(xrcd.dev_handle, qp_num))


def open_qp(ctx: Context, xrcd: XRCD, qp_num: int) -> Any:
    """``ibv_open_qp``: a QP object for an existing XRC receive QP of ``xrcd``."""
    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    reply = ctx.provider.call(ops.OPEN_QP, records.OpenQP(ctx.handle, xrcd.dev_handle, qp_num,
                                                      IBV_QPT_XRC_RECV))  # fmt: skip
    return QP.opened(ctx, xrcd, reply.qp, reply.qpn)
