"""softverbs.testing: the public kit works on every kind of device, and can fail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from softverbs import testing
from softverbs.enums import (
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_SEND,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WR_SEND,
)
from softverbs.verbs.wr import RecvWR, SendWR

QP_TYPES = {"RC": IBV_QPT_RC, "UC": IBV_QPT_UC, "UD": IBV_QPT_UD, "XRC": IBV_QPT_XRC_SEND}


@pytest.fixture(params=testing.KINDS)
def world(request: pytest.FixtureRequest) -> Iterator[testing.World]:
    kind = request.param
    socket = request.getfixturevalue("host_service") if kind == "host" else None
    with testing.world(kind, socket=socket) as w:
        yield w


def _exchange(w: testing.World, pair: testing.Pair, payload: bytes) -> None:
    """SEND ``payload`` from a to b and check what b received."""
    ud = pair.qp_type == IBV_QPT_UD
    offset = 40 if ud else 0  # a UD receive starts with the 40-byte GRH
    recv = RecvWR(wr_id=1, num_sge=1, sg=[pair.b.sge(1024, 64 + offset)])
    if pair.qp_type == IBV_QPT_XRC_SEND:
        pair.b.extras[1].post_recv(recv)
    else:
        pair.b.qp.post_recv(recv)
    pair.a.mr.write(payload, len(payload))
    wr = SendWR(wr_id=2, opcode=IBV_WR_SEND, num_sge=1, sg=[pair.a.sge(0, len(payload))])
    if ud:
        wr.set_wr_ud(pair.a.ah, pair.a.remote_qpn, testing.QKEY)
    if pair.qp_type == IBV_QPT_XRC_SEND:
        wr.set_qp_type_xrc(pair.a.remote_srqn)
    pair.a.qp.post_send(wr)
    (sent,) = testing.wait_completions(w, pair.a.cq, 1, what="the sender")
    (got,) = testing.wait_completions(w, pair.b.cq, 1, what="the receiver")
    assert (sent.wr_id, got.wr_id, got.byte_len) == (2, 1, len(payload) + offset)
    assert pair.b.mr.read(len(payload), 1024 + offset) == payload


@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_connected_pair_of_every_type_on_every_kind(world: testing.World, qp_type: str) -> None:
    pair = testing.connected_pair(world, QP_TYPES[qp_type])
    _exchange(world, pair, f"hello over {qp_type} on {world.kind}".encode())
    pair.close()


def test_a_world_of_its_own_service() -> None:
    """Kind "host" without a socket starts a private softverbsd, and stops it."""
    with testing.world("host") as w:
        pair = testing.connected_pair(w)
        _exchange(w, pair, b"served")
        path = w.socket
    import os

    assert not os.path.exists(path)


def test_waits_run_on_the_virtual_clock() -> None:
    """A SEND whose every packet is dropped fails after its retries: seconds of ACK
    timeouts in virtual time, with the faults scripted and logged."""
    with testing.world("sim") as w:
        pair = testing.connected_pair(w, timeout=14, retry_cnt=2)  # 67 ms per try
        script = testing.FaultScript().drop("send", count=10).attach(pair.a.ctx)
        pair.b.qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[pair.b.sge(1024, 8)]))
        pair.a.qp.post_send(SendWR(wr_id=2, opcode=IBV_WR_SEND, num_sge=1,
                                   sg=[pair.a.sge(0, 8)]))  # fmt: skip
        start = w.now()
        (wc,) = testing.wait_completions(w, pair.a.cq, 1, status=IBV_WC_RETRY_EXC_ERR,
                                         timeout=60)  # fmt: skip
        assert wc.wr_id == 2 and w.virtual and w.now() - start >= 3 * 0.067
        assert [action for _, action, _, _ in script.log] == ["drop"] * 3  # first try + 2
        assert not script.done


def test_a_fault_script_acts_on_exactly_the_packets_it_names() -> None:
    with testing.world("sim") as w:
        pair = testing.connected_pair(w)
        script = testing.FaultScript().drop("send", nth=2).attach(pair.a.ctx)
        for i in range(3):
            pair.b.qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[pair.b.sge(1024 + 64 * i, 8)]))
        for i in range(3):
            pair.a.mr.write(bytes([i]) * 8, 8, 8 * i)
            pair.a.qp.post_send(SendWR(wr_id=i, opcode=IBV_WR_SEND, num_sge=1,
                                       sg=[pair.a.sge(8 * i, 8)]))  # fmt: skip
        got = testing.wait_completions(w, pair.b.cq, 3)
        assert [wc.wr_id for wc in got] == [0, 1, 2]  # go-back-N recovered the second
        assert [(action, psn) for _, action, _, psn in script.log] == [("drop", 1)]
        assert script.done
    with pytest.raises(ValueError, match="unknown packet kinds"):
        testing.FaultScript().drop("sned")


def test_set_faults_acts_on_the_host_device(host_service: str) -> None:
    """Seeded rules reach a served device too; the RC pair still delivers."""
    with testing.world("host", socket=host_service) as w:
        pair = testing.connected_pair(w, timeout=8)
        testing.set_faults(pair.a.ctx, "seed=3;drop=0.5;kinds=send;limit=1")
        _exchange(w, pair, b"through a drop")


@pytest.mark.parametrize("kind", ["sim", "inproc", "host"])
def test_check_device_passes_on_softverbs(kind: str, request: pytest.FixtureRequest) -> None:
    socket = request.getfixturevalue("host_service") if kind == "host" else None
    with testing.world(kind, socket=socket) as w:
        results = testing.check_device(w)
    assert [r.name for r in results] == [name for name, _ in testing._CHECKS]
    assert all(r.ok for r in results), [r for r in results if not r.ok]


def test_check_device_reports_a_device_that_misbehaves() -> None:
    """A device whose sends vanish fails the checks that need them delivered, and
    says why, instead of raising."""
    with testing.world("sim", faults="drop=1;kinds=send") as w:
        results = {r.name: r for r in testing.check_device(w)}
    assert not results["completion-order"].ok
    assert "retry counter exceeded" in results["completion-order"].detail
    assert results["flush-in-order"].ok  # needs no packet at all
