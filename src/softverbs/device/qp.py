"""Queue pairs: creating, modifying, querying, opening, and the doorbell.

A QP's engine (:class:`~softverbs.engine.qp.QPEngine`) runs its transport;
this module checks what a driver asks of it.  ``CREATE_QP`` checks the type,
the capabilities against :data:`~softverbs.device.core.LIMITS`, the objects
it names (this owner's, on this device) and the rings passed; ``MODIFY_QP``
turns the attributes its mask names into engine values (:func:`qp_values`)
and lets the engine's state table judge the transition against the QP's real
state.  Every send WQE the engine fetches is resolved here too
(:func:`_fetcher`): the AH, window, region or mkey it names by handle must be
its owner's, or the WQE completes in error.

XRC receive QPs belong to the device, not to a process: ``OPEN_QP`` and the
seed's ``XRC_RCV_QP_*`` hold one by number, and the last holder to let go
destroys it (:func:`~softverbs.device.core.xrc_release`).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from softverbs.device import records
from softverbs.device.core import (
    ALLOWED_OPCODES,
    LIMITS,
    PKEY_TABLE,
    CtxObj,
    Device,
    Host,
    Obj,
    Owner,
    Resources,
    _name,
    _range,
    kind_class,
    resolve_route,
    xrc_release,
)
from softverbs.device.cq import CQObj
from softverbs.device.mr import MkeyObj, MRObj, MWObj, mkey_configure
from softverbs.device.pd import AHObj, PDObj
from softverbs.device.records import KIND_QP
from softverbs.device.srq import SRQObj
from softverbs.device.xrc import XRCDObj
from softverbs.engine.hca import HCA, XrcDomain
from softverbs.engine.qp import QPEngine
from softverbs.engine.rings import (
    SGE,
    WQ_RQ,
    WQ_SQ,
    WR_DRIVER1,
    SendWQE,
    WorkRing,
    recv_slot_size,
    ring_slots,
    send_slot_size,
)
from softverbs.enums import (
    IBV_MTU_256,
    IBV_MTU_4096,
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_ALT_PATH,
    IBV_QP_AV,
    IBV_QP_CREATE_BLOCK_SELF_MCAST_LB,
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
    IBV_QP_RETRY_CNT,
    IBV_QP_RNR_RETRY,
    IBV_QP_RQ_PSN,
    IBV_QP_SQ_PSN,
    IBV_QP_STATE,
    IBV_QP_TIMEOUT,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_SQD,
    IBV_QPT_RAW_PACKET,
    IBV_QPT_RC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    IBV_WR_BIND_MW,
    QP_ATTR_MASK,
    ibv_qp_state,
    ibv_qp_type,
    mtu_to_bytes,
)
from softverbs.errors import PyverbsRDMAError, einval, eopnotsupp
from softverbs.wire.packet import gid_text, is_multicast_gid

#: what DOORBELL answers (nothing is sent back: the record is never packed)
_NO_REPLY = records.Empty()

# --- rules ----------------------------------------------------------------------------------


def qp_values(dev: Device, a: records.QPAttrs, mask: int) -> dict[str, Any]:
    """The attributes ``mask`` names, checked and turned into engine values."""
    v: dict[str, Any] = {}
    if mask & IBV_QP_PKEY_INDEX:
        idx = _range("pkey_index", a.pkey_index, 0, len(PKEY_TABLE) - 1)
        v["pkey_index"] = idx
        v["pkey"] = PKEY_TABLE[idx]
    if mask & IBV_QP_PORT:
        _range("port_num", a.port_num, 1, 1)
    if mask & IBV_QP_QKEY:
        v["qkey"] = a.qkey
    if mask & IBV_QP_ACCESS_FLAGS:
        v["access"] = a.qp_access_flags
    if mask & IBV_QP_AV:
        v["route"] = resolve_route(dev.hca.gids, a.ah, "QP ah_attr")
    if mask & IBV_QP_PATH_MTU:
        mtu = _range("path_mtu", a.path_mtu, IBV_MTU_256, IBV_MTU_4096)
        v["pmtu"] = min(mtu_to_bytes(mtu), dev.info.mtu)
    if mask & IBV_QP_DEST_QPN:
        v["dest_qpn"] = _range("dest_qp_num", a.dest_qp_num, 0, 0xFFFFFF)
    if mask & IBV_QP_RQ_PSN:
        v["rq_psn"] = a.rq_psn & 0xFFFFFF
    if mask & IBV_QP_SQ_PSN:
        v["sq_psn"] = a.sq_psn & 0xFFFFFF
    if mask & IBV_QP_TIMEOUT:
        v["timeout"] = _range("timeout", a.timeout, 0, 31)
    if mask & IBV_QP_RETRY_CNT:
        v["retry_cnt"] = _range("retry_cnt", a.retry_cnt, 0, 7)
    if mask & IBV_QP_RNR_RETRY:
        v["rnr_retry"] = _range("rnr_retry", a.rnr_retry, 0, 7)
    if mask & IBV_QP_MIN_RNR_TIMER:
        v["min_rnr_timer"] = _range("min_rnr_timer", a.min_rnr_timer, 0, 31)
    if mask & IBV_QP_MAX_QP_RD_ATOMIC:
        v["max_rd_atomic"] = _range("max_rd_atomic", a.max_rd_atomic, 0,
                                    LIMITS["max_qp_rd_atom"])  # fmt: skip
    if mask & IBV_QP_MAX_DEST_RD_ATOMIC:
        v["max_dest_rd_atomic"] = _range("max_dest_rd_atomic", a.max_dest_rd_atomic, 0,
                                         LIMITS["max_qp_rd_atom"])  # fmt: skip
    if mask & IBV_QP_EN_SQD_ASYNC_NOTIFY:
        v["en_sqd_async_notify"] = bool(a.en_sqd_async_notify)
    if mask & IBV_QP_ALT_PATH:
        resolve_route(dev.hca.gids, a.alt_ah, "QP alt_ah_attr")
    if mask & IBV_QP_PATH_MIG_STATE:
        _range("path_mig_state", a.path_mig_state, 0, 2)
    return v


def empty_attrs() -> records.QPAttrs:
    zero_av = records.AddressVector(bytes(16), 0, 0, 0, 0, 0, 1, 0, 0, 0, 0)
    alt = records.AddressVector(bytes(16), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return records.QPAttrs(zero_av, alt, *([0] * 24))


def inline_capacity(caps: records.QPCaps) -> int:
    """The ``max_inline_data`` a QP reports: what was asked, or the bytes its
    SGE list takes in the WQE if more -- as rxe does (the WQE holds either),
    so a QP made with max_inline_data=0 still takes small inline sends
    (librdmacm's rdma_xclient sends 16 inline bytes on such a QP).  The send
    slot (``send_slot_size``) has room for both."""
    return min(max(caps.max_inline_data, caps.max_send_sge * SGE.size), LIMITS["max_inline_data"])


@dataclass
class QPInfo:
    """What the device remembers of a QP for QUERY_QP."""

    caps: records.QPCaps
    sq_sig_all: int
    attrs: records.QPAttrs = field(default_factory=empty_attrs)


#: ``records.QPAttrs`` spells the address vectors without ``_attr``
_RECORD_NAME = {"ah_attr": "ah", "alt_ah_attr": "alt_ah"}
#: the ``ibv_qp_attr`` fields ``IBV_QP_ALT_PATH`` sets together (ibv_modify_qp(3)); a
#: group, so not in ``QP_ATTR_MASK``, which lists the bits that name one field
_ALT_PATH_ATTRS = ("alt_ah_attr", "alt_pkey_index", "alt_port_num", "alt_timeout")
#: mask bit -> the QPAttrs fields a modify sets (what QUERY_QP reports back), from
#: ``enums.QP_ATTR_MASK`` and the alternate-path group.  The state bits are left out:
#: QUERY_QP reports the engine's own state, not the last one asked for.
_REMEMBERED: tuple[tuple[int, tuple[str, ...]], ...] = (
    *((bit, (_RECORD_NAME.get(name, name),)) for name, bit in QP_ATTR_MASK.items()
      if bit not in (IBV_QP_STATE, IBV_QP_CUR_STATE)),
    (IBV_QP_ALT_PATH, tuple(_RECORD_NAME.get(n, n) for n in _ALT_PATH_ATTRS)),
)  # fmt: skip

#: The send_ops_flags a QP may be created with: every opcode softverbs executes
#: (ibv_qp_create_send_ops_flags: SEND .. BIND_MW, LOCAL_INV).
SUPPORTED_SEND_OPS = 0x3FF


# --- the QP's record ------------------------------------------------------------------------


@kind_class
class QPObj(Obj):
    """A QP handle.  ``info`` is what QUERY_QP reports beyond the engine's
    state; an opened XRC receive QP (``OPEN_QP``) has none of its own."""

    KIND = KIND_QP
    __slots__ = ("info",)

    engine: QPEngine

    def __init__(self, owner: Owner, ctx: CtxObj, eng: QPEngine, info: QPInfo | None) -> None:
        super().__init__(owner, ctx.device, ctx)
        self.engine = eng
        self.info = info

    def teardown(self, hca: HCA) -> None:
        eng = self.engine
        if eng.qp_type == IBV_QPT_XRC_RECV and eng.qpn in hca.xrc_refs:
            xrc_release(hca, eng, self)
        else:
            hca.detach_all(eng)
            eng.reset(clean_cqs=False)  # its CQEs stay to be polled (engine/qp.py)
            hca.qps.pop(eng.qpn, None)
        if eng.owner is self:
            eng.owner = None

    def describe(self, entry: dict[str, object]) -> None:
        eng = self.engine
        entry.update(qpn=eng.qpn, type=_name(ibv_qp_type, eng.qp_type).replace("IBV_QPT_", ""),
                     state=_name(ibv_qp_state, eng.state).replace("IBV_QPS_", ""))  # fmt: skip
        # the PSNs the QP is at: the next it sends and the next it expects
        entry.update(rqpn=eng.dest_qpn, sq_psn=eng.req.npsn, rq_psn=eng.resp.epsn,
                     port=eng.port, counters=eng.qp_counters())  # fmt: skip


# --- operations -----------------------------------------------------------------------------


def create_qp(host: Host, owner: Owner, req: records.CreateQP,
              res: Resources) -> records.CreateQPReply:  # fmt: skip
    ctx = host.ctx(owner, req.ctx)
    dev = ctx.device
    qp_type = req.qp_type
    if qp_type == IBV_QPT_RAW_PACKET:
        raise eopnotsupp("raw packet QPs are not supported by softverbs")
    if qp_type not in ALLOWED_OPCODES:
        raise einval(f"unknown QP type {qp_type}")
    tname = _name(ibv_qp_type, qp_type)
    if req.send_ops_flags & ~SUPPORTED_SEND_OPS:
        raise eopnotsupp(
            f"Failed to create QP: send_ops_flags {req.send_ops_flags & ~SUPPORTED_SEND_OPS:#x}"
            " are not supported; softverbs has no TSO and none of IBTA 1.5's memory "
            "placement operations (FLUSH, ATOMIC WRITE)"
        )
    if req.dv_flags & ~records.DV_SIG_PIPELINING:
        raise eopnotsupp(f"Failed to create QP: provider create flags "
                         f"{req.dv_flags & ~records.DV_SIG_PIPELINING:#x} are not offered "
                         "(softverbs: MLX5DV_QP_CREATE_SIG_PIPELINING)")  # fmt: skip
    if req.dv_flags and qp_type != IBV_QPT_RC:
        raise eopnotsupp("Failed to create QP: signature pipelining is for RC QPs")
    pd = host.opt(owner, req.pd, PDObj, dev)
    xrcd = host.opt(owner, req.xrcd, XRCDObj, dev)
    scq = host.opt(owner, req.send_cq, CQObj, dev)
    rcq = host.opt(owner, req.recv_cq, CQObj, dev)
    srq = host.opt(owner, req.srq, SRQObj, dev)
    xrc = qp_type in (IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV)
    if qp_type == IBV_QPT_XRC_RECV:
        if xrcd is None:
            raise einval("an XRC receive QP needs an XRC domain (QPInitAttrEx(xrcd=...))")
    elif pd is None:
        raise einval(f"a {tname} QP needs a PD (QPInitAttrEx(pd=...))")
    if qp_type != IBV_QPT_XRC_RECV and scq is None:
        raise einval(f"a {tname} QP needs a send CQ")
    if not xrc and rcq is None:
        raise einval(f"a {tname} QP needs a receive CQ")
    if srq is not None and xrc:
        raise einval(f"a {tname} QP cannot use an SRQ")
    caps = req.caps
    for name, value, hi in (
        ("max_send_wr", caps.max_send_wr, LIMITS["max_qp_wr"]),
        ("max_recv_wr", caps.max_recv_wr, LIMITS["max_qp_wr"]),
        ("max_send_sge", caps.max_send_sge, LIMITS["max_sge"]),
        ("max_recv_sge", caps.max_recv_sge, LIMITS["max_sge"]),
        ("max_inline_data", caps.max_inline_data, LIMITS["max_inline_data"]),
    ):
        if value > hi:
            raise einval(f"cap.{name}={value!r} exceeds the device limit {hi}")
    has_sq = qp_type != IBV_QPT_XRC_RECV
    has_rq = not xrc and srq is None
    sq, rq = res.sq, res.rq
    _check_ring(sq, has_sq, "send", ring_slots(caps.max_send_wr),
                send_slot_size(caps.max_send_sge, caps.max_inline_data), req.sq_slot)
    _check_ring(rq, has_rq, "receive", ring_slots(caps.max_recv_wr),
                recv_slot_size(caps.max_recv_sge), req.rq_slot)
    hca = dev.hca
    with host.on(dev):
        qpn = hca.alloc_qpn(xrc_recv=qp_type == IBV_QPT_XRC_RECV)
        pmtu = dev.info.mtu if qp_type == IBV_QPT_UD else min(1024, dev.info.mtu)
        eng = QPEngine(hca, qpn, qp_type, pd.engine if pd else None,
                       scq.engine if scq else None, rcq.engine if rcq else None, sq, rq,
                       srq.engine if srq else None, bool(req.sq_sig_all))  # fmt: skip
        eng.xrcd = xrcd.engine if xrcd is not None else None
        eng.set_attrs({"pmtu": pmtu})
        eng.sig_pipelining = bool(req.dv_flags & records.DV_SIG_PIPELINING)
        eng.block_self_mcast_lb = bool(req.create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB)
        info = QPInfo(records.QPCaps(caps.max_send_wr, caps.max_recv_wr, caps.max_send_sge,
                                     caps.max_recv_sge,
                                     inline_capacity(caps) if has_sq else 0, 0),
                      req.sq_sig_all)  # fmt: skip
        rec = host.add(QPObj(owner, ctx, eng, info), (pd, scq, rcq, srq, xrcd))
        rec.release = res.release
        eng.owner = rec
        hca.qps[qpn] = eng
        if sq is not None:
            sq.tag = (WQ_SQ, rec.handle)
            sq.fetch = _fetcher(host, owner, dev, eng)
            sq.publish_state(eng.state)
        if rq is not None:
            rq.tag = (WQ_RQ, rec.handle)
        if qp_type == IBV_QPT_XRC_RECV:  # the device owns it; this handle holds it
            hca.xrc_refs.setdefault(qpn, set()).add(rec)
    return records.CreateQPReply(info.caps, rec.handle, qpn)


def _check_ring(ring: WorkRing | None, wanted: bool, what: str, size: int, least: int,
                slot: int) -> None:  # fmt: skip
    if not wanted:
        if ring is not None:
            raise einval(f"create QP: this QP has no {what} queue, but a ring was passed")
        return
    if ring is None:
        raise einval(f"create QP: no {what} queue ring was passed")
    if ring.size != size:
        raise einval(f"create QP: the {what} queue ring has {ring.size} slots, not {size}")
    if slot and slot < least:
        raise einval(f"create QP: {what} queue slots of {slot} bytes are smaller than the "
                     f"{least} the capabilities need")  # fmt: skip


def _fetcher(host: Host, owner: Owner, dev: Device,
             eng: QPEngine) -> Callable[[SendWQE], str | None]:  # fmt: skip
    """What the device does with each send WQE it fetches: resolve the
    handles it names -- as this owner's objects, on this device -- or say
    why it cannot run."""
    handles = host.handles
    qp_type = eng.qp_type
    pd = eng.pd
    allowed = ALLOWED_OPCODES.get(qp_type, frozenset())
    # The opcodes that name no handle on this QP type: a WQE of one of them
    # (a SEND, a WRITE, ... on a connected QP) needs nothing resolved, which
    # one set lookup per fetched WQE tells.
    plain = (frozenset() if qp_type == IBV_QPT_UD
             else allowed - {IBV_WR_BIND_MW, WR_DRIVER1})  # fmt: skip

    def fetch(wqe: SendWQE) -> str | None:
        if wqe.opcode in plain:
            return None
        if wqe.opcode == WR_DRIVER1:
            if qp_type != IBV_QPT_RC:
                return "a provider (driver) WQE runs on RC QPs only"
        elif wqe.opcode not in allowed:
            return f"opcode {wqe.opcode} is not executed on {_name(ibv_qp_type, qp_type)} QPs"
        if qp_type == IBV_QPT_UD:
            ah = handles.get(wqe.ah)
            if not isinstance(ah, AHObj) or ah.owner is not owner or ah.device is not dev:
                return f"address handle {wqe.ah} is not one of this process's on {dev.name}"
            wqe.route = ah.engine
        if wqe.opcode == IBV_WR_BIND_MW:
            mw, mr = handles.get(wqe.bind_mw), handles.get(wqe.bind_mr)
            if (not isinstance(mw, MWObj) or mw.owner is not owner
                    or not isinstance(mr, MRObj) or mr.owner is not owner):  # fmt: skip
                return "the bind names a window or region this process does not have"
            wqe.bind = (mw.engine, mr.engine, wqe.bind_rkey, wqe.bind_addr,
                        wqe.bind_length, wqe.bind_access)  # fmt: skip
        if wqe.opcode == WR_DRIVER1 and wqe.local_op is None:
            # A driver WQE names the object it acts on by handle: an mkey,
            # with its configuration in the WQE's inline data.
            op = handles.get(wqe.driver_op)
            if not isinstance(op, MkeyObj) or op.owner is not owner:
                return f"driver WQE: mkey {wqe.driver_op} is not one of this process's"
            try:
                wqe.local_op = mkey_configure(op.engine, pd, wqe.inline or b"")
            except ValueError as exc:
                return f"driver WQE: {exc}"
        return None

    return fetch


def modify_qp(host: Host, owner: Owner, req: records.ModifyQP,
              res: Resources) -> records.ModifyQPReply:  # fmt: skip
    rec = host.obj(owner, req.qp, QPObj)
    dev = rec.device
    eng = rec.engine
    mask = req.mask
    a = req.attr
    new = a.qp_state if mask & IBV_QP_STATE else None
    if new is not None and new not in ibv_qp_state._value2member_map_:
        raise einval(f"qp_state {new} is not a QP state")
    cur = a.cur_qp_state if mask & IBV_QP_CUR_STATE else None
    if new == IBV_QPS_RESET and host.sanitizer is not None:
        host.sanitizer.leaving(rec, "moved to IBV_QPS_RESET")
    with host.on(dev):
        state = eng.modify(mask, new, cur, lambda: qp_values(dev, a, mask),
                           dev.runtime.clock.now())  # fmt: skip
        _remember(rec, a, mask)
    return records.ModifyQPReply(state, 0)


def _remember(rec: QPObj, a: records.QPAttrs, mask: int) -> None:
    info = rec.info
    if info is None:
        return
    for bit, names in _REMEMBERED:
        if mask & bit:
            for n in names:
                setattr(info.attrs, n, getattr(a, n))


def query_qp(host: Host, owner: Owner, req: records.Handle, res: Resources) -> records.QueryQPReply:
    rec = host.obj(owner, req.handle, QPObj)
    dev = rec.device
    eng = rec.engine
    info = rec.info or QPInfo(records.QPCaps(0, 0, 0, 0, 0, 0), 0)
    with dev.runtime.lock:
        attrs = records.QPAttrs.unpack(info.attrs.pack())
        attrs.qp_state = attrs.cur_qp_state = eng.state
        attrs.sq_draining = int(eng.sq_draining())
    return records.QueryQPReply(attrs, info.caps, eng.state, info.sq_sig_all)


def _mcast(host: Host, owner: Owner, req: records.Mcast,
           verb: str) -> tuple[Device, QPEngine, bytes]:  # fmt: skip
    """The QP and group of an attach or detach, checked as the kernel's
    ``ib_attach_mcast`` checks them (EINVAL)."""
    rec = host.obj(owner, req.qp, QPObj)
    dev = rec.device
    eng = rec.engine
    mgid = bytes(req.gid)
    if eng.qp_type != IBV_QPT_UD:
        raise einval(f"{verb}: QP {eng.qpn:#x} is {_name(ibv_qp_type, eng.qp_type)}; only UD "
                     "QPs are members of multicast groups")  # fmt: skip
    if not is_multicast_gid(mgid):
        raise einval(f"{verb}: {gid_text(mgid)} is not a multicast GID (ff00::/8, or an "
                     "IPv4-mapped 224.0.0.0/4 address)")  # fmt: skip
    return dev, eng, mgid


def attach_mcast(host: Host, owner: Owner, req: records.Mcast, res: Resources) -> records.Empty:
    dev, eng, mgid = _mcast(host, owner, req, "ibv_attach_mcast")
    with host.on(dev):
        err = dev.hca.attach_mcast(eng, mgid)
    if err is not None:
        raise PyverbsRDMAError(f"ibv_attach_mcast: {err}", errno.ENOMEM)
    return records.Empty()


def detach_mcast(host: Host, owner: Owner, req: records.Mcast, res: Resources) -> records.Empty:
    dev, eng, mgid = _mcast(host, owner, req, "ibv_detach_mcast")
    with host.on(dev):
        if not dev.hca.detach_mcast(eng, mgid):
            raise einval(f"ibv_detach_mcast: QP {eng.qpn:#x} is not attached to "
                         f"{gid_text(mgid)}")  # fmt: skip
    return records.Empty()


def doorbell(host: Host, owner: Owner, req: records.Doorbell, res: Resources) -> records.Empty:
    dev = ring_deferred(host, owner, req.qp, req.queue)
    with dev.runtime.lock:
        dev.runtime.progress()
    return _NO_REPLY


def send_queue_header(host: Host, owner: Owner, handle: int) -> memoryview | None:
    """The header words of QP ``handle``'s send queue (``PI``, ``DB``, ``STATE``
    and the ``polled`` word of doorbell suppression, docs/rings.md); None for
    a QP without one.  In the service they are shared with the client."""
    sq = host.obj(owner, handle, QPObj).engine.sq
    return None if sq is None else sq.hdr


def send_queues(owner: Owner) -> list[tuple[int, QPObj]]:
    """Every QP of ``owner``'s with a send queue: its handle and its record; the
    service reads their ``db`` words when a client's doorbell eventfd is
    written (service/server.py ``_Bell``)."""
    return [(handle, obj) for handle, obj in list(owner.objects.items())
            if isinstance(obj, QPObj) and obj.engine.sq is not None]  # fmt: skip


def ring_deferred(host: Host, owner: Owner, qp: int, queue: int) -> Device:
    """DOORBELL (of QP handle ``qp``) without running the engine: the device
    whose engine must run next.  The service rings every doorbell it has read
    in a turn first and runs each device's engine once after them
    (service/server.py ``_turn``); the caller holds ``host.lock``."""
    rec = host.obj(owner, qp, QPObj)
    dev = rec.device
    with dev.runtime.lock:
        ring_doorbell(rec.engine, queue, dev.runtime.clock.now())
    return dev


def cancel_send(host: Host, owner: Owner, req: records.CancelSend, res: Resources) -> records.Count:
    rec = host.obj(owner, req.qp, QPObj)
    eng = rec.engine
    with host.on(rec.device):
        if not eng.sig_pipelining or eng.state != IBV_QPS_SQD:
            raise einval("cancel_posted_send_wrs: the QP must be a SIG_PIPELINING QP in SQD")
        return records.Count(eng.cancel_posted(req.wr_id), 0)


def ring_doorbell(eng: QPEngine, queue: int, now: float) -> None:
    """The application moved the doorbell index of one of ``eng``'s queues."""
    if queue == records.DB_SQ:
        if eng.sq is not None:
            eng.doorbell(now)
    elif queue == records.DB_RQ:
        eng.rq_doorbell(now)
    else:
        raise einval(f"doorbell: queue {queue} is neither the send (1) nor the receive (2) queue")


# --- XRC receive QPs ----------------------------------------------------------------------


def open_qp(host: Host, owner: Owner, req: records.OpenQP, res: Resources) -> records.OpenQPReply:
    ctx = host.ctx(owner, req.ctx)
    dev = ctx.device
    xrcd = host.obj(owner, req.xrcd, XRCDObj, dev)
    if req.qp_type != IBV_QPT_XRC_RECV:
        raise einval("ibv_open_qp opens XRC receive QPs only")
    with host.on(dev):
        eng = _xrc_lookup(dev, xrcd.engine, req.qpn)
        rec = host.add(QPObj(owner, ctx, eng, None), (xrcd,))
        dev.hca.xrc_refs.setdefault(eng.qpn, set()).add(rec)
    return records.OpenQPReply(rec.handle, eng.qpn, eng.state, 0)


def _xrc_lookup(dev: Device, domain: XrcDomain, qpn: int) -> QPEngine:
    hca = dev.hca
    eng = hca.qps.get(qpn)
    if eng is None or not isinstance(eng, QPEngine):
        raise einval(f"QP {qpn:#x} does not exist")
    if eng.qp_type != IBV_QPT_XRC_RECV or qpn not in hca.xrc_refs:
        raise einval(f"QP {qpn:#x} is not an XRC receive QP")
    if eng.xrcd is not domain:
        raise einval(f"XRC receive QP {qpn:#x} belongs to another XRC domain")
    return eng


def xrc_rcv_qp_alloc(host: Host, owner: Owner, req: records.XrcRcvAlloc,
                     res: Resources) -> records.QpnReply:  # fmt: skip
    """Create a receive QP in the domain, move it RESET->INIT->RTR and
    register the caller -- atomically, as ``ibv_xrc_rcv_qp_alloc``."""
    xrcd = host.obj(owner, req.xrcd, XRCDObj)
    dev = xrcd.device
    if req.init.qp_state != IBV_QPS_INIT or req.rtr.qp_state != IBV_QPS_RTR:
        raise einval("xrc_rcv_qp_alloc: the steps must be RESET->INIT and INIT->RTR")
    hca = dev.hca
    with host.on(dev):
        eng = QPEngine(hca, hca.alloc_qpn(xrc_recv=True), IBV_QPT_XRC_RECV, None, None,
                       None, None, None, None, False)  # fmt: skip
        eng.xrcd = xrcd.engine
        eng.set_attrs({"pmtu": min(1024, dev.info.mtu)})
        hca.qps[eng.qpn] = eng
        try:
            for attrs, mask in ((req.init, req.init_mask), (req.rtr, req.rtr_mask)):
                eng.modify(mask, attrs.qp_state, None,
                           lambda a=attrs, m=mask: qp_values(dev, a, m),  # type: ignore[misc]
                           dev.runtime.clock.now())  # fmt: skip
        except Exception:
            eng.reset()
            hca.qps.pop(eng.qpn, None)
            raise
        hca.xrc_refs.setdefault(eng.qpn, set()).add(owner)
    return records.QpnReply(eng.qpn, 0)


def xrc_rcv_qp_register(host: Host, owner: Owner, req: records.XrcQpn,
                        res: Resources) -> records.Empty:  # fmt: skip
    """Once per process; registering again adds no reference."""
    xrcd = host.obj(owner, req.xrcd, XRCDObj)
    dev = xrcd.device
    with host.on(dev):
        eng = _xrc_lookup(dev, xrcd.engine, req.qpn)
        dev.hca.xrc_refs.setdefault(eng.qpn, set()).add(owner)
    return records.Empty()


def xrc_rcv_qp_unregister(host: Host, owner: Owner, req: records.XrcQpn,
                          res: Resources) -> records.Empty:  # fmt: skip
    """The last registration destroys the QP."""
    xrcd = host.obj(owner, req.xrcd, XRCDObj)
    dev = xrcd.device
    with host.on(dev):
        eng = _xrc_lookup(dev, xrcd.engine, req.qpn)
        xrc_release(dev.hca, eng, owner)
    return records.Empty()
