"""Driving the sans-IO engine: one lock, one clock, one progress loop.

A :class:`Runtime` owns a set of :class:`~softverbs.engine.hca.HCA` objects
that share a lock.  Every verb takes the lock, does its work and calls
:meth:`Runtime.progress`, which runs the devices until they are quiet:

1. packets in each device's outbox are handed to :meth:`Runtime.transmit`
   (the fabric: another in-process device, or a UDP socket), through the
   fault layer and the pcap taps if any;
2. packets that arrived are delivered to their device;
3. timers that are due fire.

Single-threaded pyverbs programs, which run both peers in one process, thus
make progress inside ``post_send``, ``poll`` and the blocking calls, as the
design asks.  A fabric with remote peers adds a progress thread that runs the
same loop under the same lock (:mod:`softverbs.fabric.udp`).

The clock is injected.  :class:`VirtualClock` never reads real time.  Time
moves only when someone waits: a ``poll`` that finds nothing, or a blocking
call, lets :meth:`Runtime.idle_step` jump the clock to the next timer.  A
simulated run with loss and long timeouts therefore takes no wall time, and
a QP that retries forever cannot make a call spin forever.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from typing import Protocol

from softverbs.engine.hca import HCA
from softverbs.errors import WireError
from softverbs.wire.codec import decode_udp_payload, encode_udp_payload
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet, is_multicast_gid


class Clock(Protocol):
    virtual: bool

    def now(self) -> float: ...


class MonotonicClock:
    """Real time."""

    virtual = False
    #: ``time.monotonic`` itself: read a few times a message, and a method
    #: around it cost a Python call and a module attribute lookup each time
    now = staticmethod(time.monotonic)


class VirtualClock:
    """Simulated time: it moves only when the runtime advances it."""

    virtual = True

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, t: float) -> None:
        if t > self.t:
            self.t = t


class PacketSink(Protocol):
    """Where a tap writes packets (a PcapWriter)."""

    def write_packet(self, pkt: Packet, ts: float | None = None) -> None: ...


class PacketFilter(Protocol):
    """The fault layer: decides what happens to each packet in flight."""

    def process(self, pkt: Packet, now: float) -> list[tuple[float, Packet]]: ...


class DeviceRuntime(Protocol):
    """What verbs objects need from whatever drives their device: a
    :class:`Runtime` here, or the device service's client runtime."""

    lock: threading.RLock
    cond: threading.Condition
    clock: Clock

    def progress(self) -> bool: ...
    def posted(self) -> bool: ...
    def idle_step(self) -> bool: ...
    def next_deadline(self) -> float | None: ...
    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool: ...


class Runtime:
    """Lock, clock and progress loop shared by a set of devices.

    Compiled, it is an extension type (``runtime.pxd``): the service's calls
    into it and its own calls into the devices (:class:`HCA`, typed) are C
    calls.  Subclasses are ordinary Python classes and override any method;
    the settings below are instance fields, which a subclass sets in its
    ``__init__`` (a class attribute of a subclass would not be seen by the
    compiled methods)."""

    def __init__(self, clock: Clock | None = None) -> None:
        #: the fabric takes a :class:`~softverbs.wire.packet.Burst` whole; else
        #: every burst is split into its packets before :meth:`transmit`
        self.bursts = False
        #: :meth:`release_due` has events of its own (a switch's) beside the packets the
        #: fault layer holds, so :meth:`progress` calls it on every pass
        self.own_events = False
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.clock: Clock = clock or MonotonicClock()
        self.hcas: list[HCA] = []
        #: packets handed over and not yet received, and the device each is for (two
        #: lists side by side, in the order they were handed over: :meth:`arrive`)
        self.inbox: list[Packet] = []
        self.inbox_to: list[HCA] = []
        self.faults: PacketFilter | None = None
        self._delayed: list[tuple[float, int, HCA, Packet]] = []
        self._delay_seq = 0
        self.taps: list[tuple[PacketSink, frozenset[bytes] | None]] = []
        self.generation = 0  #: bumped whenever progress did something
        self.sleepers = 0  #: threads asleep in :meth:`wait_for` (under :attr:`lock`)

    def attach(self, hca: HCA) -> None:
        with self.lock:
            self.hcas.append(hca)

    def detach(self, hca: HCA) -> None:
        with self.lock:
            if hca in self.hcas:
                self.hcas.remove(hca)

    # --- fabric ---------------------------------------------------------------
    def arrive(self, dst: HCA, pkt: Packet) -> None:
        """Queue ``pkt`` for ``dst``: :meth:`progress` delivers it after every
        outbox is drained, in the order the packets were queued."""
        self.inbox.append(pkt)
        self.inbox_to.append(dst)

    def transmit(self, src: HCA, pkt: Packet, now: float) -> None:
        """Put one packet on the wire.  Subclasses route it."""
        raise NotImplementedError

    def add_tap(self, sink: PacketSink, gids: frozenset[bytes] | None = None) -> None:
        """Copy every packet (to or from ``gids``, if given) to ``sink``."""
        with self.lock:
            self.taps.append((sink, gids))

    def remove_tap(self, sink: PacketSink) -> None:
        with self.lock:
            self.taps = [t for t in self.taps if t[0] is not sink]

    def tap(self, pkt: Packet, now: float) -> None:
        ts = now if self.clock.virtual else None
        for sink, gids in self.taps:
            if gids is None or pkt.sgid in gids or pkt.dgid in gids:
                sink.write_packet(pkt, ts)

    def _send(self, src: HCA, pkt: Packet, now: float) -> None:
        count = pkt.count
        if count > 1 and (self.taps or self.faults is not None or not self.bursts):
            for seg in pkt.segments():  # each packet on its own, exactly as sent singly
                self._send(src, seg, now)
            return
        src.sent_pkts += count
        if self.taps:
            self.tap(pkt, now)
        faults = self.faults
        if faults is None:
            self.transmit(src, pkt, now)
            return
        for when, out in faults.process(pkt, now):
            if when <= now:
                self.transmit(src, out, now)
            else:
                self._delay_seq += 1
                heapq.heappush(self._delayed, (when, self._delay_seq, src, out))

    # --- progress -----------------------------------------------------------------
    def send_outboxes(self, now: float) -> bool:
        """Send what every device has queued, its coalesced ACKs first; True if
        there was anything."""
        moved = False
        for hca in self.hcas:
            outbox = hca.pending()
            while outbox:
                moved = True
                self._send(hca, outbox.popleft(), now)
        return moved

    def progress(self) -> bool:
        """Run every device until quiet; True if anything happened.

        Must be called with :attr:`lock` held.
        """
        now = self.clock.now()
        did = False
        while True:
            moved = self.send_outboxes(now)
            pkts = self.inbox
            if pkts:
                # what was handed over, in order: the lists are taken whole and new
                # ones started, so a packet queued meanwhile waits for the next pass;
                # should a device's receive raise, the packets after the one it
                # raised on stay queued, first
                moved = True
                to = self.inbox_to
                self.inbox, self.inbox_to = [], []
                i = 0
                try:
                    for pkt in pkts:
                        hca = to[i]
                        i += 1
                        hca.receive(pkt, now)
                except BaseException:
                    self.inbox[0:0] = pkts[i:]
                    self.inbox_to[0:0] = to[i:]
                    raise
            # the held packets' check inline: a call per pass for nothing, mostly
            delayed = self._delayed
            if ((delayed and delayed[0][0] <= now) or self.own_events) and self.release_due(now):
                moved = True
            for hca in self.hcas:
                deadline = hca.next_deadline()
                if deadline is not None and deadline <= now and hca.run_timers(now):
                    moved = True
            if not moved:
                break
            did = True
        if did:  # woke(), inline: a call per progress
            self.generation += 1
            if self.sleepers:
                self.cond.notify_all()
        return did

    def woke(self) -> None:
        """Something happened: wake the threads asleep in :meth:`wait_for` (none,
        mostly: the service and a polling program never sleep there, and a
        ``notify_all`` with nobody to wake is still a Python call).  Call with
        :attr:`lock` held, as the sleepers count under it."""
        self.generation += 1
        if self.sleepers:
            self.cond.notify_all()

    def posted(self) -> bool:
        """A verb queued work (a post rang a doorbell): run the devices until
        what it made has left; True if anything happened.  The same as
        :meth:`progress` here; a fabric whose packets arrive on sockets leaves
        those to the next poll or to its thread.  Call with :attr:`lock` held."""
        return self.progress()

    def idle_step(self) -> bool:
        """Virtual clock only: jump to the next timer and run; False if none."""
        clock = self.clock
        if not isinstance(clock, VirtualClock):
            return False
        nxt = self.next_deadline()
        if nxt is None:
            return False
        clock.advance(nxt)
        self.progress()
        return True

    def release_due(self, now: float) -> bool:
        """Put on the wire what the fault layer held until ``now``; True if
        anything was.  A fabric with its own events (a switch) adds them here."""
        if self._delayed and self._delayed[0][0] <= now:
            self._release_delayed(now)
            return True
        return False

    def _release_delayed(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, _, src, pkt = heapq.heappop(self._delayed)
            self.transmit(src, pkt, now)

    def next_deadline(self) -> float | None:
        """The earliest timer of any device or held packet; None if none.
        (A plain loop: the service asks after every message.)"""
        first = self._delayed[0][0] if self._delayed else None
        for hca in self.hcas:
            d = hca.next_deadline()
            if d is not None and (first is None or d < first):
                first = d
        return first

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``ready()`` (checked under the lock); False on timeout.

        While waiting, timers keep firing: the wait wakes at the next
        deadline, runs :meth:`progress`, and sleeps again.
        """
        with self.lock:
            if self.clock.virtual:
                return self._wait_virtual(ready, timeout)
            end = None if timeout is None else time.monotonic() + timeout
            while (done := self.wait_pass(ready, end)) is None:
                self.sleepers += 1
                try:
                    self.cond.wait(self.wait_time(time.monotonic(), end))
                finally:
                    self.sleepers -= 1
            return done

    def wait_pass(self, ready: Callable[[], bool], end: float | None) -> bool | None:
        """One pass of a wait, with :attr:`lock` held: run the devices; True if
        ``ready()``, False if ``end`` (monotonic seconds) has passed, else None
        (sleep for :meth:`wait_time`, then pass again)."""
        self.progress()
        if ready():
            return True
        if end is not None and time.monotonic() >= end:
            return False
        return None

    def wait_time(self, now: float, end: float | None) -> float | None:
        """How long a wait may sleep: until the next timer, or ``end`` (both
        monotonic seconds; ``now`` is one too); None for ever."""
        wait: float | None = None
        nxt = self.next_deadline()
        if nxt is not None:
            wait = max(0.0, nxt - self.clock.now())
        if end is not None:
            wait = end - now if wait is None else min(wait, end - now)
        return wait

    def _wait_virtual(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """wait_for on a virtual clock: ``timeout`` is in simulated seconds."""
        end = None if timeout is None else self.clock.now() + timeout
        self.progress()
        while not ready():
            nxt = self.next_deadline()
            if end is not None and (nxt is None or nxt > end):
                assert isinstance(self.clock, VirtualClock)
                self.clock.advance(end)
                return False
            if not self.idle_step():
                from softverbs.errors import PyverbsRDMAError

                raise PyverbsRDMAError(
                    "the simulation is idle: nothing in flight and no timer armed, so "
                    "what this call waits for can never happen (post a receive or a send?)",
                    35,  # EDEADLK
                )
        return True


class InprocRuntime(Runtime):
    """The in-process fabric: every attached device is reachable by GID.

    Packets are handed over as objects, so bursts stay whole (segmentation
    offload end to end) unless a fault layer or a tap needs single packets.
    A packet to a multicast GID goes to every device with a QP attached to
    that group, the sender's own device included, as a switch floods a group
    to its member ports."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.bursts = True
        #: a unicast packet to an attached device goes straight to the inbox when no
        #: tap or fault layer watches (:meth:`send_outboxes`); False: always :meth:`transmit`
        self.direct = True
        #: the attached devices by their unicast GIDs: a multicast GID is never a key,
        #: so a packet whose destination is found here is unicast (see transmit)
        self.by_gid: dict[bytes, HCA] = {}
        #: the last GID object :meth:`send_outboxes` looked up and what :attr:`by_gid`
        #: gave for it (a QP's packets carry one GID object, its route's), forgotten
        #: whenever :attr:`by_gid` changes (attach, detach)
        self._to_gid: bytes | None = None
        self._to: HCA | None = None

    def attach(self, hca: HCA) -> None:
        with self.lock:
            super().attach(hca)
            for gid in hca.gids:
                if not is_multicast_gid(gid):
                    self.by_gid[gid] = hca
            self._to_gid = self._to = None

    def detach(self, hca: HCA) -> None:
        with self.lock:
            super().detach(hca)
            for gid in hca.gids:
                if self.by_gid.get(gid) is hca:
                    del self.by_gid[gid]
            self._to_gid = self._to = None

    def send_outboxes(self, now: float) -> bool:
        """As :meth:`Runtime.send_outboxes`, with the hand-off of a unicast packet
        to a device of this fabric done in the loop: what :meth:`Runtime._send`
        and :meth:`transmit` do for it (count it, find the device by GID, queue
        it for delivery) without their two calls per packet.  The packet is
        still queued, not received here: the receiver runs after every outbox
        is drained, as for any other packet, so the order of events is the
        same.  Taps, faults, multicast, a packet to nobody and one to corrupt
        take the general path.

        An outbox is read in order and emptied by one ``clear`` once all of it is
        handed over, not by a ``popleft`` per packet; a packet for the general
        path first takes the ones before it, and itself, off the outbox, so what
        :meth:`Runtime._send` does (or raises) meets the outbox as it met it
        before.  The device a GID names is looked up once per GID object in a
        row (:attr:`_to_gid`): a dictionary probe of a 16-byte key that is not
        the dictionary's own object is a comparison of the bytes."""
        if self.taps or self.faults is not None or not self.direct:
            return Runtime.send_outboxes(self, now)
        moved = False
        for hca in self.hcas:
            outbox = hca.pending()
            while outbox:
                moved = True
                n = len(outbox)
                taken = 0
                while taken < n:  # by index: no iterator object per outbox (a latency
                    pkt = outbox[taken]  # test's holds one packet), the deque's C item
                    gid = pkt.dgid
                    if gid is not self._to_gid:
                        self._to = self.by_gid.get(gid)
                        self._to_gid = gid
                    dst = self._to
                    if dst is None or pkt.corrupt_bit >= 0:
                        break  # the general path takes it
                    taken += 1  # what arrive() does, in the loop
                    hca.sent_pkts += pkt.count
                    self.inbox.append(pkt)
                    self.inbox_to.append(dst)
                if taken == n:
                    outbox.clear()
                else:
                    for _ in range(taken):
                        outbox.popleft()
                    self._send(hca, outbox.popleft(), now)
        return moved

    def transmit(self, src: HCA, pkt: Packet, now: float) -> None:
        # the device lookup first: it is one dict probe, and a hit is never multicast
        dst = self.by_gid.get(pkt.dgid)
        if dst is None:
            if is_multicast_gid(pkt.dgid):
                members = [h for h in self.hcas if pkt.dgid in h.mcast]
                if not members:
                    src.counters["drop_mcast_no_member"] += 1
                for hca in members:
                    self.arrive(hca, pkt)
            else:
                src.counters["drop_no_route"] += 1
            return
        if pkt.corrupt_bit >= 0:
            # In-process packets carry no ICRC; to corrupt one, put it on the
            # wire for real, flip the bit and let the receiver's check judge it.
            wire = flip_bit(bytearray(encode_udp_payload(pkt, _ip(pkt.sgid), _ip(pkt.dgid),
                                                         pkt.sport)), pkt.corrupt_bit)
            try:
                pkt = decode_udp_payload(wire, _ip(pkt.sgid), _ip(pkt.dgid), pkt.sport)
            except WireError as exc:
                dst.counters["rcvd_pkts"] += 1
                dst.counters[f"drop_{exc.reason}"] += 1
                return
        self.arrive(dst, pkt)


def flip_bit(data: bytearray, bit: int) -> bytearray:
    """Flip one bit of an encoded transport packet (never the ICRC-masked byte 4)."""
    nbits = len(data) * 8
    pos = bit % nbits
    if pos // 8 == 4:
        pos = (pos + 8) % nbits
    data[pos // 8] ^= 1 << (pos % 8)
    return data


def _ip(gid: bytes) -> bytes:
    return gid[12:] if gid[:12] == IPV4_MAPPED_PREFIX else gid
