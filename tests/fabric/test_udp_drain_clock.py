"""Each datagram is delivered at the time it leaves the socket.

Found by the multi-host tests (tests/netns) on a loaded two-core machine: the
UDP runtime read the clock once and then drained the whole socket buffer,
which there took longer than the 67 ms ACK timeout.  ACKs at the end of the
drain armed their retransmission deadlines from the old time, so the timer
fired at once, the whole window went out again, and the duplicates made the
next drain longer still -- until a 64 MiB WRITE failed with RETRY_EXC_ERR.
"""

from __future__ import annotations

import functools
import os
import random
import socket
import time
from typing import Any

from softverbs.engine.hca import HCA
from softverbs.fabric.udp import UdpRuntime, explicit_addresses
from softverbs.wire.codec import encode_udp_payload
from softverbs.wire.opcodes import Op, Transport
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet


class TickingClock:
    """A clock that moves one second at every reading."""

    virtual = False

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        self.t += 1.0
        return self.t


def test_every_datagram_gets_its_own_time() -> None:
    x = 100 + os.getpid() % 100  # an uncommon loopback address: 4791 stays free
    local, peer = f"127.{x}.9.1", f"127.{x}.9.2"
    rt = UdpRuntime(explicit_addresses([local]), TickingClock())
    seen: list[float] = []
    hca = HCA("drain", rt.gids, functools.partial(random.Random(0).getrandbits, 8))

    def receive(pkt: Packet, now: float) -> None:
        seen.append(now)

    hca.receive = receive  # type: ignore[method-assign]
    rt.attach(hca)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tx.bind((peer, 0))
        sport = tx.getsockname()[1]
        for psn in range(3):
            pkt = Packet(Transport.RC | Op.ACKNOWLEDGE, 0x11, psn, b"")
            pkt.sgid = IPV4_MAPPED_PREFIX + socket.inet_aton(peer)
            pkt.dgid = IPV4_MAPPED_PREFIX + socket.inet_aton(local)
            data: Any = encode_udp_payload(pkt, socket.inet_aton(peer), socket.inet_aton(local),
                                           sport)  # fmt: skip
            tx.sendto(data, (local, 4791))
        time.sleep(0.05)
        with rt.lock:
            rt.progress()
    finally:
        tx.close()
        rt.stop()
    assert len(seen) == 3
    assert seen[0] < seen[1] < seen[2], f"one time for the whole drain: {seen}"
