"""QP1, the GSI QP: the UD queue pair that carries CM MADs on a device.

Every RoCE device has a General Services Interface QP, number 1, Q_Key
0x80010000, which the kernel's MAD layer owns.  softverbs gives each device
that the CM agent uses one too -- a real :class:`~softverbs.engine.qp.QPEngine`
of type UD at QP number 1, in the device's own QP table, driven by the same
engine and fabric as every other QP.  MADs therefore go through the UD
requester and responder (Q_Key and P_Key checks, GRH in the receive
buffer, counters, pcap taps, fault injection) like any datagram.

The agent owns the QP's rings, CQs and a small registered buffer: receive
slots of 40 (GRH) + 256 bytes, and send slots of 256 bytes.  After the
engine delivers a datagram, :meth:`GsiQP.receive` polls the receive CQ,
parses the GRH (to learn who sent it, as ``ib_init_ah_attr_from_wc`` does),
hands the MAD to the agent and reposts the slot.  Sends the agent queued are
posted as UD SEND WQEs to remote QP 1 with the GSI Q_Key; their completions
are reaped at once.

Anything that is not a 256-byte UD SEND_ONLY is dropped before it reaches
the engine (``cm_drop_bad_length``, ``cm_drop_bad_opcode``), so garbage
addressed to QP 1 can never put QP 1 in the error state.

The agent's timers (retransmissions, timewait) ride on this QP's timer:
:meth:`next_deadline` is the earlier of the engine's and the agent's, and
:meth:`handle_timer` runs both -- the device's timer heap needs no change.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Protocol

from softverbs.cm.mad import GSI_QKEY, GSI_QPN, MAD_SIZE
from softverbs.engine.memory import MemKind
from softverbs.engine.qp import QPEngine
from softverbs.engine.rings import (
    CompletionRing,
    RecvWQE,
    Route,
    SendWQE,
    local_cq,
    local_work_ring,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPT_UD,
    IBV_WC_SUCCESS,
    IBV_WR_SEND,
)
from softverbs.wire.opcodes import Op, OpInfo, Transport
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

if TYPE_CHECKING:
    from softverbs.engine.hca import HCA

log = logging.getLogger(__name__)

GRH_SIZE = 40
RECV_SLOTS = 64
SEND_SLOTS = 64
_RECV_SLOT = GRH_SIZE + MAD_SIZE
_UD_SEND_ONLY = int(Transport.UD) | int(Op.SEND_ONLY)


def rxe_ud_sport(qpn: int) -> int:
    """The UDP source port rxe gives a UD QP: 0xC000 + hash_32(qpn, 14).
    For QP1 this is 55410, as in every CM MAD of the golden captures."""
    return 0xC000 + ((((qpn * 0x61C88647) & 0xFFFFFFFF) >> 18) & 0x3FFF)


class MadSink(Protocol):
    """What the GSI QP hands received MADs to and asks for timers (the agent)."""

    def on_mad(self, gsi: GsiQP, data: bytes, sgid: bytes, dgid: bytes, now: float) -> None: ...
    def on_timer(self, gsi: GsiQP, now: float) -> None: ...
    def deadline(self, gsi: GsiQP) -> float | None: ...


def parse_grh(grh: bytes) -> tuple[bytes, bytes]:
    """(source GID, destination GID) from the 40 bytes in front of a UD receive.

    For IPv4 the GRH is 20 zero bytes and the IPv4 header, told apart from
    an IPv6 header by its valid checksum, as ``ibv_init_ah_from_wc`` does."""
    v4 = grh[20:40]
    if v4[0] >> 4 == 4 and _ipv4_checksum_ok(v4):
        return IPV4_MAPPED_PREFIX + v4[12:16], IPV4_MAPPED_PREFIX + v4[16:20]
    return bytes(grh[8:24]), bytes(grh[24:40])


def _ipv4_checksum_ok(hdr: bytes) -> bool:
    total: int = sum(struct.unpack(">10H", hdr))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


class GsiQP(QPEngine):
    """QP1 of one device (see the module docstring)."""

    def __init__(self, hca: HCA, pmtu: int, sink: MadSink, device: str) -> None:
        self.sink = sink
        self.device = device
        self.device_hca = hca
        self.pd_token = object()
        send_cq = local_cq(SEND_SLOTS + 1)
        recv_cq = local_cq(RECV_SLOTS + 1)
        super().__init__(hca, GSI_QPN, IBV_QPT_UD, self.pd_token, send_cq, recv_cq,
                         local_work_ring(SEND_SLOTS), local_work_ring(RECV_SLOTS), None, True,
                         owner=None)  # fmt: skip
        self.send_ring: CompletionRing = send_cq
        self.recv_ring: CompletionRing = recv_cq
        self.pmtu = pmtu
        self.buffer = bytearray(RECV_SLOTS * _RECV_SLOT + SEND_SLOTS * MAD_SIZE)
        self.key = hca.keys.register(MemKind.MR, self.pd_token, memoryview(self.buffer), 0,
                                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED)  # fmt: skip
        self.set_attrs({"qkey": GSI_QKEY, "pkey_index": 0, "pkey": 0xFFFF})
        for state in (IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS):
            self.set_state(state, 0.0)
        self.sport = rxe_ud_sport(GSI_QPN)
        self._next_send = 0
        for slot in range(RECV_SLOTS):
            self._post_recv(slot)

    @classmethod
    def attach(cls, hca: HCA, pmtu: int, sink: MadSink, device: str) -> GsiQP:
        """The device's QP1, created on first use (call with the device lock held)."""
        qp = hca.qps.get(GSI_QPN)
        if isinstance(qp, GsiQP):
            return qp
        gsi = cls(hca, pmtu, sink, device)
        hca.qps[GSI_QPN] = gsi
        return gsi

    def detach(self) -> None:
        if self.device_hca.qps.get(GSI_QPN) is self:
            del self.device_hca.qps[GSI_QPN]
        self.device_hca.keys.unregister(self.key)

    # --- receive ---------------------------------------------------------------------
    def _post_recv(self, slot: int) -> None:
        rq = self.rq
        assert rq is not None
        rq.push(RecvWQE(slot, [(slot * _RECV_SLOT, _RECV_SLOT, self.key.key)], _RECV_SLOT))
        rq.ring(rq.pi)
        rq.latch()

    def receive(self, pkt: Packet, info: OpInfo, now: float) -> None:
        counters = self.hca.counters
        if pkt.opcode != _UD_SEND_ONLY:
            counters["cm_drop_bad_opcode"] += 1
            return
        if len(pkt.payload) != MAD_SIZE:
            counters["cm_drop_bad_length"] += 1
            return
        super().receive(pkt, info, now)
        self._reap_recv(now)

    def _reap_recv(self, now: float) -> None:
        rq = self.rq
        assert rq is not None
        for cqe in self.recv_ring.take(RECV_SLOTS + 1):
            slot = int(cqe.wr_id)
            rq.release(cqe.index)
            if cqe.status == IBV_WC_SUCCESS and cqe.byte_len == _RECV_SLOT:
                base = slot * _RECV_SLOT
                grh = bytes(self.buffer[base : base + GRH_SIZE])
                data = bytes(self.buffer[base + GRH_SIZE : base + _RECV_SLOT])
                sgid, dgid = parse_grh(grh)
                self._post_recv(slot)
                try:
                    self.sink.on_mad(self, data, sgid, dgid, now)
                except Exception:  # never let a MAD kill the device
                    self.hca.counters["cm_drop_internal_error"] += 1
                    log.exception("CM agent failed on a MAD")
            else:
                self.hca.counters["cm_drop_recv_error"] += 1
                self._post_recv(slot)

    # --- send ------------------------------------------------------------------------
    def send_mad(self, data: bytes, route: Route, now: float, dqpn: int = GSI_QPN) -> bool:
        """Post one MAD to QP ``dqpn`` (1) at ``route``; False if the SQ is full."""
        sq = self.sq
        assert sq is not None
        self._reap_send()
        if sq.used >= sq.size:
            self.hca.counters["cm_drop_tx_busy"] += 1
            return False
        slot = self._next_send
        self._next_send = (slot + 1) % SEND_SLOTS
        off = RECV_SLOTS * _RECV_SLOT + slot * MAD_SIZE
        self.buffer[off : off + MAD_SIZE] = data[:MAD_SIZE].ljust(MAD_SIZE, b"\0")
        wqe = SendWQE(slot, IBV_WR_SEND, True, [(off, MAD_SIZE, self.key.key)], MAD_SIZE)
        wqe.route = route
        wqe.remote_qpn = dqpn
        wqe.remote_qkey = GSI_QKEY
        sq.push(wqe)
        sq.ring(sq.pi)
        self.doorbell(now)
        self._reap_send()
        return True

    def _reap_send(self) -> None:
        sq = self.sq
        assert sq is not None
        for cqe in self.send_ring.take(SEND_SLOTS + 1):
            sq.release(cqe.index)
            if cqe.status != IBV_WC_SUCCESS:
                self.hca.counters["cm_send_errors"] += 1

    def route_to(self, dgid: bytes, sgid: bytes, flow_label: int = 0) -> Route:
        """A route from our ``sgid`` to ``dgid`` (GID index looked up in the table)."""
        gids = self.device_hca.gids
        index = gids.index(sgid) if sgid in gids else 0
        return Route(dgid, sgid, index, 64, 0, flow_label, 1)

    # --- timers --------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        own = super().next_deadline()
        agent = self.sink.deadline(self)
        if own is None:
            return agent
        return own if agent is None else min(own, agent)

    def handle_timer(self, now: float) -> None:
        own = super().next_deadline()
        if own is not None and own <= now:
            super().handle_timer(now)
        self.sink.on_timer(self, now)

    def arm_agent_timer(self) -> None:
        """The agent's next deadline may have moved earlier: make the device wake."""
        deadline = self.next_deadline()
        if deadline is not None:
            self.device_hca.schedule(self, deadline)
