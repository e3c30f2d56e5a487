"""Shared receive queues, basic and XRC.

An SRQ is a ring of receive WQEs (:class:`~softverbs.engine.rings.SharedRecvRing`)
that QPs -- or, for an XRC SRQ, the XRC receive QPs of its domain -- take
their receives from.  An XRC SRQ has a number (``srqn``) that senders name
and its own CQ.  Its limit event (``IBV_EVENT_SRQ_LIMIT_REACHED``) fires
once when fewer WQEs than the armed limit remain.
"""

from __future__ import annotations

from softverbs.device import records
from softverbs.device.core import (
    LIMITS,
    CtxObj,
    Host,
    Obj,
    Owner,
    Resources,
    _range,
    kind_class,
)
from softverbs.device.cq import CQObj
from softverbs.device.pd import PDObj
from softverbs.device.records import KIND_SRQ
from softverbs.device.xrc import XRCDObj
from softverbs.engine.hca import HCA
from softverbs.engine.rings import WQ_SRQ, SharedRecvRing
from softverbs.enums import (
    IBV_EVENT_SRQ_LIMIT_REACHED,
    IBV_SRQ_LIMIT,
    IBV_SRQ_MAX_WR,
    IBV_SRQT_BASIC,
    IBV_SRQT_XRC,
)
from softverbs.errors import einval, eopnotsupp


@kind_class
class SRQObj(Obj):
    KIND = KIND_SRQ
    __slots__ = ()

    engine: SharedRecvRing

    def __init__(self, owner: Owner, ctx: CtxObj, ring: SharedRecvRing) -> None:
        super().__init__(owner, ctx.device, ctx)
        self.engine = ring

    def teardown(self, hca: HCA) -> None:
        ring = self.engine
        if hca.srqs.get(ring.srqn) is ring:
            del hca.srqs[ring.srqn]
        ring.on_limit = None
        ring.owner = None

    def describe(self, entry: dict[str, object]) -> None:
        ring = self.engine
        entry.update(max_wr=ring.size, srqn=ring.srqn,
                     xrc=any(p.KIND == XRCDObj.KIND for p in self.parents))  # fmt: skip
        cq = next((p for p in self.parents if isinstance(p, CQObj)), None)
        if cq is not None:
            entry["cqn"] = cq.handle


def create_srq(host: Host, owner: Owner, req: records.CreateSRQ,
               res: Resources) -> records.CreateSRQReply:  # fmt: skip
    ctx = host.ctx(owner, req.ctx)
    dev = ctx.device
    pd = host.obj(owner, req.pd, PDObj, dev)
    if req.srq_type not in (IBV_SRQT_BASIC, IBV_SRQT_XRC):
        raise eopnotsupp(f"SRQ type {req.srq_type} is not supported")
    _range("max_wr", req.max_wr, 1, LIMITS["max_srq_wr"])
    _range("max_sge", req.max_sge, 0, LIMITS["max_srq_sge"])
    if req.limit > req.max_wr:
        raise einval(f"srq_limit {req.limit} exceeds max_wr {req.max_wr}")
    xrcd = host.opt(owner, req.xrcd, XRCDObj, dev)
    cq = host.opt(owner, req.cq, CQObj, dev)
    if req.srq_type == IBV_SRQT_XRC and (xrcd is None or cq is None):
        raise einval("an XRC SRQ needs an XRC domain and a CQ (SrqInitAttrEx.xrcd, .cq)")
    ring = res.srq
    if ring is None or ring.size != req.max_wr or ring.max_sge < req.max_sge:
        raise einval(f"create SRQ: no ring of {req.max_wr} WQEs with room for "
                     f"{req.max_sge} SGEs was passed")  # fmt: skip
    hca = dev.hca
    with host.on(dev):
        rec = host.add(SRQObj(owner, ctx, ring), (pd, xrcd, cq))
        rec.release = res.release
        ring.owner = rec
        ring.pd = pd.engine
        ring.tag = (WQ_SRQ, rec.handle)
        if req.srq_type == IBV_SRQT_XRC and xrcd is not None:
            ring.xrcd = xrcd.engine
            ring.cq = cq.engine if cq is not None else None
            ring.srqn = hca.alloc_srqn()
            hca.srqs[ring.srqn] = ring
        ring.set_limit(req.limit)
        ring.on_limit = lambda r: hca.post_event(IBV_EVENT_SRQ_LIMIT_REACHED, r)
    return records.CreateSRQReply(rec.handle, ring.srqn, req.max_wr, req.max_sge)


def modify_srq(host: Host, owner: Owner, req: records.ModifySRQ, res: Resources) -> records.Empty:
    rec = host.obj(owner, req.srq, SRQObj)
    dev = rec.device
    ring = rec.engine
    if req.mask & ~(IBV_SRQ_LIMIT | IBV_SRQ_MAX_WR):
        raise einval(f"modify SRQ: unsupported mask bits {req.mask:#x}")
    with host.on(dev):
        max_wr = ring.size
        if req.mask & IBV_SRQ_MAX_WR:
            if not dev.info.features.srq_resize:
                raise eopnotsupp("modify SRQ: this device cannot resize an SRQ")
            _range("max_wr", req.max_wr, 1, LIMITS["max_srq_wr"])
            new = res.srq
            if new is None or new.size != req.max_wr:
                raise einval(f"modify SRQ: no ring of {req.max_wr} WQEs was passed")
            pending = ring.available()
            if req.max_wr < pending:
                raise einval(f"modify SRQ: max_wr {req.max_wr} is below the {pending} "
                             "WRs posted and not yet taken")  # fmt: skip
            max_wr = req.max_wr
        if req.mask & IBV_SRQ_LIMIT and req.limit > max_wr:
            raise einval(f"srq_limit {req.limit} exceeds max_wr {max_wr}")
        if req.mask & IBV_SRQ_MAX_WR and res.srq is not None:
            ring.move_to(res.srq.slots, res.srq.hdr, req.max_wr)
            for close in rec.release:
                close()
            rec.release = res.release
        if req.mask & IBV_SRQ_LIMIT:
            ring.set_limit(req.limit)
    return records.Empty()


def query_srq(host: Host, owner: Owner, req: records.Handle,
              res: Resources) -> records.QuerySRQReply:  # fmt: skip
    ring = host.obj(owner, req.handle, SRQObj).engine
    return records.QuerySRQReply(ring.size, ring.max_sge, ring.armed_limit, 0)
