"""The device-level engine: what a NIC holds besides its QPs.

An :class:`HCA` owns the memory key table, the QP and SRQ number spaces, the
counters, the timer heap and the outbox of packets waiting for the fabric.
It is still sans-IO: :meth:`HCA.receive` takes a decoded packet and the
time, :meth:`HCA.run_timers` takes the time, and packets to send pile up in
:attr:`HCA.outbox` for whoever drives the device (see
:mod:`softverbs.fabric.runtime`).

QP numbers come from a counter that only moves forward (wrapping at 2**24,
skipping 0, 1 and numbers in use), so a destroyed QP's number is not handed
out again until the whole space has been walked -- a stale peer cannot reach
a new QP by accident (seed 002, note 1).  The first number is 0x11, as rxe's.

Multicast.  A UD QP attached to a multicast GID (``ibv_attach_mcast``) is a
member of that group on this device: :attr:`HCA.mcast` maps each group to its
members.  A packet whose BTH names QP :data:`MCAST_QPN` (0xFFFFFF) is
delivered to every member of the group its destination GID names, each a copy
with the GRH, as rxe's ``rxe_rcv_mcast_pkt`` does; the sending QP is a member
like any other, unless it was created with ``IBV_QP_CREATE_BLOCK_SELF_MCAST_LB``.
The fabric learns of the first join and the last leave of a group through
:attr:`HCA.on_mcast` (a UDP fabric joins the IP group then).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, cast

# The modules, not their names: compiled, core cimports HCA (core.pxd), so importing
# core (or congestion, which imports core) first runs this module while core's own
# body has not run yet; its names are read when a device is made.
from softverbs.engine import congestion, core
from softverbs.engine.memory import KeyByteSource, KeyTable
from softverbs.engine.observe import Observer
from softverbs.engine.rings import CompletionRing, SharedRecvRing
from softverbs.enums import (
    IBV_EVENT_CQ_ERR,
    IBV_EVENT_QP_FATAL,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPT_UD,
)
from softverbs.wire.opcodes import CNP_OPCODE, CNP_RESERVED, OPINFO, Kind
from softverbs.wire.packet import Packet

if TYPE_CHECKING:
    from softverbs.engine.core import QPCore
    from softverbs.engine.qp import QPEngine

QPN_MASK = 0xFFFFFF
FIRST_QPN = 0x11
#: the destination QP number of a multicast packet (IBA 9.6.1.2; rxe's IB_MULTICAST_QPN)
MCAST_QPN = 0xFFFFFF
#: rxe's limits (rxe_param.h): groups per device, QPs per group, attachments in all
MAX_MCAST_GRP = 8192
MAX_MCAST_QP_ATTACH = 56
MAX_TOTAL_MCAST_QP_ATTACH = 0x70000
#: The ECN field of the IP TOS / traffic class: Congestion Experienced (RFC 3168).
ECN_CE = 3
#: The reserved bytes of a CNP (they are sent as zeros and ignored on receipt).
_CNP_BODY = bytes(CNP_RESERVED)
_CNP_STATES = frozenset({IBV_QPS_RTS, IBV_QPS_SQD})
_KIND_CNP = Kind.CNP  # a global: an enum member read from its class costs several times more

#: Signature of the async event sink: (event type, engine object).
EventSink = Callable[[int, Any], None]

#: The device counters a packet or a message moves (rxe's names): each is an integer
#: field of :class:`HCA` of the same name (a C integer when compiled), which the data
#: path adds to directly; :class:`DeviceCounters` shows them with all the others.
HOT_COUNTERS = ("sent_pkts", "rcvd_pkts", "doorbells", "rdma_sends", "rdma_recvs", "ack_deferred")
_HOT = frozenset(HOT_COUNTERS)


class DeviceCounters(MutableMapping[str, int]):
    """The device's counters by name, as a ``collections.Counter`` reads: an unknown
    name is 0, ``counters[name] += n`` counts.

    The names in :data:`HOT_COUNTERS` read and write the device's own integer fields
    (always listed, zeros included); every other name is counted in a ``Counter``
    and listed once counted.  So ``softverbs stat``, the ``hw_counters`` files and
    every other reader see one set of names whichever side counts them.
    """

    __slots__ = ("_hca", "_rest")

    def __init__(self, hca: HCA) -> None:
        self._hca = hca
        self._rest: Counter[str] = Counter()

    def __getitem__(self, name: str) -> int:
        if name in _HOT:
            return cast(int, getattr(self._hca, name))
        return self._rest[name]

    def __setitem__(self, name: str, value: int) -> None:
        if name in _HOT:
            setattr(self._hca, name, value)
        else:
            self._rest[name] = value

    def __delitem__(self, name: str) -> None:
        if name in _HOT:
            setattr(self._hca, name, 0)
        else:
            del self._rest[name]

    def __contains__(self, name: object) -> bool:
        return name in _HOT or name in self._rest

    def __iter__(self) -> Iterator[str]:
        yield from HOT_COUNTERS
        yield from self._rest

    def __len__(self) -> int:
        return len(HOT_COUNTERS) + len(self._rest)

    def copy(self) -> Counter[str]:
        """A snapshot, as a ``Counter``."""
        return Counter(dict(self.items()))

    def __sub__(self, other: Counter[str]) -> Counter[str]:
        """What was counted since ``other`` (a :meth:`copy`), as ``Counter`` subtracts."""
        return self.copy() - other

    def __repr__(self) -> str:
        return f"DeviceCounters({dict(self.items())!r})"


class XrcDomain:
    """An XRC domain: an identity that XRC SRQs and receive QPs share."""

    __slots__ = ("key", "number", "refs")

    def __init__(self, number: int, key: object) -> None:
        self.number = number
        self.key = key  #: the (st_dev, st_ino) of the file that shares it, or None
        self.refs = 0

    def __repr__(self) -> str:
        return f"<XrcDomain {self.number} refs={self.refs}>"


class HCA:
    """One device's engine state (see the module docstring)."""

    def __init__(self, name: str, gids: list[bytes], key_byte: KeyByteSource) -> None:
        self.name = name
        self.gids = gids
        # --- the hot counters (HOT_COUNTERS), then the view of all of them by name
        self.sent_pkts = 0
        self.rcvd_pkts = 0
        self.doorbells = 0
        self.rdma_sends = 0
        self.rdma_recvs = 0
        self.ack_deferred = 0
        self.counters = DeviceCounters(self)
        #: memory keys; ``key_byte`` draws their random key bytes (engine/memory.py)
        self.keys = KeyTable(key_byte, self.counters)
        self._outbox: deque[Packet] = deque()
        #: its ``append``, bound once: :meth:`queue`'s call per packet is then a C call of
        #: the deque's method, compiled, not a lookup of ``append`` by name
        self._put: Callable[[Packet], None] = self._outbox.append
        #: responders with a coalesced ACK to send (see :attr:`outbox`)
        self._acks: list[QPEngine] = []
        self.qps: dict[int, QPEngine] = {}
        self.srqs: dict[int, SharedRecvRing] = {}
        self.cqs: dict[int, CompletionRing] = {}
        self._timers: list[tuple[float, int, QPEngine]] = []
        self._timer_seq = 0
        self._next_qpn = FIRST_QPN
        self._xrc_gen = 0
        self._xrc_slot = 0
        #: XRC receive QPs owned by the device: qpn -> processes holding them
        self.xrc_refs: dict[int, set[object]] = {}
        self._next_srqn = 1
        self.xrcds: dict[object, XrcDomain] = {}
        self._next_xrcd = 1
        self.events: deque[tuple[int, Any]] = deque()
        self.on_event: EventSink = self._queue_event
        #: a trace or a sanitizer watching the engine (:mod:`.observe`), or None
        self.observer: Observer | None = None
        #: the most packets a requester keeps unacknowledged (see :meth:`window_for`)
        self.max_window = core.DEFAULT_WINDOW
        #: bytes of datagrams a receive socket of this device holds (SO_RCVBUF, as
        #: the kernel grants it), or None where nothing is buffered (in process)
        self.rx_buffer: int | None = None
        #: the link's priority flow control holds this device's transmitter: QPs start
        #: nothing (the fabric sets it; see :meth:`resume_tx`)
        self.tx_paused = False
        #: QPs that found the transmitter paused, to wake when it resumes
        self.tx_waiting: set[QPEngine] = set()
        #: multicast groups: GID -> the QPs attached to it (see the module docstring)
        self.mcast: dict[bytes, set[QPEngine]] = {}
        #: told (group GID, True) on a group's first attach and (GID, False) on its last
        #: detach here, so the fabric can join and leave it; None: nothing to tell
        self.on_mcast: Callable[[bytes, bool], None] | None = None
        #: the congestion control each new (or reset) QP gets (:mod:`.congestion`)
        self.cc = congestion.CCConfig()
        self.cnp_sent_at = -1.0  #: when the port last sent a CNP (``cnp_per_port``)

    # --- multicast -----------------------------------------------------------------
    def attach_mcast(self, qp: QPEngine, mgid: bytes) -> str | None:
        """Make ``qp`` a member of group ``mgid``; an error text (ENOMEM) if a limit
        is reached.  Attaching a member again is no error, as in rxe."""
        members = self.mcast.get(mgid)
        if members is not None and qp in members:
            return None
        if members is None and len(self.mcast) >= MAX_MCAST_GRP:
            return f"the device has {MAX_MCAST_GRP} multicast groups already (max_mcast_grp)"
        if members is not None and len(members) >= MAX_MCAST_QP_ATTACH:
            return (f"the group has {MAX_MCAST_QP_ATTACH} QPs attached already "
                    "(max_mcast_qp_attach)")  # fmt: skip
        if sum(len(m) for m in self.mcast.values()) >= MAX_TOTAL_MCAST_QP_ATTACH:
            return "the device has max_total_mcast_qp_attach attachments already"
        if members is None:
            if self.on_mcast is not None:
                self.on_mcast(mgid, True)  # may raise: then nothing changed
            members = self.mcast[mgid] = set()
        members.add(qp)
        return None

    def detach_mcast(self, qp: QPEngine, mgid: bytes) -> bool:
        """Take ``qp`` out of group ``mgid``; False if it was not a member."""
        members = self.mcast.get(mgid)
        if members is None or qp not in members:
            return False
        members.discard(qp)
        if not members:
            del self.mcast[mgid]
            if self.on_mcast is not None:
                self.on_mcast(mgid, False)
        return True

    def mcast_groups(self, qp: QPEngine) -> list[bytes]:
        """The groups ``qp`` is attached to."""
        return [gid for gid, members in self.mcast.items() if qp in members]

    def detach_all(self, qp: QPEngine) -> None:
        """Take ``qp`` out of every group (it is being destroyed)."""
        for gid in self.mcast_groups(qp):
            self.detach_mcast(qp, gid)

    # --- numbers ----------------------------------------------------------------
    def window_for(self, pmtu: int) -> int:
        """The window of a QP with this path MTU: :attr:`max_window`, or as many
        packets as :attr:`rx_buffer` holds if that is fewer.

        A datagram is dropped when it finds the receiving socket's buffer full,
        and under go-back-N one drop costs everything sent after it: on a host
        with Linux's default ``net.core.rmem_max`` (212992, so a 416 KiB
        buffer) a 512-packet window of 4 KiB packets overflowed it, and 1 MiB
        WRITEs between two processes ran at about 20 MB/s instead of 2 GB/s.
        The device knows its own buffer, not its peer's; it takes the peer's to
        be the same (on one host it is).  A datagram takes its data rounded up
        to a power of two, with 512 bytes of headers and ``skb_shared_info``,
        and 256 more for its ``sk_buff`` (the kernel's ``truesize``).  Only
        three quarters of the buffer count: Linux gives back what a reader took
        in batches of a quarter of the buffer (``udp_rmem_release``), so that
        much may still be charged for datagrams already read.
        """
        if self.rx_buffer is None:
            return self.max_window
        truesize = (1 << (pmtu + 512 - 1).bit_length()) + 256
        return max(core.MIN_WINDOW, min(self.max_window, self.rx_buffer * 3 // 4 // truesize))

    def alloc_qpn(self, xrc_recv: bool = False) -> int:
        """A fresh QP number.

        XRC receive QPs follow seed 002's note 1: the MSB is always set and
        the upper bits advance on every allocation (a generation above a
        12-bit slot), so a destroyed and re-created receive QP never gets its
        old number back soon.
        """
        if xrc_recv:
            for _ in range(1 << 23):
                self._xrc_gen = (self._xrc_gen + 1) & 0x7FF
                qpn = 0x800000 | (self._xrc_gen << 12) | (self._xrc_slot & 0xFFF)
                self._xrc_slot = (self._xrc_slot + 1) & 0xFFF
                if qpn not in self.qps:
                    return qpn
            raise MemoryError("no free XRC receive QP number")
        for _ in range(QPN_MASK):
            qpn = self._next_qpn
            self._next_qpn = (qpn + 1) & QPN_MASK or FIRST_QPN
            if qpn >= 2 and qpn not in self.qps and not qpn & 0x800000:
                return qpn
        raise MemoryError("no free QP number")

    def alloc_srqn(self) -> int:
        for _ in range(QPN_MASK):
            srqn = self._next_srqn
            self._next_srqn = (srqn + 1) & QPN_MASK or 1
            if srqn not in self.srqs:
                return srqn
        raise MemoryError("no free SRQ number")

    def find_srq(self, srqn: int) -> SharedRecvRing | None:
        return self.srqs.get(srqn)

    def open_xrcd(self, key: object) -> XrcDomain:
        """A new XRC domain, shared under ``key`` (a file identity) if not None."""
        domain = XrcDomain(self._next_xrcd, key)
        self._next_xrcd += 1
        if key is not None:
            self.xrcds[key] = domain
        return domain

    def close_xrcd(self, domain: XrcDomain) -> None:
        domain.refs -= 1
        if domain.refs <= 0 and domain.key is not None and self.xrcds.get(domain.key) is domain:
            del self.xrcds[domain.key]

    # --- packets -----------------------------------------------------------------
    @property
    def outbox(self) -> deque[Packet]:
        """Packets waiting for the fabric.

        A responder does not ACK each request at once: it records the ACK and
        sends one cumulative ACK when the device sends its next packet or its
        outbox is drained (IBA 9.7.5.1.1 lets a responder coalesce ACKs).  A
        burst of requests taken from the network in one go is answered by one
        ACK, and any other packet still leaves after the ACKs before it.
        """
        return self.pending()

    def pending(self) -> deque[Packet]:
        """:attr:`outbox`, as a method: a C call for the runtimes, compiled (a
        property is looked up by name)."""
        if self._acks:
            self._flush_acks()
        return self._outbox

    def _flush_acks(self) -> None:
        acks, self._acks = self._acks, []
        for qp in acks:
            qp.emit_ack()

    def queue(self, pkt: Packet) -> None:
        """Send ``pkt``: into :attr:`outbox`, after the ACKs deferred before it."""
        if self._acks:
            self._flush_acks()
        self._put(pkt)

    def defer_ack(self, qp: QPCore) -> None:
        self._acks.append(qp)  # type: ignore[arg-type]  # a QPEngine (no cast: a call at run time)

    def receive(self, pkt: Packet, now: float) -> None:
        """Deliver one decoded packet addressed to this device.  What a test
        sets on an instance in its place receives instead (compiled, the
        runtimes' C call of it looks in the instance's ``__dict__`` first)."""
        count = pkt.count
        self.rcvd_pkts += count
        info = OPINFO[pkt.opcode]
        if info is None:
            self.counters["drop_bad_opcode"] += 1
            return
        if info.kind is _KIND_CNP:
            self.receive_cnp(pkt, now)
            return
        dqpn = pkt.dqpn
        if dqpn == MCAST_QPN:
            self._receive_mcast(pkt, info, now)
            return
        qp = self.qps.get(dqpn)
        if pkt.tclass & ECN_CE == ECN_CE:
            self.ecn_marked(pkt, qp, now)
        if qp is None:
            self.counters["drop_unknown_qp"] += 1
            return
        qp.rcvd_pkts += count  # here, once: a QP splitting a burst re-enters receive()
        if self.observer is not None:
            self.observer.packet_in(qp, pkt)
        qp.receive(pkt, info, now)

    def _receive_mcast(self, pkt: Packet, info: Any, now: float) -> None:
        """A multicast packet: a copy to each QP attached to its group, in QP
        number order (each QP checks its state, transport and Q_Key itself)."""
        members = self.mcast.get(pkt.dgid)
        if not members:
            self.counters["drop_mcast_no_group"] += 1
            return
        self.counters["mcast_rcvd_pkts"] += 1
        for qp in sorted(members, key=lambda q: q.qpn):
            if qp.block_self_mcast_lb and qp.qpn == pkt.src_qp and pkt.sgid in self.gids:
                self.counters["mcast_self_blocked"] += 1  # its own send, and it asked not to
                continue
            qp.rcvd_pkts += 1
            if self.observer is not None:
                self.observer.packet_in(qp, pkt)
            qp.receive(pkt, info, now)

    # --- priority flow control: the link pauses the transmitter ------------------
    def pause_tx(self) -> None:
        """A PFC PAUSE reached this device: its QPs start no packets until
        :meth:`resume_tx` -- a NIC's QP scheduler stops, so what its rate
        limiters pace does not pile up behind the paused port."""
        self.tx_paused = True

    def hold_tx(self, qp: QPCore) -> bool:
        """Whether the transmitter is paused; if so ``qp`` is woken when it resumes."""
        if not self.tx_paused:
            return False
        self.tx_waiting.add(cast("QPEngine", qp))
        return True

    def resume_tx(self, now: float) -> None:
        """The PAUSE ended: the QPs that were held send what they may."""
        self.tx_paused = False
        waiting = sorted(self.tx_waiting, key=lambda q: q.qpn)
        self.tx_waiting.clear()
        for qp in waiting:
            if self.qps.get(qp.qpn) is qp:  # not destroyed while it waited
                qp.req.pump_sq(now)

    # --- congestion: DCQCN's notification and reaction points ---------------------
    def ecn_marked(self, pkt: Packet, qp: QPEngine | None, now: float) -> None:
        """The notification point: a packet arrived with ECN CE.  With DCQCN on,
        the QP it reached answers its sender with a CNP -- at most one per
        ``min_time_between_cnps`` from each QP (the paper's NP, the default) or
        from the whole port (``cnp_per_port``)."""
        self.counters["np_ecn_marked_roce_packets"] += pkt.count
        cc = self.cc
        if qp is None or not cc.ecn:
            return
        per_port = cc.params["cnp_per_port"]
        last = self.cnp_sent_at if per_port else qp.cnp_sent_at
        if now - last < cc.params["min_time_between_cnps"] * 1e-6:
            return  # a marked packet inside the interval makes no CNP
        if per_port:
            self.cnp_sent_at = now
        else:
            qp.cnp_sent_at = now
        dqpn = pkt.src_qp if qp.qp_type == IBV_QPT_UD else qp.dest_qpn
        cnp = Packet(CNP_OPCODE, dqpn, 0, _CNP_BODY)
        cnp.becn = True
        cnp.pkey = pkt.pkey
        cnp.sqpn = qp.qpn
        cnp.sgid = pkt.dgid
        cnp.dgid = pkt.sgid
        cnp.sport = qp.sport or pkt.sport
        cnp.hop_limit = 64
        cnp.tclass = cc.params["cnp_dscp"] << 2  # not ECN-capable
        self.counters["np_cnp_sent"] += 1
        self._outbox.append(cnp)
        if self.observer is not None:
            self.observer.packet_out(qp, cnp)

    def receive_cnp(self, pkt: Packet, now: float) -> None:
        """The reaction point: a CNP for one of our QPs cuts its rate.  One
        that is malformed (not 16 reserved bytes), for no QP, from anyone but
        the QP's peer, for a QP not sending (not RTS or SQD), or for a QP whose
        congestion control ignores CNPs, changes nothing but ``rp_cnp_ignored``."""
        counters = self.counters
        qp = self.qps.get(pkt.dqpn)
        if (
            qp is None
            or len(pkt.payload) != CNP_RESERVED
            or qp.state not in _CNP_STATES
            or (qp.route is not None and qp.qp_type != IBV_QPT_UD and pkt.sgid != qp.route.dgid)
            or (pkt.pkey & 0x7FFF) != (qp.pkey & 0x7FFF)
        ):
            counters["rp_cnp_ignored"] += 1
            return
        cc = qp.req.cc
        if not cc.on_cnp(now):
            counters["rp_cnp_ignored"] += 1
            return
        qp.count("rp_cnp_handled")
        obs = self.observer
        if obs is not None:
            obs.packet_in(qp, pkt)
            rate = cc.rate()
            if rate is not None:
                obs.rate(qp, rate, "CNP")
        qp.req.reported_rate = cc.rate()

    # --- timers ---------------------------------------------------------------------
    def schedule(self, qp: QPCore, deadline: float) -> None:
        """Make sure ``qp.handle_timer`` runs no later than ``deadline``.

        Each QP has at most one live heap entry (``timer_token``); an entry
        that fires early is harmless, because the QP re-arms for its real
        deadline.  Older entries are skipped when they surface.
        """
        if qp.timer_at is not None and qp.timer_at <= deadline:
            return
        self._timer_seq += 1
        qp.timer_token = self._timer_seq
        qp.timer_at = deadline
        # the QPs of this device are QPEngines; no typing.cast: it is a call at run time
        heapq.heappush(self._timers, (deadline, self._timer_seq, qp))  # type: ignore[misc]

    def next_deadline(self) -> float | None:
        """The earliest live timer, dropping the stale entries above it (the
        runtimes ask for every device on each pass of their progress loop)."""
        timers = self._timers
        while timers:
            top = timers[0]
            qp = top[2]
            if qp.timer_token == top[1]:
                return top[0]
            heapq.heappop(timers)
        return None

    def run_timers(self, now: float) -> bool:
        """Fire every timer due at ``now``; True if any fired."""
        timers = self._timers
        fired = False
        while timers and timers[0][0] <= now:
            _, token, qp = heapq.heappop(timers)
            if qp.timer_token != token:
                continue
            qp.timer_token = 0
            qp.timer_at = None
            if self.qps.get(qp.qpn) is qp:
                fired = True
                qp.handle_timer(now)
                # Whatever path handle_timer took, the QP's timer stays armed.
                deadline = qp.next_deadline()
                if deadline is not None:
                    self.schedule(qp, deadline)
        return fired

    # --- events ----------------------------------------------------------------------
    def _queue_event(self, event_type: int, element: Any) -> None:
        self.events.append((event_type, element))

    def post_event(self, event_type: int, element: Any) -> None:
        self.counters["async_events"] += 1
        if self.observer is not None:
            self.observer.event(event_type, element)
        self.on_event(event_type, element)

    def cq_overrun(self, cq: CompletionRing) -> None:
        """A CQE did not fit: the CQ is in error, and so is every QP using it."""
        self.counters["cq_overrun"] += 1
        self.post_event(IBV_EVENT_CQ_ERR, cq)
        for qp in list(self.qps.values()):
            if qp.send_cq is cq or qp.recv_cq is cq:
                qp.last_error = "its completion queue overran"
                qp.fatal(IBV_EVENT_QP_FATAL, 0.0)
