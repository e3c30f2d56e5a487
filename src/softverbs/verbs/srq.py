"""Shared receive queues (pyverbs ``srq``).

An SRQ is a pool of receive WQEs that any attached QP may take.  When the
number of WQEs left drops below an armed ``srq_limit``, the device posts
``IBV_EVENT_SRQ_LIMIT_REACHED`` once and disarms (IBA 10.2.9.5).  A QP that
moves to ERR flushes only the WQE it had taken and not completed; the SRQ's
other WQEs stay for the other QPs.
"""

from __future__ import annotations

import errno
from typing import Any

from softverbs.device import ops, records
from softverbs.engine.rings import WQ_SRQ, SharedRecvRing
from softverbs.enums import (
    IBV_OPS_SIGNALED,
    IBV_SRQ_LIMIT,
    IBV_SRQ_MAX_WR,
    IBV_SRQT_BASIC,
    IBV_SRQT_XRC,
    IBV_WR_TAG_ADD,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError, einval, enomem, eopnotsupp
from softverbs.verbs.base import CStruct, PyverbsCM, PyverbsObject, as_uint, require
from softverbs.verbs.cq import CQBase
from softverbs.verbs.device import LIMITS, Context
from softverbs.verbs.pd import PD
from softverbs.verbs.provider import Attach, check_post, destroy
from softverbs.verbs.wr import RecvWR, copy_wr, recv_wqe
from softverbs.verbs.xrcd import XRCD


class SrqAttr(CStruct, PyverbsObject):
    """``ibv_srq_attr``."""

    _c_fields = {"max_wr": 32, "max_sge": 32, "srq_limit": 32}

    def __init__(self, max_wr: int = 100, max_sge: int = 1, srq_limit: int = 0) -> None:
        super().__init__()
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.srq_limit = srq_limit


class SrqInitAttr(PyverbsObject):
    """``ibv_srq_init_attr``: ``SrqInitAttr(SrqAttr(...))``."""

    def __init__(self, attr: SrqAttr | None = None) -> None:
        super().__init__()
        require(attr, SrqAttr, "attr", optional=True)
        self.attr = attr if attr is not None else SrqAttr()

    @property
    def max_wr(self) -> int:
        return self.attr.max_wr

    @property
    def max_sge(self) -> int:
        return self.attr.max_sge

    @property
    def srq_limit(self) -> int:
        return self.attr.srq_limit


class SrqInitAttrEx(CStruct, PyverbsObject):
    """``ibv_srq_init_attr_ex``: basic or XRC SRQs created from a Context."""

    _c_fields = {"max_wr": 32, "max_sge": 32, "srq_limit": 32, "comp_mask": 32,
                 "srq_type": 32, "max_num_tags": 32, "max_ops": 32}  # fmt: skip

    def __init__(self, max_wr: int = 100, max_sge: int = 1, srq_limit: int = 0) -> None:
        super().__init__()
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.srq_limit = srq_limit
        self.comp_mask = 0
        self.srq_type = IBV_SRQT_BASIC
        self.pd: PD | None = None
        self.xrcd: Any = None
        self.cq: Any = None
        self.max_num_tags = 0
        self.max_ops = 0


class OpsWr(CStruct, PyverbsCM):
    """``ibv_ops_wr``: a tag-matching list operation for ``SRQ.post_srq_ops``."""

    _c_fields = {"wr_id": 64, "opcode": 32, "flags": 32, "unexpected_cnt": 32,
                 "recv_wr_id": 64, "num_sge": 32, "tag": 64, "mask": 64}  # fmt: skip

    def __init__(self, wr_id: int = 0, opcode: int = IBV_WR_TAG_ADD, flags: int = IBV_OPS_SIGNALED,
                 next_wr: OpsWr | None = None, unexpected_cnt: int = 0, recv_wr_id: int = 0,
                 num_sge: int | None = None, tag: int = 0, mask: int = 0,
                 sg_list: list[Any] | None = None) -> None:  # fmt: skip
        super().__init__()
        require(next_wr, OpsWr, "next_wr", optional=True)
        if sg_list is not None and not isinstance(sg_list, (list, tuple)):
            raise PyverbsUserError(f"sg_list must be a list of SGEs, got {type(sg_list).__name__}")
        self.wr_id = wr_id
        self.opcode = opcode
        self.flags = flags
        self.next_wr = next_wr
        self.unexpected_cnt = unexpected_cnt
        self.recv_wr_id = recv_wr_id
        self.num_sge = num_sge if num_sge is not None else len(sg_list or [])
        self.tag = tag
        self.mask = mask
        self.sg_list = list(sg_list or [])
        self.handle = 0


class SRQ(PyverbsCM):
    """A shared receive queue: ``SRQ(pd, SrqInitAttr)`` or ``SRQ(ctx, SrqInitAttrEx)``."""

    close_rank = 50

    def __init__(self, creator: Any, attr: Any) -> None:
        super().__init__()
        if isinstance(creator, PD):
            require(attr, SrqInitAttr, "attr")
            if not isinstance(attr.attr, SrqAttr):
                raise PyverbsUserError(f"SrqInitAttr.attr must be a SrqAttr, got "
                                       f"{type(attr.attr).__name__}")  # fmt: skip
            pd: PD | None = creator
            ctx: Context = creator.ctx
            srq_type = IBV_SRQT_BASIC
            xrcd = None
            cq = None
        elif isinstance(creator, Context):
            require(attr, SrqInitAttrEx, "attr")
            ctx = creator
            pd = attr.pd
            srq_type = attr.srq_type
            xrcd = attr.xrcd
            cq = attr.cq
            if srq_type not in (IBV_SRQT_BASIC, IBV_SRQT_XRC):
                raise eopnotsupp(f"SRQ type {srq_type} is not supported")
            if pd is None:
                raise einval("an SRQ needs a PD (SrqInitAttrEx.pd)")
            require(pd, PD, "SrqInitAttrEx.pd")
            require(xrcd, XRCD, "SrqInitAttrEx.xrcd", optional=True)
            if srq_type == IBV_SRQT_XRC and (xrcd is None or cq is None):
                raise einval("an XRC SRQ needs an XRC domain and a CQ (SrqInitAttrEx.xrcd, .cq)")
            require(cq, CQBase, "cq", optional=True)
        else:
            raise PyverbsUserError("SRQ needs either a Context or a PD for creation")
        ctx._check_open()
        max_wr, max_sge, limit = attr.max_wr, attr.max_sge, attr.srq_limit
        if not 1 <= max_wr <= LIMITS["max_srq_wr"]:
            raise einval(f"max_wr {max_wr} is out of range 1..{LIMITS['max_srq_wr']}")
        if not 0 <= max_sge <= LIMITS["max_srq_sge"]:
            raise einval(f"max_sge {max_sge} is out of range 0..{LIMITS['max_srq_sge']}")
        if limit > max_wr:
            raise einval(f"srq_limit {limit} exceeds max_wr {max_wr}")
        self._ctx = ctx
        self.context = ctx
        self.pd = pd
        self.cq = cq
        self.xrcd = xrcd
        self.srq_type = srq_type
        provider = ctx.provider
        self.ring: SharedRecvRing = provider.srq_ring(max_wr, max_sge)
        body = records.CreateSRQ(
            ctx.handle, pd.device_pd if pd is not None else 0, srq_type, max_wr, max_sge, limit,
            xrcd.dev_handle if srq_type == IBV_SRQT_XRC and xrcd is not None else 0,
            cq.dev_handle if cq is not None else 0, 0, 0,
        )  # fmt: skip
        try:
            reply = provider.call(ops.CREATE_SRQ, body, Attach(srq=self.ring))
        except BaseException:
            provider.free_ring(self.ring)
            raise
        self.dev_handle: int = reply.srq
        self.ring.srqn = reply.srqn
        ctx.register(self, self.dev_handle)
        ctx.device.rings[(WQ_SRQ, self.dev_handle)] = self.ring
        for parent in (pd, cq, xrcd):
            if parent is not None:
                parent.add_ref(self)

    def get_srq_num(self) -> int:
        if self.srq_type != IBV_SRQT_XRC:
            raise einval("only XRC SRQs have an SRQ number")
        return self.ring.srqn

    def post_recv(self, wr: RecvWR, bad_wr: RecvWR | None = None) -> None:
        self._check_open()
        check_post(self._ctx.provider, "post_srq_recv", RecvWR, wr, bad_wr)
        ring = self.ring
        with self._ctx.lock:
            w: RecvWR | None = wr
            n = 0
            try:
                while w is not None:
                    if ring.outstanding >= ring.max_wr:
                        raise enomem(
                            f"post_srq_recv: WR #{n} (wr_id={w.wr_id}): the SRQ is full: "
                            f"{ring.outstanding} of {ring.max_wr} WRs are posted or taken and "
                            "not yet polled"
                        )
                    ring.post(recv_wqe(w, ring.max_sge, n, "post_srq_recv"))
                    w = w.next_wr
                    n += 1
            except PyverbsRDMAError:
                if bad_wr is not None and w is not None:
                    copy_wr(w, bad_wr)  # ibv_post_srq_recv's bad_wr
                raise
            finally:
                self._ctx.runtime.posted()

    def post_srq_ops(self, wr: OpsWr, bad_wr: OpsWr | None = None) -> None:
        """``ibv_post_srq_ops``: tag-matching SRQs only, which softverbs has not."""
        self._check_open()
        require(wr, OpsWr, "wr")
        raise PyverbsRDMAError("post SRQ ops failed: softverbs has no tag-matching SRQs "
                               "(tm_caps are 0)", errno.EOPNOTSUPP)  # fmt: skip

    def modify(self, attr: SrqAttr, comp_mask: int) -> None:
        """``ibv_modify_srq``: arm the limit event and/or resize."""
        self._check_open()
        require(attr, SrqAttr, "attr")
        comp_mask = as_uint(comp_mask, 32, "comp_mask")
        ring = self.ring
        with self._ctx.lock:
            if comp_mask & ~(IBV_SRQ_LIMIT | IBV_SRQ_MAX_WR):
                raise einval(f"modify SRQ: unsupported mask bits {comp_mask:#x}")
            if comp_mask & IBV_SRQ_MAX_WR and attr.max_wr < ring.outstanding:
                raise einval(
                    f"modify SRQ: max_wr {attr.max_wr} is below the {ring.outstanding} "
                    "WRs outstanding"
                )
            limit = None
            if comp_mask & IBV_SRQ_LIMIT:
                max_wr = attr.max_wr if comp_mask & IBV_SRQ_MAX_WR else ring.max_wr
                if attr.srq_limit > max_wr:
                    raise einval(f"srq_limit {attr.srq_limit} exceeds max_wr {max_wr}")
                limit = attr.srq_limit
            provider = self._ctx.provider
            new = provider.srq_ring(attr.max_wr, ring.max_sge) if comp_mask & IBV_SRQ_MAX_WR \
                else None  # fmt: skip
            body = records.ModifySRQ(self.dev_handle, comp_mask, attr.max_wr if new else 0,
                                 limit if limit is not None else 0)  # fmt: skip
            try:
                provider.call(ops.MODIFY_SRQ, body, Attach(srq=new))
            except BaseException:
                if new is not None:
                    provider.free_ring(new)
                raise
            if new is not None:
                provider.adopt_srq(ring, new)

    def query(self) -> SrqAttr:
        self._check_open()
        return SrqAttr(self.ring.max_wr, self.ring.max_sge, self.ring.armed_limit)

    def _release(self) -> None:
        provider = self._ctx.provider
        destroy(provider, records.KIND_SRQ, self.dev_handle)
        self._ctx.device.rings.pop((WQ_SRQ, self.dev_handle), None)
        provider.free_ring(self.ring)
