"""UC and UD on the bare engine (SEMANTICS section 5, last rows).

UC has no acknowledgements: a message with a lost packet is dropped whole,
its receive WQE is reused by the next message, and the sender completes
anyway.  UD messages are single packets, checked against the Q_Key; the
receive buffer gets the 40-byte GRH first.
"""

from __future__ import annotations

import pytest
from engine_kit import BASE_B, GID_A, GID_B, Bench, drop_if, is_request

from softverbs.engine.congestion import CCConfig
from softverbs.engine.rings import Route
from softverbs.enums import (
    IBV_QPS_RTS,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_WC_GRH,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)

PMTU = 256


def test_uc_in_order() -> None:
    b = Bench(IBV_QPT_UC, pmtu=PMTU)
    b.a.mem[:1000] = bytes(range(250)) * 4
    b.b.post_recv(4096, 2048)
    b.a.post_send(IBV_WR_SEND, 0, 1000)
    b.a.post_send(IBV_WR_RDMA_WRITE, 0, 600, remote=BASE_B + 8192, rkey=b.b.mr.key)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 2
    assert b.sent("b") == [], "UC sends no acknowledgements"
    (r,) = b.b.poll_recv()
    assert r.byte_len == 1000 and b.b.mem[4096:5096] == b.a.mem[:1000]
    assert b.b.mem[8192:8792] == b.a.mem[:600]


def test_uc_lost_packet_drops_the_message_and_reuses_the_wqe() -> None:
    lose_psn_1 = drop_if(lambda src, p: src == "a" and is_request(p) and p.psn == 1)
    b = Bench(IBV_QPT_UC, pmtu=PMTU, policy=lose_psn_1)
    b.a.mem[:768] = b"\x11" * 768
    b.a.mem[1024:1324] = b"\x22" * 300
    first = b.b.post_recv(4096, 2048)
    b.a.post_send(IBV_WR_SEND, 0, 768)  # PSNs 0, 1 (lost), 2
    b.a.post_send(IBV_WR_SEND, 1024, 300)  # PSNs 3, 4
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 2
    (r,) = b.b.poll_recv()
    assert r.wr_id == first.wr_id and r.byte_len == 300
    assert b.b.mem[4096:4396] == b"\x22" * 300
    assert b.b.counters["drop_uc_missing_packet"] == 1
    assert b.a.qp.state == IBV_QPS_RTS and b.b.qp.state == IBV_QPS_RTS


def ud_bench() -> Bench:
    b = Bench(IBV_QPT_UD, pmtu=PMTU)
    b.a.qp.set_attrs({"qkey": 0x1234})
    b.b.qp.set_attrs({"qkey": 0x1234})
    return b


def ud_send(b: Bench, length: int, qkey: int) -> None:
    wqe = b.a.post_send(IBV_WR_SEND, 0, length, ring=False)
    wqe.route = Route(dgid=GID_B, sgid=GID_A)
    wqe.remote_qpn = b.b.qp.qpn
    wqe.remote_qkey = qkey
    b.a.ring()


def test_ud_delivers_with_grh() -> None:
    b = ud_bench()
    b.a.mem[:100] = bytes(range(100))
    b.b.post_recv(0, 40 + 100)
    ud_send(b, 100, 0x1234)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    (r,) = b.b.poll_recv()
    assert (r.status, r.byte_len, r.src_qp) == (IBV_WC_SUCCESS, 140, b.a.qp.qpn)
    assert r.wc_flags & IBV_WC_GRH
    assert b.b.mem[40:140] == bytes(range(100))


def test_ud_wrong_qkey_or_no_receive_is_dropped_and_counted() -> None:
    b = ud_bench()
    ud_send(b, 10, 0x9999)
    b.run()
    assert b.b.counters["qkey_violation"] == 1
    ud_send(b, 10, 0x1234)  # no receive posted
    b.run()
    assert b.b.counters["drop_no_rqe"] == 1
    assert b.b.poll_recv() == []
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 2


@pytest.mark.parametrize("opcode", [IBV_WR_RDMA_WRITE, IBV_WR_SEND])
def test_a_paced_uc_message_sends_every_packet_before_it_completes(opcode: int) -> None:
    """DCQCN paces a UC QP a packet at a time (its quantum at this rate); a message of
    many packets is done only once its last packet is sent -- not after the first
    burst, which completed it in success with the rest never sent."""
    size = 64 * PMTU
    b = Bench(IBV_QPT_UC, pmtu=PMTU, mem_size=4 * size)
    for node in (b.a, b.b):
        node.hca.cc = CCConfig("dcqcn", line_rate=1e9)
        node.qp.req.cc = node.hca.cc.new(node.qp.window)
    assert b.a.qp.req.cc.quantum(PMTU) < size // PMTU, "paced in more than one burst"
    b.a.mem[:size] = bytes(range(256)) * (size // 256)
    if opcode == IBV_WR_SEND:
        b.b.post_recv(0, size)
    b.a.post_send(opcode, 0, size, remote=b.b.addr(0), rkey=b.b.mr.key)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert sum(1 for s in b.log if s.src == "a" and is_request(s.pkt)) == size // PMTU
    assert b.b.mem[:size] == b.a.mem[:size]
    if opcode == IBV_WR_SEND:
        assert [(c.status, c.byte_len) for c in b.b.poll_recv()] == [(IBV_WC_SUCCESS, size)]
