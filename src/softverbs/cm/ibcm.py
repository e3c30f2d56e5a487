"""ib_cm: the IBTA CM protocol of the CM agent -- MADs, timers, connection states.

:class:`IbCm` is the half of :class:`~softverbs.cm.agent.CmAgent` that the
kernel's ``ib_cm`` module is: it builds and parses the CM MADs
(:mod:`softverbs.cm.mad`: REQ, REP, RTU, REJ, MRA, DREQ, DREP, SIDR_REQ,
SIDR_REP), queues them for QP1 (:mod:`softverbs.cm.gsi`), retransmits them
on its timers and moves each connection through :data:`CM_TRANSITIONS`.
It is QP1's sink: received MADs and timer expiries arrive here.  Each received
message goes through one dispatch step, driven by its row of ``_RX``: find the ID
it names (or the one an earlier copy opened), count and answer a repeat, check
that the ID's state takes it (its ``rx_<name>`` transition), and only then run
the message's own ``_take_<name>``; what fails a check is counted
(``cm_drop_unknown_<name>``, ``cm_duplicate_<name>``, ``cm_drop_unexpected_<name>``).

What ib_cm hands up to rdma_cm -- a request for a listener, a new ID for a
request, an event for the user, an rdma_cm state change -- it asks of its
owner (``self.rdma``, the kernel's ``cm_id->cm_handler``); rdma_cm asks it to
send, cancel and forget.  Both halves share the owner's lock and each
:class:`~softverbs.cm.agent.CmId`, as the kernel's ``rdma_id_private``
points at its ``cm_id_private``.  Retransmission and MRA policy: see
:mod:`softverbs.cm.agent`.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from softverbs.cm import mad
from softverbs.cm.gsi import GsiQP
from softverbs.cm.ids import (
    CM_RESPONSE_TIMEOUT,
    LOCAL_CA_ACK_DELAY,
    MAX_CM_RETRIES,
    MAX_INITIATOR,
    MAX_RESPONDER,
    MRA_SERVICE_TIMEOUT,
    RDMA_UDP_QKEY,
    CmId,
    DeviceCtx,
    Path,
)
from softverbs.cm.route import cm_error
from softverbs.cm.states import CM_TRANSITIONS, C, RdmaState
from softverbs.engine.rings import Route
from softverbs.enums import (
    IBV_QPT_RC,
    IBV_QPT_UD,
    RDMA_CM_EVENT_ADDR_ERROR,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_CONNECT_RESPONSE,
    RDMA_CM_EVENT_DISCONNECTED,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_REJECTED,
    RDMA_CM_EVENT_TIMEWAIT_EXIT,
    RDMA_CM_EVENT_UNREACHABLE,
)
from softverbs.errors import PyverbsRDMAError

if TYPE_CHECKING:
    from softverbs.cm.agent import CmAgent


class IbCm:
    """ib_cm for one agent (see the module docstring)."""

    def __init__(self, rdma: CmAgent, hi_tid: int) -> None:
        self.rdma = rdma
        self.lock = rdma.lock
        self.rng = rdma.rng
        self.hi_tid = hi_tid
        self.by_comm: dict[int, CmId] = {}
        self.by_remote: dict[tuple[int, int], CmId] = {}
        #: MADs queued per device, pushed into QP1 by flush or _push
        self.pending: dict[str, list[tuple[bytes, Route]]] = {}

    def reject(self, cid: CmId, data: bytes) -> None:
        """``ib_send_cm_rej`` (or a rejecting SIDR_REP) for ``rdma_reject``."""
        if cid.cm == C.SIDR_REQ_RCVD:
            self.send_sidr_rep(cid, mad.SIDR_REJECT, {"private_data": data.hex()})
        elif cid.cm in (C.REQ_RCVD, C.MRA_REQ_SENT, C.REP_RCVD, C.MRA_REP_SENT):
            if len(data) > mad.REJ_PRIVATE_DATA_SIZE:
                raise cm_error("private data longer than a REJ carries", errno.EINVAL)
            msg = mad.MSG_REQ if cid.cm in (C.REQ_RCVD, C.MRA_REQ_SENT) else mad.MSG_REP
            self.send_rej(cid, mad.REJ_CONSUMER_DEFINED, msg, data)
            self.move(cid, "tx_rej")
            self.forget_remote(cid)
        else:
            raise cm_error(f"reject: the connection is in state {cid.cm.name}", errno.EINVAL)

    def destroy(self, cid: CmId) -> None:
        """``cm_destroy_id``: tell the peer as the connection's state asks, then forget it."""
        state = cid.cm
        with contextlib.suppress(PyverbsRDMAError):
            if state in (C.REQ_SENT, C.MRA_REQ_RCVD):
                self.send_rej(cid, mad.REJ_TIMEOUT, mad.MSG_REQ)
            elif state in (C.REQ_RCVD, C.MRA_REQ_SENT, C.REP_RCVD, C.MRA_REP_SENT,
                           C.REP_SENT, C.MRA_REP_RCVD):  # fmt: skip
                msg = mad.MSG_REQ if state in (C.REQ_RCVD, C.MRA_REQ_SENT) else mad.MSG_REP
                self.send_rej(cid, mad.REJ_CONSUMER_DEFINED, msg)
            elif state == C.ESTABLISHED:
                self.send_dreq(cid)  # sent once; the ID then leaves (cm_enter_timewait)
            elif state == C.DREQ_RCVD:
                self.send_drep(cid)
            elif state == C.SIDR_REQ_RCVD:
                self.send_sidr_rep(cid, mad.SIDR_REJECT, {})
        self.cancel(cid)
        self.forget_remote(cid)
        if self.by_comm.get(cid.local_comm_id) is cid:
            del self.by_comm[cid.local_comm_id]

    def move(self, cid: CmId, action: str) -> bool:
        new = CM_TRANSITIONS.get((cid.cm, action))
        if new is None:
            return False
        cid.cm = new
        return True

    def _now(self, cid: CmId) -> float:
        ctx = self.rdma.devices.get(cid.dev or "")
        return float(ctx.runtime.clock.now()) if ctx is not None else 0.0

    def new_comm_id(self) -> int:
        while True:
            comm = self.rng.randrange(1, 1 << 32)
            if comm not in self.by_comm:
                return comm

    def _private(self, param: dict[str, Any], limit: int) -> bytes:
        data = bytes.fromhex(str(param.get("private_data", "") or ""))
        if len(data) > limit:
            raise cm_error(f"{len(data)} bytes of private data exceed the {limit} this "
                           "message carries", errno.EINVAL)  # fmt: skip
        return data

    def send_req(self, cid: CmId, param: dict[str, Any]) -> None:
        ctx = self.rdma.ctx_of(cid)
        p, src, dst = cid.path, cid.src, cid.dst
        assert p is not None and src is not None and dst is not None
        user = self._private(param, mad.REQ_PRIVATE_DATA_SIZE - mad.CMA_HEADER_SIZE)
        cma = mad.CmaHeader(src[0], dst[0], src[1]).encode()
        cid.qp_num = int(param.get("qp_num", 0))
        cid.srq = int(param.get("srq", 0))
        cid.responder_resources = int(param.get("responder_resources", 0))
        cid.initiator_depth = int(param.get("initiator_depth", 0))
        cid.retry_count = min(7, int(param.get("retry_count", 7)))
        cid.rnr_retry_count = min(7, int(param.get("rnr_retry_count", 7)))
        cid.flow_control = int(param.get("flow_control", 0))
        cid.seq_num = self.rng.randrange(1 << 24)
        cid.local_comm_id = self.new_comm_id()
        cid.tid = mad.tid_for(self.hi_tid, cid.local_comm_id)
        cid.service_id = mad.service_id(cid.ps, dst[1])
        req = mad.Req(
            tid=cid.tid, local_comm_id=cid.local_comm_id, service_id=cid.service_id,
            local_ca_guid=ctx.guid, local_qpn=cid.qp_num,
            responder_resources=cid.responder_resources, initiator_depth=cid.initiator_depth,
            remote_cm_response_timeout=CM_RESPONSE_TIMEOUT,
            transport_service_type=0, end_to_end_flow_control=cid.flow_control & 1,
            starting_psn=cid.seq_num, local_cm_response_timeout=CM_RESPONSE_TIMEOUT,
            retry_count=cid.retry_count, pkey=p.pkey, path_mtu=p.mtu,
            rnr_retry_count=cid.rnr_retry_count, max_cm_retries=MAX_CM_RETRIES,
            srq=1 if cid.srq else 0, primary_local_gid=p.sgid, primary_remote_gid=p.dgid,
            primary_flow_label=p.flow_label, primary_traffic_class=p.tclass,
            primary_hop_limit=p.hop_limit,
            primary_local_ack_timeout=mad.ack_timeout(LOCAL_CA_ACK_DELAY, p.packet_life_time),
            private_data=cma + user,
        )  # fmt: skip
        self.move(cid, "tx_req")
        self.by_comm[cid.local_comm_id] = cid
        timeout = 2 * mad.ms_of(p.packet_life_time) + mad.ms_of(CM_RESPONSE_TIMEOUT)
        self._send(cid, req, timeout, MAX_CM_RETRIES)

    def send_sidr_req(self, cid: CmId, param: dict[str, Any]) -> None:
        p, src, dst = cid.path, cid.src, cid.dst
        assert p is not None and src is not None and dst is not None
        user = self._private(param, mad.SIDR_REQ_PRIVATE_DATA_SIZE - mad.CMA_HEADER_SIZE)
        cma = mad.CmaHeader(src[0], dst[0], src[1]).encode()
        cid.qp_num = int(param.get("qp_num", 0))
        cid.local_comm_id = self.new_comm_id()
        cid.tid = mad.tid_for(self.hi_tid, cid.local_comm_id)
        cid.service_id = mad.service_id(cid.ps, dst[1])
        req = mad.SidrReq(tid=cid.tid, request_id=cid.local_comm_id, pkey=p.pkey,
                          service_id=cid.service_id, private_data=cma + user)  # fmt: skip
        self.move(cid, "tx_sidr_req")
        self.by_comm[cid.local_comm_id] = cid
        self._send(cid, req, mad.ms_of(CM_RESPONSE_TIMEOUT), MAX_CM_RETRIES)

    def send_rep(self, cid: CmId, param: dict[str, Any]) -> None:
        ctx = self.rdma.ctx_of(cid)
        user = self._private(param, mad.REP_PRIVATE_DATA_SIZE)
        if "qp_num" in param:
            cid.qp_num = int(param["qp_num"])
        cid.srq = int(param.get("srq", cid.srq))
        if "responder_resources" in param:
            cid.responder_resources = int(param["responder_resources"])
        if "initiator_depth" in param:
            cid.initiator_depth = int(param["initiator_depth"])
        rnr = min(7, int(param.get("rnr_retry_count", 7)))
        rep = mad.Rep(
            tid=cid.tid, local_comm_id=cid.local_comm_id, remote_comm_id=cid.remote_comm_id,
            local_qpn=cid.qp_num, starting_psn=cid.seq_num,
            responder_resources=cid.responder_resources, initiator_depth=cid.initiator_depth,
            target_ack_delay=LOCAL_CA_ACK_DELAY,
            end_to_end_flow_control=int(param.get("flow_control", 0)) & 1,
            rnr_retry_count=rnr, srq=1 if cid.srq else 0, local_ca_guid=ctx.guid,
            private_data=user,
        )  # fmt: skip
        self.move(cid, "tx_rep")
        self._send(cid, rep, cid.rep_timeout_ms, cid.max_cm_retries)

    def send_rtu(self, cid: CmId) -> None:
        rtu = mad.Rtu(tid=cid.tid, local_comm_id=cid.local_comm_id,
                      remote_comm_id=cid.remote_comm_id)  # fmt: skip
        self.cancel(cid)
        self.move(cid, "tx_rtu")
        self._send(cid, rtu)

    def send_sidr_rep(self, cid: CmId, status: int, param: dict[str, Any]) -> None:
        user = self._private(param, mad.SIDR_REP_PRIVATE_DATA_SIZE)
        if status == mad.SIDR_SUCCESS:
            if "qp_num" in param:
                cid.qp_num = int(param["qp_num"])
            qkey = int(param.get("qkey", 0) or 0)
            if cid.qkey and qkey and qkey != cid.qkey:
                raise cm_error(f"qkey {qkey:#x} differs from the ID's {cid.qkey:#x}",
                               errno.EINVAL)  # fmt: skip
            cid.qkey = cid.qkey or qkey or RDMA_UDP_QKEY
        rep = mad.SidrRep(tid=cid.tid, request_id=cid.remote_comm_id, sidr_status=status,
                          qpn=cid.qp_num if status == mad.SIDR_SUCCESS else 0,
                          service_id=cid.service_id,
                          qkey=cid.qkey if status == mad.SIDR_SUCCESS else 0,
                          private_data=user)  # fmt: skip
        self.move(cid, "tx_sidr_rep")
        self.forget_remote(cid)
        self._send(cid, rep)

    def send_rej(self, cid: CmId, reason: int, msg: int, data: bytes = b"") -> None:
        ari, ari_len = b"", 0
        if reason == mad.REJ_TIMEOUT:  # the ARI names us: the peer may not know our comm ID
            ari, ari_len = self.rdma.ctx_of(cid).guid.to_bytes(8, "big"), 8
        rej = mad.Rej(tid=cid.tid, local_comm_id=cid.local_comm_id,
                      remote_comm_id=cid.remote_comm_id, message_rejected=msg, reason=reason,
                      reject_info_length=ari_len, ari=ari, private_data=data)  # fmt: skip
        self.cancel(cid)
        self._send(cid, rej)

    def send_dreq(self, cid: CmId) -> None:
        dreq = mad.Dreq(tid=mad.tid_for(self.hi_tid, cid.local_comm_id),
                        local_comm_id=cid.local_comm_id, remote_comm_id=cid.remote_comm_id,
                        remote_qpn=cid.remote_qpn)  # fmt: skip
        self.move(cid, "tx_dreq")
        self._send(cid, dreq, mad.ms_of(cid.av_timeout), cid.max_cm_retries)

    def send_drep(self, cid: CmId) -> None:
        drep = mad.Drep(tid=cid.tid, local_comm_id=cid.local_comm_id,
                        remote_comm_id=cid.remote_comm_id)  # fmt: skip
        self.move(cid, "tx_drep")
        self._send(cid, drep)
        self._timewait(cid)

    def forget_remote(self, cid: CmId) -> None:
        key = (cid.remote_comm_id, cid.remote_ca_guid)
        if self.by_remote.get(key) is cid:
            del self.by_remote[key]

    # --- sending, timers ----------------------------------------------------------------
    def _send(self, cid: CmId, msg: mad.CmMessage, timeout_ms: int = 0, retries: int = 0) -> None:
        """Queue ``msg`` to the peer; with ``timeout_ms``, keep it for retransmission."""
        ctx = self.rdma.ctx_of(cid)
        p = cid.path
        assert p is not None
        data = msg.encode()
        route = ctx.gsi.route_to(p.dgid, p.sgid)
        self.pending.setdefault(ctx.name, []).append((data, route))
        ctx.device.hca.counters[f"cm_tx_{msg.NAME.lower()}"] += 1
        if timeout_ms:
            cid.msg, cid.route, cid.retries_left = data, route, retries
            cid.msg_timeout = timeout_ms / 1000.0
            cid.deadline = self._now(cid) + cid.msg_timeout
            cid.timer = "mad"

    def _reply(self, ctx: DeviceCtx, msg: mad.CmMessage, sgid: bytes, dgid: bytes) -> None:
        """Answer a MAD that belongs to no ID (REJ, DREP, SIDR_REP)."""
        self.pending.setdefault(ctx.name, []).append((msg.encode(), ctx.gsi.route_to(sgid, dgid)))
        ctx.device.hca.counters[f"cm_tx_{msg.NAME.lower()}"] += 1

    def cancel(self, cid: CmId) -> None:
        cid.msg = None
        cid.route = None
        cid.deadline = None
        cid.timer = ""

    def _timewait(self, cid: CmId) -> None:
        self.cancel(cid)
        cid.deadline = self._now(cid) + mad.ms_of(cid.av_timeout) / 1000.0
        cid.timer = "timewait"

    def deadline(self, gsi: GsiQP) -> float | None:
        """The agent's next deadline on ``gsi``'s device."""
        with self.lock:
            times = [c.deadline for c in self.rdma.ids.values()
                     if c.deadline is not None and c.dev == gsi.device]  # fmt: skip
        return min(times) if times else None

    def on_timer(self, gsi: GsiQP, now: float) -> None:
        with self.lock:
            for cid in [c for c in self.rdma.ids.values() if c.dev == gsi.device]:
                if cid.deadline is None or cid.deadline > now:
                    continue
                if cid.timer == "timewait":
                    self.cancel(cid)
                    self.move(cid, "timewait_exit")
                    if cid.state == RdmaState.DISCONNECT:
                        self.rdma.emit(cid, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0)
                elif cid.retries_left > 0 and cid.msg is not None and cid.route is not None:
                    cid.retries_left -= 1
                    cid.deadline = now + cid.msg_timeout
                    self.pending.setdefault(gsi.device, []).append((cid.msg, cid.route))
                    gsi.hca.counters["cm_retransmits"] += 1
                else:
                    self._timed_out(cid)
        self._push(gsi, now)

    def _timed_out(self, cid: CmId) -> None:
        state = cid.cm
        self.cancel(cid)
        self.move(cid, "timeout")
        etimedout = -errno.ETIMEDOUT
        if state in (C.REQ_SENT, C.MRA_REQ_RCVD, C.SIDR_REQ_SENT):
            self.rdma.emit(cid, RDMA_CM_EVENT_UNREACHABLE, etimedout)
        elif state in (C.REP_SENT, C.MRA_REP_RCVD):
            self.forget_remote(cid)
            self.rdma.emit(cid, RDMA_CM_EVENT_UNREACHABLE, etimedout)
        elif state == C.DREQ_SENT:
            self._timewait(cid)
            if self.rdma.move(cid, "disconnected", strict=False):
                self.rdma.emit(cid, RDMA_CM_EVENT_DISCONNECTED, etimedout)

    def flush(self) -> None:
        """Push queued MADs into QP1 and re-arm timers (no locks held by the caller)."""
        for ctx in list(self.rdma.devices.values()):
            rt = ctx.runtime
            with rt.lock:
                now = rt.clock.now()
                self._push(ctx.gsi, now)
                rt.progress()

    def _push(self, gsi: GsiQP, now: float) -> None:
        """Send what is queued for ``gsi``'s device (its lock held, not the agent's)."""
        with self.lock:
            out = self.pending.pop(gsi.device, [])
        for data, route in out:
            gsi.send_mad(data, route, now)
        gsi.arm_agent_timer()

    # --- receiving ------------------------------------------------------------------------
    def on_mad(self, gsi: GsiQP, data: bytes, sgid: bytes, dgid: bytes, now: float) -> None:
        counters = gsi.hca.counters
        try:
            msg = mad.decode(data)
        except mad.MadError as exc:
            counters[f"cm_drop_{exc.reason}"] += 1
            return
        counters[f"cm_rx_{msg.NAME.lower()}"] += 1
        ctx = self.rdma.devices.get(gsi.device)
        if ctx is None:
            counters["cm_drop_no_agent"] += 1
            return
        with self.lock:
            self._dispatch(ctx, msg, sgid, dgid, now)
        self._push(gsi, now)

    def _dispatch(self, ctx: DeviceCtx, msg: mad.CmMessage, sgid: bytes, dgid: bytes,
                  now: float) -> None:  # fmt: skip
        """The checks every received message goes through, by its row of :data:`_RX`
        (cm_req_handler, cm_rep_handler, ... each begin so in the kernel): the ID it
        names, whether it repeats one already taken, whether the ID's state takes it
        (its ``rx_<name>`` transition); only then its own work."""
        rx = _RX[type(msg)]
        what = msg.NAME.lower()
        counters = ctx.device.hca.counters
        cid = rx.find(self, ctx, msg, sgid)
        if isinstance(rx, Opens):
            if cid is None:
                rx.take(self, ctx, msg, sgid, dgid)
                return
            counters[f"cm_duplicate_{what}"] += 1
            again = rx.again.get(cid.cm)
            if again is not None:
                again(self, cid, msg)
            return
        if cid is None or cid.dev != ctx.name:
            counters[f"cm_drop_unknown_{what}"] += 1
            if rx.unknown is not None:
                rx.unknown(self, ctx, msg, sgid, dgid)
            return
        if cid.cm in rx.again:
            counters[f"cm_duplicate_{what}"] += 1
            again = rx.again[cid.cm]
            if again is not None:
                again(self, cid, msg)
            return
        if not self.move(cid, f"rx_{what}"):
            counters[f"cm_drop_unexpected_{what}"] += 1
            return
        rx.take(self, ctx, msg, cid, now)

    # --- finding the ID a message names ------------------------------------------------------
    def _find_comm(self, ctx: DeviceCtx, msg: Any, sgid: bytes) -> CmId | None:
        """Our comm ID, which the peer echoes as its remote comm ID (RTU, MRA, DREP)."""
        return self.by_comm.get(msg.remote_comm_id)

    def _find_peer(self, ctx: DeviceCtx, msg: Any, sgid: bytes) -> CmId | None:
        """Our comm ID and, once the ID knows it, the peer's (cm_rep_handler, and
        cm_dup_rep_handler's cm_acquire_id with both: a REP of another connection of
        the peer's is not for this one)."""
        cid = self.by_comm.get(msg.remote_comm_id)
        if cid is not None and cid.remote_comm_id not in (0, msg.local_comm_id):
            return None
        return cid

    def _find_dreq(self, ctx: DeviceCtx, dreq: mad.Dreq, sgid: bytes) -> CmId | None:
        """Both comm IDs (cm_dreq_handler's cm_acquire_id)."""
        cid = self.by_comm.get(dreq.remote_comm_id)
        return cid if cid is not None and cid.remote_comm_id == dreq.local_comm_id else None

    def _find_rej(self, ctx: DeviceCtx, rej: mad.Rej, sgid: bytes) -> CmId | None:
        if rej.reason == mad.REJ_TIMEOUT and rej.reject_info_length >= 8:
            # cm_acquire_rejected_id: the sender may not have known our comm ID;
            # the ARI carries its CA GUID, which with its comm ID names the connection.
            return self.by_remote.get((rej.local_comm_id, int.from_bytes(rej.ari[:8], "big")))
        return self.by_comm.get(rej.remote_comm_id)

    def _find_req(self, ctx: DeviceCtx, req: mad.Req, sgid: bytes) -> CmId | None:
        """The ID an earlier copy of this REQ made (the peer's comm ID and CA GUID)."""
        return self.by_remote.get((req.local_comm_id, req.local_ca_guid))

    def _find_sidr_req(self, ctx: DeviceCtx, req: mad.SidrReq, sgid: bytes) -> CmId | None:
        return self.by_remote.get((req.request_id, int.from_bytes(sgid[8:], "big")))

    def _find_sidr_rep(self, ctx: DeviceCtx, rep: mad.SidrRep, sgid: bytes) -> CmId | None:
        return self.by_comm.get(rep.request_id)

    # --- what a repeat sends again -----------------------------------------------------------
    def _again_mra(self, cid: CmId, msg: Any) -> None:
        """Our MRA for the REQ or REP that came again (a delayed MRA goes out now)."""
        mraed = mad.MSG_REQ if isinstance(msg, mad.Req) else mad.MSG_REP
        self._send(cid, mad.Mra(tid=cid.tid, local_comm_id=cid.local_comm_id,
                                remote_comm_id=cid.remote_comm_id, message_mraed=mraed,
                                service_timeout=MRA_SERVICE_TIMEOUT))  # fmt: skip

    def _again_rtu(self, cid: CmId, msg: Any) -> None:
        """A REP on an established connection: our RTU was lost, send it again."""
        self._send(cid, mad.Rtu(tid=cid.tid, local_comm_id=cid.local_comm_id,
                                remote_comm_id=cid.remote_comm_id))  # fmt: skip

    def _again_drep(self, cid: CmId, dreq: Any) -> None:
        """A DREQ in time-wait: our DREP was lost, send it again."""
        self._send(cid, mad.Drep(tid=dreq.tid, local_comm_id=cid.local_comm_id,
                                 remote_comm_id=cid.remote_comm_id))  # fmt: skip

    def _unknown_dreq(self, ctx: DeviceCtx, dreq: Any, sgid: bytes, dgid: bytes) -> None:
        """cm_issue_drep: a DREQ for a connection we no longer know still gets its DREP."""
        drep = mad.Drep(tid=dreq.tid, local_comm_id=dreq.remote_comm_id,
                        remote_comm_id=dreq.local_comm_id)  # fmt: skip
        self._reply(ctx, drep, sgid, dgid)

    # --- each message's own work, once the dispatch took it ----------------------------------
    def _listener_for(self, ctx: DeviceCtx, service_id: int, private_data: bytes,
                      sidr: bool) -> tuple[CmId | None, mad.CmaHeader] | None:  # fmt: skip
        """The listener a REQ or SIDR REQ asks for (None: no listener) and the
        request's CMA header; None for a malformed header, counted and dropped."""
        ps, port = mad.split_service_id(service_id)
        try:
            cma = mad.CmaHeader.decode(private_data)
        except mad.MadError as exc:
            ctx.device.hca.counters[f"cm_drop_{exc.reason}"] += 1
            return None
        return self.rdma.find_listener(ps, port, cma.dst_ip, ctx.name, sidr=sidr), cma

    def _take_req(self, ctx: DeviceCtx, req: mad.Req, sgid: bytes, dgid: bytes) -> None:
        found = self._listener_for(ctx, req.service_id, req.private_data, sidr=False)
        if found is None:
            return
        listener, cma = found
        if listener is None or req.transport_service_type != 0:
            rej = mad.Rej(tid=req.tid, remote_comm_id=req.local_comm_id,
                          message_rejected=mad.MSG_REQ, reason=mad.REJ_INVALID_SERVICE_ID)
            self._reply(ctx, rej, sgid, dgid)  # fmt: skip
            ctx.device.hca.counters["cm_rej_no_listener"] += 1
            return
        child = self.rdma.new_child(listener, ctx, cma, IBV_QPT_RC, req.service_id)
        self.move(child, "rx_req")
        child.tid = req.tid
        child.remote_comm_id = req.local_comm_id
        child.remote_ca_guid = req.local_ca_guid
        child.remote_qpn = req.local_qpn
        child.sq_psn = req.starting_psn
        child.seq_num = self.rng.randrange(1 << 24)
        # what rdma_accept takes by default: the REQ's, within the device's limits
        child.responder_resources = min(req.initiator_depth, MAX_RESPONDER)
        child.initiator_depth = min(req.responder_resources, MAX_INITIATOR)
        child.retry_count = req.retry_count
        child.rnr_retry_count = req.rnr_retry_count
        child.flow_control = req.end_to_end_flow_control
        child.srq = req.srq
        child.max_cm_retries = req.max_cm_retries
        child.rep_timeout_ms = mad.ms_of(req.local_cm_response_timeout)
        gids = ctx.gids
        sg = req.primary_remote_gid
        plt = max(req.primary_local_ack_timeout - 1, 0)
        child.path = Path(sg, req.primary_local_gid, gids.index(sg) if sg in gids else 0,
                          min(req.path_mtu, ctx.mtu) or ctx.mtu, req.primary_flow_label,
                          req.primary_hop_limit, req.primary_traffic_class, req.pkey, plt)
        child.av_timeout = mad.ack_timeout(LOCAL_CA_ACK_DELAY, plt)  # fmt: skip
        self.by_remote[(child.remote_comm_id, child.remote_ca_guid)] = child
        self.move(child, "mra_delayed")
        conn = {"private_data": req.private_data[mad.CMA_HEADER_SIZE:].hex(),
                "responder_resources": req.initiator_depth,
                "initiator_depth": req.responder_resources,
                "flow_control": req.end_to_end_flow_control, "retry_count": req.retry_count,
                "rnr_retry_count": req.rnr_retry_count, "srq": req.srq,
                "qp_num": req.local_qpn}  # fmt: skip
        self.rdma.emit(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, target=listener,
                   child=child.info(), conn=conn)  # fmt: skip

    def _take_rep(self, ctx: DeviceCtx, rep: mad.Rep, cid: CmId, now: float) -> None:
        self.cancel(cid)
        cid.remote_comm_id = rep.local_comm_id
        cid.remote_ca_guid = rep.local_ca_guid
        cid.remote_qpn = rep.local_qpn
        cid.sq_psn = rep.starting_psn
        cid.initiator_depth = rep.responder_resources
        cid.responder_resources = rep.initiator_depth
        cid.rnr_retry_count = rep.rnr_retry_count
        cid.av_timeout = mad.ack_timeout(rep.target_ack_delay, max(cid.av_timeout - 1, 0))
        self.move(cid, "mra_delayed")
        conn = {"private_data": rep.private_data.hex(),
                "responder_resources": rep.initiator_depth,
                "initiator_depth": rep.responder_resources,
                "flow_control": rep.end_to_end_flow_control, "retry_count": cid.retry_count,
                "rnr_retry_count": rep.rnr_retry_count, "srq": rep.srq,
                "qp_num": rep.local_qpn}  # fmt: skip
        self.rdma.emit(cid, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, conn=conn)

    def _take_rtu(self, ctx: DeviceCtx, rtu: mad.Rtu, cid: CmId, now: float) -> None:
        self.cancel(cid)
        self.rdma.emit(cid, RDMA_CM_EVENT_ESTABLISHED, 0,
                       conn={"private_data": rtu.private_data.hex()})  # fmt: skip

    def _take_rej(self, ctx: DeviceCtx, rej: mad.Rej, cid: CmId, now: float) -> None:
        self.cancel(cid)
        self.forget_remote(cid)
        if cid.cm == C.TIMEWAIT:
            self._timewait(cid)
        self.rdma.emit(cid, RDMA_CM_EVENT_REJECTED, rej.reason,
                       conn={"private_data": rej.private_data.hex()})  # fmt: skip

    def _take_mra(self, ctx: DeviceCtx, mra: mad.Mra, cid: CmId, now: float) -> None:
        # The peer needs more time: the outstanding REQ/REP waits longer before a resend.
        if cid.deadline is not None:
            cid.msg_timeout = (mad.ms_of(mra.service_timeout) + mad.ms_of(cid.av_timeout)) / 1e3
            cid.deadline = now + cid.msg_timeout

    def _take_dreq(self, ctx: DeviceCtx, dreq: mad.Dreq, cid: CmId, now: float) -> None:
        self.cancel(cid)
        cid.tid = dreq.tid
        if self.rdma.move(cid, "disconnected", strict=False):
            self.rdma.emit(cid, RDMA_CM_EVENT_DISCONNECTED, 0,
                           conn={"private_data": dreq.private_data.hex()})  # fmt: skip

    def _take_drep(self, ctx: DeviceCtx, drep: mad.Drep, cid: CmId, now: float) -> None:
        self._timewait(cid)
        if self.rdma.move(cid, "disconnected", strict=False):
            self.rdma.emit(cid, RDMA_CM_EVENT_DISCONNECTED, 0,
                           conn={"private_data": drep.private_data.hex()})  # fmt: skip

    def _take_sidr_req(self, ctx: DeviceCtx, req: mad.SidrReq, sgid: bytes,
                       dgid: bytes) -> None:  # fmt: skip
        found = self._listener_for(ctx, req.service_id, req.private_data, sidr=True)
        if found is None:
            return
        listener, cma = found
        if listener is None:
            rep = mad.SidrRep(tid=req.tid, request_id=req.request_id,
                              sidr_status=mad.SIDR_UNSUPPORTED, service_id=req.service_id)
            self._reply(ctx, rep, sgid, dgid)  # fmt: skip
            ctx.device.hca.counters["cm_rej_no_listener"] += 1
            return
        child = self.rdma.new_child(listener, ctx, cma, IBV_QPT_UD, req.service_id)
        self.move(child, "rx_sidr_req")
        child.tid = req.tid
        child.remote_comm_id = req.request_id
        child.remote_ca_guid = int.from_bytes(sgid[8:], "big")
        gids = ctx.gids
        child.path = Path(dgid, sgid, gids.index(dgid) if dgid in gids else 0, ctx.mtu,
                          pkey=req.pkey)  # fmt: skip
        self.by_remote[(child.remote_comm_id, child.remote_ca_guid)] = child
        ud = {"private_data": req.private_data[mad.CMA_HEADER_SIZE:].hex(), "qp_num": 0,
              "qkey": 0}  # fmt: skip
        self.rdma.emit(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, target=listener,
                   child=child.info(), ud=ud)  # fmt: skip

    def _take_sidr_rep(self, ctx: DeviceCtx, rep: mad.SidrRep, cid: CmId, now: float) -> None:
        self.cancel(cid)
        if self.by_comm.get(cid.local_comm_id) is cid:
            del self.by_comm[cid.local_comm_id]
        if rep.sidr_status != mad.SIDR_SUCCESS:
            self.rdma.emit(cid, RDMA_CM_EVENT_UNREACHABLE, rep.sidr_status,
                       ud={"private_data": rep.private_data.hex()})  # fmt: skip
            return
        if cid.qkey and rep.qkey != cid.qkey:
            self.rdma.emit(cid, RDMA_CM_EVENT_ADDR_ERROR, -errno.EINVAL)
            return
        cid.qkey = rep.qkey
        p = cid.path
        assert p is not None
        ah = {"dgid": p.dgid.hex(), "sgid_index": p.sgid_index, "flow_label": p.flow_label,
              "hop_limit": p.hop_limit, "traffic_class": p.tclass, "port_num": 1,
              "is_global": 1}  # fmt: skip
        ud = {"private_data": rep.private_data.hex(), "qp_num": rep.qpn, "qkey": rep.qkey,
              "ah_attr": ah}  # fmt: skip
        self.rdma.emit(cid, RDMA_CM_EVENT_ESTABLISHED, 0, ud=ud)


#: (ib_cm, device, message, sgid) -> the ID the message names, or None
Find = Callable[[IbCm, DeviceCtx, Any, bytes], "CmId | None"]
#: what a repeated message sends again beyond being counted (``cm_duplicate_<name>``)
Again = Callable[[IbCm, CmId, Any], None]


@dataclass(frozen=True)
class Opens:
    """How ib_cm takes a message that opens a connection (REQ, SIDR_REQ): ``find``
    names the ID an earlier copy made; with one it is a repeat (and ``again[state]``
    answers it), without one ``take`` makes the new ID (or rejects the request)."""

    find: Find
    take: Callable[[IbCm, DeviceCtx, Any, bytes, bytes], None]
    again: Mapping[C, Again] = field(default_factory=dict)


@dataclass(frozen=True)
class Moves:
    """How ib_cm takes a message about a known connection.  ``find`` names its ID:
    none (or another device's) is counted ``cm_drop_unknown_<name>`` and handed to
    ``unknown``; in a state of ``again`` the message is a repeat (counted, and the
    state's answer sent again if it has one); otherwise the ID's ``rx_<name>``
    transition (:data:`CM_TRANSITIONS`) must exist -- else ``cm_drop_unexpected_<name>``
    -- and ``take`` does the message's work in the new state."""

    find: Find
    take: Callable[[IbCm, DeviceCtx, Any, CmId, float], None]
    again: Mapping[C, Again | None] = field(default_factory=dict)
    unknown: Callable[[IbCm, DeviceCtx, Any, bytes, bytes], None] | None = None


#: how ib_cm takes each CM message (``IbCm._dispatch``)
_RX: dict[type[mad.CmMessage], Opens | Moves] = {
    mad.Req: Opens(IbCm._find_req, IbCm._take_req, {C.MRA_REQ_SENT: IbCm._again_mra}),
    mad.Rep: Moves(IbCm._find_peer, IbCm._take_rep,
                   {C.ESTABLISHED: IbCm._again_rtu, C.MRA_REP_SENT: IbCm._again_mra}),
    mad.Rtu: Moves(IbCm._find_comm, IbCm._take_rtu, {C.ESTABLISHED: None}),
    mad.Rej: Moves(IbCm._find_rej, IbCm._take_rej),
    mad.Mra: Moves(IbCm._find_comm, IbCm._take_mra, {C.MRA_REQ_RCVD: None, C.MRA_REP_RCVD: None}),
    mad.Dreq: Moves(IbCm._find_dreq, IbCm._take_dreq,
                    {C.TIMEWAIT: IbCm._again_drep, C.DREQ_RCVD: None}, IbCm._unknown_dreq),
    mad.Drep: Moves(IbCm._find_comm, IbCm._take_drep),
    mad.SidrReq: Opens(IbCm._find_sidr_req, IbCm._take_sidr_req),
    mad.SidrRep: Moves(IbCm._find_sidr_rep, IbCm._take_sidr_rep),
}  # fmt: skip
