"""The DOORBELLs of one read of a client's socket ring each queue once.

The service reads a burst of messages from a client in one drain; its
DOORBELL messages ring each (QP, queue) once, after the drain or before the
first other request in it.  These tests drive one drain by hand: what the
client sent sits in the socket, and ``Service._read`` takes it.  Bad
doorbells (handles the client does not have) make each ring visible in the
``doorbell_errors`` counter, which must count every message, coalesced or not.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from softverbs.device import ops, protocol, records
from softverbs.device.core import Owner
from softverbs.service.server import Client, Service


@pytest.fixture
def service() -> Iterator[Service]:
    with tempfile.TemporaryDirectory(prefix="svdc", dir="/tmp") as d:
        svc = Service(str(Path(d) / "sv.sock"))
        yield svc
        svc.stop()
        svc._shutdown()


@pytest.fixture
def peer(service: Service) -> Iterator[tuple[Client, socket.socket]]:
    """A greeted client of ``service``: its record, and our end of its socket."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.setblocking(False)
    owner = service.host.add_owner(Owner("coalescing", os.getpid(), os.getuid()))
    client = Client(a, os.getpid(), os.getuid(), owner, lambda c: None)
    service.clients[a] = client
    b.send(protocol.encode(ops.HELLO, 1, records.Hello(0, protocol.PROTOCOL_VERSION, 0,
                                                       os.getpid(), 0)))  # fmt: skip
    service._read(a)
    assert client.greeted
    b.recv(protocol.MAX_MESSAGE)  # HELLO's reply
    client.single = client.quiet = 0  # the next read drains (not one message: Service._read)
    yield client, b
    service.drop(client)
    b.close()


def _doorbell(qp: int, queue: int = records.DB_SQ) -> bytes:
    return protocol.encode(ops.DOORBELL, 0, records.Doorbell(qp, queue))


def _status(mine: socket.socket) -> dict[str, int]:
    """The service's counters as a STATUS request read in the same drain sees them."""
    reply = protocol.decode(mine.recv(protocol.MAX_MESSAGE))
    assert reply.op is ops.STATUS and reply.header.status == 0
    stats: dict[str, int] = json.loads(reply.tail)["stats"]
    return stats


def test_a_burst_on_one_queue_rings_once_and_counts_every_message(
        service: Service, peer: tuple[Client, socket.socket]) -> None:  # fmt: skip
    client, mine = peer
    for _ in range(5):
        mine.send(_doorbell(0x7777))  # not a handle of this client
    service._read(client.sock)
    assert service.stats["doorbell_errors"] == 5
    assert service.stats["doorbells_coalesced"] == 4
    assert client.alive  # a bad DOORBELL has no reply and keeps the connection


def test_doorbells_ring_before_the_request_that_follows_them(
        service: Service, peer: tuple[Client, socket.socket]) -> None:  # fmt: skip
    client, mine = peer
    for qp in (0x7777, 0x8888, 0x7777):  # two queues: three messages, two rings
        mine.send(_doorbell(qp))
    mine.send(protocol.encode(ops.STATUS, 9, records.Empty()))
    mine.send(_doorbell(0x7777))  # after the request: a ring of its own
    service._read(client.sock)
    seen = _status(mine)
    assert seen["doorbell_errors"] == 3 and seen["doorbells_coalesced"] == 1
    assert service.stats["doorbell_errors"] == 4
    assert service.stats["doorbells_coalesced"] == 1


def test_doorbells_read_before_the_client_goes_are_rung(
        service: Service, peer: tuple[Client, socket.socket]) -> None:  # fmt: skip
    client, mine = peer
    mine.send(_doorbell(0x7777))
    mine.send(_doorbell(0x7777))
    mine.close()
    service._read(client.sock)
    assert service.stats["doorbell_errors"] == 2  # rung (and refused) before the drop
    assert not client.alive or client.sock not in service.clients
