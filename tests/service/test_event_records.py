"""The records the service writes to a completion channel's socket name their CQ.

The channel's sink keeps the last CQ's record packed (a channel's events mostly
come from one CQ); an event of another CQ in between must still name its own."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from softverbs.device import records
from softverbs.service import server


def test_each_completion_event_names_its_own_cq() -> None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    client = SimpleNamespace(events_dropped=0)
    try:
        sink = server._comp_sink(server.EventSocket(mine, client))  # type: ignore[arg-type]
        order = [5, 5, 7, 5, 7, 7, 0, 0xFFFFFFFF, 5]
        for cq in order:
            sink(cq)
        theirs.setblocking(False)
        got = [records.CompEventRecord.unpack(theirs.recv(64)) for _ in order]
        assert [r.cq for r in got] == order
        assert {r.reserved for r in got} == {0}
        assert client.events_dropped == 0
    finally:
        mine.close()
        theirs.close()
