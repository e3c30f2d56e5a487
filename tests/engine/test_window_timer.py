"""A retransmission that fills the window keeps the ACK timer armed.

Found by the multi-host tests (tests/netns): a 4 MiB SEND under 2% loss hung
for good.  A PSN-sequence NAK starts a retransmission, which clears the ACK
deadline; the retransmission filled the 512-packet window, and on a closed
window the requester returned before re-arming the timer.  When the
retransmitted packet at the NAKed PSN was lost again, the responder stayed
silent (it NAKs a gap once), no timer was left, and nothing ever moved.
"""

from __future__ import annotations

from engine_kit import DELIVER, DROP, Bench, Policy, is_request, is_seq_nak

from softverbs.enums import IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, IBV_WR_SEND
from softverbs.wire.packet import Packet

PMTU = 256


def lose_psn(psn: int, times: int) -> tuple[dict[str, int], Policy]:
    lost = {"n": 0}

    def policy(seq: int, src: str, pkt: Packet) -> str:
        if src == "a" and is_request(pkt) and pkt.psn == psn and lost["n"] < times:
            lost["n"] += 1
            return DROP
        return DELIVER

    return lost, policy


def test_lost_retransmission_that_filled_the_window_times_out_and_recovers() -> None:
    n = 1000  # packets: the retransmission from PSN 100 fills the 512-packet window
    lost, policy = lose_psn(100, times=2)
    b = Bench(pmtu=PMTU, mem_size=2 * n * PMTU, timeout=10)
    b.policy = policy
    b.a.mem[: n * PMTU] = bytes(i & 0xFF for i in range(n * PMTU))
    b.b.post_recv(n * PMTU, n * PMTU)
    b.a.post_send(IBV_WR_SEND, 0, n * PMTU)
    b.run()
    assert lost["n"] == 2
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert b.b.mem[n * PMTU : 2 * n * PMTU] == b.a.mem[: n * PMTU]
    assert len(b.sent("b", is_seq_nak)) == 1, "the responder NAKs the gap once"
    assert b.a.counters["local_ack_timeout_err"] == 1, "the timer found the second loss"
    assert len(b.timer_fires) >= 1


def test_window_bound_write_keeps_a_timer_when_everything_is_lost() -> None:
    n = 600
    b = Bench(pmtu=PMTU, mem_size=2 * n * PMTU, timeout=10, retry_cnt=1)
    b.a.post_send(IBV_WR_RDMA_WRITE, 0, n * PMTU, remote=b.b.addr(n * PMTU), rkey=b.b.mr.key)
    b.policy = lambda seq, src, pkt: DROP  # a dead peer
    b.run()
    (cqe,) = b.a.poll_send()
    assert cqe.status != IBV_WC_SUCCESS, "retries run out instead of hanging"
