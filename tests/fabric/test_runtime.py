"""The in-process fabric's hand-over: packets are received in the order they
were handed over, and a device whose receive raises loses only that packet.

The runtime queues each packet with the device it is for (``Runtime.inbox`` and
``inbox_to``, side by side) and its progress loop takes the lists whole; these
tests pin down what that must keep of the queue it replaced: the order across
devices, a packet handed over while others are received waits for the next
pass, and an exception leaves the rest queued, first.  They run in both modes
(compiled, ``HCA.receive`` set on an instance is found by the runtime's C call).
"""

from __future__ import annotations

import functools
import random

import pytest

from softverbs.engine.hca import HCA
from softverbs.fabric.runtime import InprocRuntime, VirtualClock
from softverbs.wire.opcodes import Op, Transport
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

GID = {name: IPV4_MAPPED_PREFIX + bytes([10, 0, 0, i]) for i, name in enumerate("ab", 1)}


def _pair(rt: InprocRuntime | None = None
          ) -> tuple[InprocRuntime, dict[str, HCA], list[tuple[str, int]]]:  # fmt: skip
    """Two devices on one in-process fabric (``rt``, else a new one); what each
    receives is logged (name, PSN)."""
    rt = rt if rt is not None else InprocRuntime(VirtualClock())
    log: list[tuple[str, int]] = []
    hcas = {}
    for name, gid in GID.items():
        hca = HCA(name, [gid], functools.partial(random.Random(0).getrandbits, 8))

        def receive(pkt: Packet, now: float, name: str = name) -> None:
            log.append((name, pkt.psn))

        hca.receive = receive  # type: ignore[method-assign]
        rt.attach(hca)
        hcas[name] = hca
    return rt, hcas, log


def _send(src: HCA, dst: str, psn: int) -> None:
    pkt = Packet(Transport.RC | Op.ACKNOWLEDGE, 0x11, psn, b"")
    pkt.sgid, pkt.dgid = src.gids[0], GID[dst]
    src.queue(pkt)


def test_packets_are_received_in_the_order_they_were_handed_over() -> None:
    rt, hcas, log = _pair()
    _send(hcas["a"], "b", 0)
    _send(hcas["a"], "a", 3)  # to itself (loopback), between two to b
    _send(hcas["a"], "b", 1)
    _send(hcas["b"], "a", 2)
    with rt.lock:
        assert rt.progress()
        assert not rt.progress()
    # the outboxes are drained in the order the devices were attached, each in order,
    # and the packets received in that order, whichever device each is for
    assert log == [("b", 0), ("a", 3), ("b", 1), ("a", 2)]
    assert (hcas["a"].sent_pkts, hcas["b"].sent_pkts) == (3, 1)
    assert rt.inbox == [] and rt.inbox_to == []


def test_a_packet_handed_over_while_others_are_received_waits_for_the_next_pass() -> None:
    rt, hcas, log = _pair()
    late = Packet(Transport.RC | Op.ACKNOWLEDGE, 0x11, 9, b"")

    def receive(pkt: Packet, now: float) -> None:
        log.append(("b", pkt.psn))
        if pkt.psn == 0:
            rt.arrive(hcas["a"], late)  # after psn 1, which was handed over before it

    hcas["b"].receive = receive  # type: ignore[method-assign]
    _send(hcas["a"], "b", 0)
    _send(hcas["a"], "b", 1)
    with rt.lock:
        rt.progress()
    assert log == [("b", 0), ("b", 1), ("a", 9)]


def test_a_receive_that_raises_loses_that_packet_only() -> None:
    rt, hcas, log = _pair()

    def receive(pkt: Packet, now: float) -> None:
        if pkt.psn == 0:
            raise RuntimeError("a bug in the device")
        log.append(("b", pkt.psn))

    hcas["b"].receive = receive  # type: ignore[method-assign]
    for psn in range(3):
        _send(hcas["a"], "b", psn)
    _send(hcas["b"], "a", 3)
    with rt.lock:
        with pytest.raises(RuntimeError, match="a bug in the device"):
            rt.progress()
        # the packets after the one that raised are still queued, in order, first
        assert [p.psn for p in rt.inbox] == [1, 2, 3]
        assert [h.name for h in rt.inbox_to] == ["b", "b", "a"]
        _send(hcas["a"], "b", 4)
        rt.progress()
    assert log == [("b", 1), ("b", 2), ("a", 3), ("b", 4)]


def test_a_subclass_sets_the_settings_in_its_init() -> None:
    """Compiled, the settings are fields of the extension type: a subclass's
    ``__init__`` sets them (the switch does), and the compiled loop reads them."""

    class Indirect(InprocRuntime):
        def __init__(self) -> None:
            super().__init__(VirtualClock())
            self.direct = False
            self.sent: list[int] = []

        def transmit(self, src: HCA, pkt: Packet, now: float) -> None:
            self.sent.append(pkt.psn)
            super().transmit(src, pkt, now)

    rt = Indirect()
    _, hcas, log = _pair(rt)
    _send(hcas["a"], "b", 5)
    with rt.lock:
        rt.progress()
    assert rt.sent == [5] and log == [("b", 5)]


def test_a_packet_to_nobody_amid_an_outbox_is_dropped_alone_in_order() -> None:
    """The hand-off takes an outbox whole; a packet for the general path (here one
    to a GID no device has) leaves it first, with those before it, and is counted
    as dropped, and the packets after it still go, in order."""
    rt, hcas, log = _pair()
    _send(hcas["a"], "b", 0)
    nobody = Packet(Transport.RC | Op.ACKNOWLEDGE, 0x11, 1, b"")
    nobody.sgid, nobody.dgid = GID["a"], IPV4_MAPPED_PREFIX + bytes([10, 0, 0, 99])
    hcas["a"].queue(nobody)
    _send(hcas["a"], "b", 2)
    _send(hcas["a"], "a", 3)
    with rt.lock:
        assert rt.progress()
    assert log == [("b", 0), ("b", 2), ("a", 3)]
    assert not hcas["a"].outbox
    assert hcas["a"].sent_pkts == 4 and hcas["a"].counters["drop_no_route"] == 1


def test_a_detached_device_is_no_longer_found_by_its_gid() -> None:
    """The hand-off keeps the device of the last GID it looked up; a detach (or an
    attach) forgets it, so a packet to a detached device's GID is not delivered."""
    rt, hcas, log = _pair()
    _send(hcas["a"], "b", 0)
    with rt.lock:
        rt.progress()
    rt.detach(hcas["b"])
    _send(hcas["a"], "b", 1)  # the same GID object as before
    with rt.lock:
        rt.progress()
    assert log == [("b", 0)]
    assert hcas["a"].counters["drop_no_route"] == 1
    rt.attach(hcas["b"])
    _send(hcas["a"], "b", 2)
    with rt.lock:
        rt.progress()
    assert log == [("b", 0), ("b", 2)]
