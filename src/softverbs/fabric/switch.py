"""A switched fabric on the virtual clock: links, egress queues, RED/ECN, tail drop.

Topology: a star.  Every device (host) has a link to one switch and the
switch a link back to every host; each link has a bandwidth (bit/s) and a
propagation delay.  A packet crosses two links:

1. **the host's link** (its NIC's egress): a FIFO with no drops -- a NIC
   holds what it cannot send yet;
2. **the switch's egress port** toward the destination: a FIFO with a
   buffer of ``buffer`` bytes.  A packet that finds it full is dropped
   (tail drop, counted in :attr:`Port.drops`).  Otherwise RED decides on
   the instantaneous queue, as datacenter switches do for ECN: no mark below
   ``kmin`` bytes, probability rising linearly to ``pmax`` at ``kmax``,
   certain above.  An ECN-capable packet (ECT) is marked CE; a packet that
   is not ECN-capable is never dropped early, only by tail drop.  By default
   the queue is judged when the packet *leaves* it (``mark="dequeue"``, as
   shared-buffer switch ASICs mark): the mark then tells of the queue as it
   is, not as it was a queueing delay ago, and the control loop's delay
   does not grow with the queue.  ``mark="enqueue"`` judges the queue the
   packet found on arrival (classic RED).

**Priority flow control** (``pfc=True``, IEEE 802.1Qbb as RoCE fabrics run
it, one lossless priority): the switch counts the bytes each ingress link
(each host) has in its buffers.  When a host's share reaches the dynamic
threshold ``pfc_beta * (buffer - reserve - used)`` -- ``used`` the bytes in
all the switch's queues, ``reserve`` a headroom per ingress -- the switch
sends that host a PAUSE (XOFF); when the share falls two MTUs below the
threshold, or to nothing, a resume (XON).  Each takes the link's delay to
arrive; a paused NIC finishes the packet it is sending and starts no other,
and its QPs start none either (:meth:`HCA.pause_tx
<softverbs.engine.hca.HCA.pause_tx>`): a NIC's QP scheduler stops with the
port, so a rate limiter does not pile packets up behind it.
The headroom is what still arrives after the switch decided to pause: a
frame on the wire each way (``2 * delay * bandwidth``) and a packet being
sent at each end.  A shared-buffer switch (the DCQCN paper's Trident II)
works this way; a static per-port threshold would either pause a 2:1 incast
before ECN acts or overflow the buffer at 16:1.  PAUSE frames are counted
(:attr:`Port.pfc_xoff` / :attr:`Port.pfc_xon` on the switch's port toward
the host) and a NIC's paused time is :attr:`Port.paused`; they take no link
time (64 bytes against 4 KiB packets).

A FIFO link with a fixed rate needs no event per byte: a packet that starts
at ``t`` is gone ``size * 8 / bandwidth`` later; the queue a newcomer finds
is the bytes of packets not yet gone.  A switch port is never paused, so a
packet that arrives there starts when the link is free (``max(t,
free_at)``).  A NIC starts one packet at a time, each when the one before it
is gone and no PAUSE holds it (an event per packet), so that a PAUSE stops
what it has not started yet.  The events live in the runtime's heap in time
order, so the switch sees arrivals from all hosts in the order they happen.
A packet's size on the wire counts its Ethernet, IP and UDP headers, ICRC,
FCS, preamble and inter-frame gap (:data:`WIRE_OVERHEAD`).

RED's coin is a seeded :class:`random.Random`: a run is reproducible.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, replace

from softverbs.engine.hca import HCA
from softverbs.fabric.runtime import Clock, InprocRuntime
from softverbs.wire.opcodes import OPINFO, header_length
from softverbs.wire.packet import Packet

#: Bytes a RoCEv2 packet takes on an Ethernet link besides its transport headers
#: and payload: Ethernet 14, IPv4 20, UDP 8, ICRC 4, FCS 4, preamble and gap 20.
WIRE_OVERHEAD = 70

#: The ECN field (RFC 3168): not ECN-capable, and Congestion Experienced.
NOT_ECT, CE = 0, 3

# Events on the fabric's heap.
_AT_SWITCH, _AT_HOST, _DEQUEUE, _NIC_FREE, _PAUSE, _RESUME = range(6)

#: The largest packet on the wire (a 4096-byte payload with RDMA WRITE's headers and
#: :data:`WIRE_OVERHEAD`), for PFC's headroom and hysteresis.
MAX_WIRE = 4096 + 28 + WIRE_OVERHEAD


def wire_bytes(pkt: Packet) -> int:
    """What ``pkt`` occupies on a link, in bytes."""
    info = OPINFO[pkt.opcode]
    hdr = header_length(info.hdrs) if info is not None else 12
    n = len(pkt.payload)
    return hdr + n + (-n & 3) + WIRE_OVERHEAD


@dataclass(frozen=True)
class RedProfile:
    """A switch's ECN marking profile: RED's thresholds and probability."""

    kmin: int  #: bytes: no marking at or below
    kmax: int  #: bytes: marking certain above
    pmax: float  #: marking probability at kmax
    source: str  #: where the numbers come from


#: Named RED/ECN profiles (:meth:`Topology.with_red`).  ``paper``: the DCQCN paper's
#: (Zhu et al., SIGCOMM 2015) switch setting.  ``cumulus``: what NVIDIA Cumulus Linux's
#: RoCE mode (``nv set qos roce``, lossy and lossless alike) configures on traffic class 3
#: of a Spectrum switch: an absolute ECN threshold of 150,000 bytes rising to 1,501,500
#: bytes, probability 100 % (the "Default RoCE Mode Configuration" table and the ``nv
#: show qos roce`` output of the Cumulus Linux 5.x RoCE page: 146.48 KB, 1.43 MB, 100),
#: on a shared buffer of some 16 MB.
RED_PROFILES: dict[str, RedProfile] = {
    "paper": RedProfile(5_000, 200_000, 0.01, "DCQCN paper, SIGCOMM 2015"),
    "cumulus": RedProfile(150_000, 1_501_500, 1.0, "NVIDIA Cumulus Linux 5.x RoCE mode"),
}


@dataclass
class Topology:
    """A star of hosts around one switch (see the module docstring)."""

    bandwidth: float = 10e9  #: bit/s of every link
    delay: float = 1e-6  #: seconds of propagation on every link
    buffer: int = 800_000  #: bytes of each switch egress queue
    kmin: int = 20_000  #: RED: no marking at or below this queue (bytes)
    kmax: int = 200_000  #: RED: marking certain above this queue (bytes)
    pmax: float = 0.01  #: RED: marking probability at kmax
    seed: int = 1  #: RED's coin
    mark: str = "dequeue"  #: judge the queue when a packet leaves ("dequeue") or arrives
    record: bool = False  #: keep a time series of each port's queue and departures
    pfc: bool = False  #: priority flow control: pause a host instead of dropping its packets
    pfc_beta: float = 1.0  #: PFC's dynamic threshold: this share of the free buffer per ingress

    def headroom(self) -> int:
        """Bytes that may still arrive from a host after the switch decided to
        pause it: the wire both ways and a packet being sent at each end."""
        return math.ceil(2 * self.delay * self.bandwidth / 8) + 2 * MAX_WIRE

    def with_red(self, name: str) -> Topology:
        """This topology with the RED/ECN profile ``name`` (:data:`RED_PROFILES`)."""
        profile = RED_PROFILES.get(name)
        if profile is None:
            raise ValueError(f"RED profile {name!r}: choose one of {', '.join(RED_PROFILES)}")
        return replace(self, kmin=profile.kmin, kmax=profile.kmax, pmax=profile.pmax)

    def check(self) -> str | None:
        """Why this topology cannot be built, or None."""
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            return f"bandwidth must be a positive number of bit/s, not {self.bandwidth}"
        if not (self.delay >= 0 and math.isfinite(self.delay)):
            return f"delay must be >= 0 seconds, not {self.delay}"
        if self.buffer <= 0:
            return f"buffer must be a positive number of bytes, not {self.buffer}"
        if not 0 <= self.kmin <= self.kmax:
            return f"RED needs 0 <= kmin <= kmax, not kmin={self.kmin} kmax={self.kmax}"
        if not 0 <= self.pmax <= 1:
            return f"pmax is a probability (0..1), not {self.pmax}"
        if self.mark not in ("dequeue", "enqueue"):
            return f"mark is 'dequeue' or 'enqueue', not {self.mark!r}"
        if not (self.pfc_beta > 0 and math.isfinite(self.pfc_beta)):
            return f"pfc_beta must be a positive number, not {self.pfc_beta}"
        return None


class Port:
    """One egress queue and the link it feeds."""

    __slots__ = (
        "bandwidth", "buffer", "busy", "delay", "departed", "drops", "free_at", "kmax", "kmin",
        "marks", "name", "paused", "paused_at", "pending", "pfc_xoff", "pfc_xon", "pmax",
        "qbytes", "queue", "rng", "samples", "sending", "sent_bytes",
    )  # fmt: skip

    def __init__(self, name: str, bandwidth: float, delay: float, buffer: float,
                 kmin: float, kmax: float, pmax: float, rng: random.Random | None,
                 record: bool) -> None:  # fmt: skip
        self.name = name
        self.bandwidth = bandwidth
        self.delay = delay
        self.buffer = buffer  #: bytes; math.inf for a queue that never drops
        self.kmin = kmin
        self.kmax = kmax
        self.pmax = pmax
        self.rng = rng  #: None: no RED (a NIC's queue)
        self.free_at = 0.0  #: when the link finishes what it has
        self.queue: deque[tuple[float, int]] = deque()  #: (gone at, bytes), in order
        self.qbytes = 0  #: bytes of the packets in ``queue``
        self.drops = 0
        self.marks = 0
        self.sent_bytes = 0
        self.busy = 0.0  #: seconds the link spent sending
        self.pfc_xoff = 0  #: PAUSE frames sent on this link (a switch port toward a host)
        self.pfc_xon = 0  #: resume frames sent on this link
        self.paused = 0.0  #: seconds a PAUSE held this link (a NIC)
        self.paused_at: float | None = None  #: since when, while it does
        #: packets a NIC has not started yet, with their destination
        self.pending: deque[tuple[Packet, HCA]] = deque()
        self.sending = False  #: a NIC: a packet is on its way out (its _NIC_FREE is due)
        #: (time, queue bytes found) per arrival, if recording
        self.samples: list[tuple[float, int]] | None = [] if record else None
        #: (time gone, source GID, bytes) per packet sent, if recording
        self.departed: list[tuple[float, bytes, int]] | None = [] if record else None

    def occupancy(self, now: float) -> int:
        """Bytes queued (waiting or being sent) at ``now``."""
        queue = self.queue
        while queue and queue[0][0] <= now:
            self.qbytes -= queue.popleft()[1]
        return self.qbytes

    def red(self, q: int) -> float:
        """RED's marking probability for a queue of ``q`` bytes."""
        if q <= self.kmin:
            return 0.0
        if q > self.kmax:
            return 1.0
        span = self.kmax - self.kmin
        return self.pmax if span <= 0 else self.pmax * (q - self.kmin) / span

    def maybe_mark(self, pkt: Packet, q: int) -> None:
        """RED/ECN on a queue of ``q`` bytes: maybe mark ``pkt`` CE."""
        rng = self.rng
        ect = pkt.tclass & 3 != NOT_ECT
        if rng is not None and ect and q > self.kmin and rng.random() < self.red(q):
            pkt.tclass |= CE
            self.marks += 1

    def enqueue(self, pkt: Packet, now: float, mark: bool = True) -> float | None:
        """Queue ``pkt`` arriving at ``now``: when it reaches the far end, or
        None if it was dropped.  With ``mark``, RED judges the queue it found."""
        size = wire_bytes(pkt)
        q = self.occupancy(now)
        if self.samples is not None:
            self.samples.append((now, q))
        if q + size > self.buffer:
            self.drops += 1
            return None
        if mark:
            self.maybe_mark(pkt, q)
        start = max(now, self.free_at)
        tx = size * 8 / self.bandwidth
        gone = start + tx
        self.free_at = gone
        self.busy += tx
        self.queue.append((gone, size))
        self.qbytes += size
        self.sent_bytes += size
        if self.departed is not None:
            self.departed.append((gone, pkt.sgid, size))
        return gone + self.delay

    def starts(self, arrive: float, size: int) -> float:
        """When a packet of ``size`` bytes that reaches the far end at ``arrive``
        began to leave (its dequeue)."""
        return arrive - self.delay - size * 8 / self.bandwidth


class SwitchedRuntime(InprocRuntime):
    """The in-process fabric with a switch between the devices (see the module
    docstring).  Packets go singly: the switch queues, marks and drops each."""

    def __init__(self, topology: Topology, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.bursts = False
        self.own_events = True
        self.direct = False  # every packet goes through the switch (transmit)
        problem = topology.check()
        if problem:
            raise ValueError(f"topology: {problem}")
        self.topology = topology
        self.rng = random.Random(topology.seed)
        self.nic: dict[str, Port] = {}  #: device name -> its link to the switch
        self.egress: dict[str, Port] = {}  #: device name -> the switch's port toward it
        self._events: list[tuple[float, float, int, int, HCA, Packet | None]] = []
        self._event_seq = 0
        # PFC's accounting: bytes in the switch by the host they came from, and in all
        self.ingress: dict[str, int] = {}
        self.used = 0
        self.pausing: set[str] = set()  #: hosts the switch has told to pause
        #: when the last PAUSE to each host was sent: its resume may not overtake it
        self.paused_when: dict[str, float] = {}

    def attach(self, hca: HCA) -> None:
        with self.lock:
            super().attach(hca)
            t = self.topology
            hca.cc.line_rate = t.bandwidth
            self.nic[hca.name] = Port(f"{hca.name} NIC", t.bandwidth, t.delay, math.inf,
                                      0, 0, 0.0, None, t.record)  # fmt: skip
            self.egress[hca.name] = Port(f"switch -> {hca.name}", t.bandwidth, t.delay,
                                         t.buffer, t.kmin, t.kmax, t.pmax, self.rng,
                                         t.record)  # fmt: skip

    def ports(self) -> list[Port]:
        """Every switch egress port, in the order the devices were attached."""
        return list(self.egress.values())

    def _push(self, when: float, stage: int, dst: HCA, pkt: Packet | None) -> None:
        # Packets that reach the switch at the same instant (identical hosts send in
        # lockstep) are taken in a seeded random order, as a real switch's arbiter
        # has no fixed favourite: ordered by who sent first, one sender would win
        # every free slot of a full queue and the others would lose every packet.
        self._event_seq += 1
        tie = self.rng.random() if stage == _AT_SWITCH else 0.0
        heapq.heappush(self._events, (when, tie, self._event_seq, stage, dst, pkt))

    def transmit(self, src: HCA, pkt: Packet, now: float) -> None:
        dst = self.by_gid.get(pkt.dgid)
        if dst is None:
            src.counters["drop_no_route"] += 1
            return
        nic = self.nic[src.name]
        nic.pending.append((pkt, dst))
        if not nic.sending:
            self._nic_start(src, nic, now)

    def _nic_start(self, src: HCA, nic: Port, now: float) -> None:
        """``src``'s NIC starts its next packet, unless paused or idle."""
        if nic.paused_at is not None or not nic.pending:
            nic.sending = False
            return
        pkt, dst = nic.pending.popleft()
        arrive = nic.enqueue(pkt, now)
        assert arrive is not None  # a NIC's queue does not drop
        self._push(arrive, _AT_SWITCH, dst, pkt)
        nic.sending = True
        self._push(nic.free_at, _NIC_FREE, src, None)

    def _threshold(self) -> float:
        """PFC's dynamic threshold: the most bytes one ingress may hold now."""
        t = self.topology
        reserve = t.headroom() * len(self.nic)
        return t.pfc_beta * (t.buffer - reserve - self.used)

    def release_due(self, now: float) -> bool:
        moved = super().release_due(now)
        events = self._events
        topo = self.topology
        dequeue = topo.mark == "dequeue"
        while events and events[0][0] <= now:
            moved = True
            when, _, _, stage, dst, maybe = heapq.heappop(events)
            if maybe is None:  # an event of dst's NIC
                self._nic_event(stage, dst, when)
                continue
            pkt = maybe
            if stage == _AT_HOST:
                self.arrive(dst, pkt)
                continue
            port = self.egress[dst.name]
            if stage == _DEQUEUE:  # it starts to leave
                size = wire_bytes(pkt)
                if dequeue:  # RED judges the queue now
                    port.maybe_mark(pkt, port.occupancy(when))
                if topo.pfc:
                    self._pfc_left(pkt, size, when)
                self._push(when + size * 8 / port.bandwidth + port.delay, _AT_HOST, dst, pkt)
                continue
            arrive = port.enqueue(pkt, when, mark=not dequeue)
            if arrive is None:
                dst.counters["switch_drops"] += 1
            elif dequeue or topo.pfc:
                if topo.pfc:
                    self._pfc_arrived(pkt, when)
                self._push(port.starts(arrive, wire_bytes(pkt)), _DEQUEUE, dst, pkt)
            else:
                self._push(arrive, _AT_HOST, dst, pkt)
        return moved

    def _nic_event(self, stage: int, host: HCA, when: float) -> None:
        nic = self.nic[host.name]
        if stage == _PAUSE:
            if nic.paused_at is None:
                nic.paused_at = when
                host.pause_tx()
            return
        if stage == _RESUME:
            if nic.paused_at is None:
                return
            nic.paused += when - nic.paused_at
            nic.paused_at = None
            host.resume_tx(when)
            if nic.sending:
                return  # the packet on its way out starts the next one when gone
        self._nic_start(host, nic, when)  # the last one is gone, or an idle NIC resumes

    def _pfc_arrived(self, pkt: Packet, when: float) -> None:
        """PFC: ``pkt`` joined a queue; pause its host if its share is too big."""
        src = self.by_gid.get(pkt.sgid)
        if src is None:
            return
        name = src.name
        size = wire_bytes(pkt)
        self.used += size
        held = self.ingress.get(name, 0) + size
        self.ingress[name] = held
        if name not in self.pausing and held >= self._threshold():
            self.pausing.add(name)
            self.paused_when[name] = when
            self.egress[name].pfc_xoff += 1
            self._push(when + self.topology.delay, _PAUSE, src, None)

    def _pfc_left(self, pkt: Packet, size: int, when: float) -> None:
        """PFC: ``pkt`` left its queue; resume its host once its share is small."""
        src = self.by_gid.get(pkt.sgid)
        if src is None:
            return
        name = src.name
        self.used -= size
        held = self.ingress[name] - size
        self.ingress[name] = held
        if name in self.pausing and (held == 0 or held + 2 * MAX_WIRE <= self._threshold()):
            self.pausing.discard(name)
            self.egress[name].pfc_xon += 1
            # A packet that leaves an idle queue at once has a dequeue time computed
            # back from its arrival, which rounding can put a hair before the arrival
            # that sent the PAUSE: the resume must still reach the host after it, or
            # the host stays paused for good.
            sent = max(when, self.paused_when.get(name, when))
            self._push(sent + self.topology.delay, _RESUME, src, None)

    def next_deadline(self) -> float | None:
        deadline = super().next_deadline()
        if self._events:
            first = self._events[0][0]
            return first if deadline is None else min(deadline, first)
        return deadline
