"""The device's counters: one set of names, whichever side counts them.

The counters a packet or a message moves (``hca.HOT_COUNTERS``) are integer
fields of the ``HCA`` that the data path adds to; every other counter is kept by
name.  ``hca.counters`` (``DeviceCounters``) must read as the ``Counter`` it
replaced, for every reader (``softverbs stat``, ``hw_counters``, the tests).
"""

from __future__ import annotations

import random
from collections import Counter

from engine_kit import Bench

from softverbs.engine.hca import HCA, HOT_COUNTERS
from softverbs.enums import IBV_QPT_RC, IBV_WR_SEND


def _hca() -> HCA:
    return HCA("t0", [bytes(16)], random.Random(1).getrandbits)


def test_hot_names_read_and_write_the_fields() -> None:
    hca = _hca()
    c = hca.counters
    assert [c[name] for name in HOT_COUNTERS] == [0] * len(HOT_COUNTERS)
    hca.rcvd_pkts += 3  # the data path
    c["doorbells"] += 2  # a reader that counts by name
    assert c["rcvd_pkts"] == 3 and hca.doorbells == 2
    assert dict(c)["rcvd_pkts"] == 3


def test_other_names_count_as_a_counter_does() -> None:
    c = _hca().counters
    assert c["drop_bad_opcode"] == 0 and "drop_bad_opcode" not in c
    assert c.get("drop_bad_opcode", 0) == 0
    c["drop_bad_opcode"] += 1
    assert "drop_bad_opcode" in c and c["drop_bad_opcode"] == 1
    # every hot name is listed (zeros included), the others once counted, in that order
    assert list(c) == [*HOT_COUNTERS, "drop_bad_opcode"]
    assert len(c) == len(HOT_COUNTERS) + 1
    del c["drop_bad_opcode"]
    assert "drop_bad_opcode" not in c


def test_copy_and_subtraction_as_a_counter() -> None:
    hca = _hca()
    c = hca.counters
    before = c.copy()
    assert isinstance(before, Counter) and before == Counter(dict(c.items()))
    hca.sent_pkts += 5
    c["cq_overrun"] += 1
    c["cm_retransmits"] += 0  # listed, but no change
    assert c - before == Counter({"sent_pkts": 5, "cq_overrun": 1})
    merged: dict[str, int] = {"link_downed": 0}
    merged.update(c)  # how the device layer reports them (device.core.counters)
    assert merged["sent_pkts"] == 5 and merged["cq_overrun"] == 1


def test_a_send_moves_the_hot_counters_seen_by_name() -> None:
    b = Bench(IBV_QPT_RC)
    b.b.post_recv(0, 64)
    b.a.post_send(IBV_WR_SEND, 0, 64)
    b.run()
    assert len(b.a.poll_send()) == 1 and len(b.b.poll_recv()) == 1
    a, r = b.a.counters, b.b.counters
    assert a["doorbells"] >= 1 and a["rdma_sends"] == 1 and a["rcvd_pkts"] >= 1  # the ACK
    assert r["rcvd_pkts"] == 1 and r["rdma_recvs"] == 1
    assert a["rdma_sends"] == b.a.hca.rdma_sends and r["rcvd_pkts"] == b.b.hca.rcvd_pkts
