"""A long RDMA READ is asked for in window-sized pieces.

Found by the multi-host tests (tests/netns): a 64 MiB READ between two
namespaces was one request, so the responder sent 16384 packets at once;
the requester's socket buffer overflowed, every implied-NAK retry asked for
the whole rest again, the stale copies kept the buffer full, and the READ
often failed with IBV_WC_RETRY_EXC_ERR.  Now at most ``window`` responses
are asked for at a time, like the requests of a long SEND or WRITE.
"""

from __future__ import annotations

from engine_kit import BASE_B, DELIVER, DROP, Bench, Policy, is_request, kind_of

from softverbs.enums import IBV_WC_SUCCESS, IBV_WR_RDMA_READ, IBV_WR_SEND
from softverbs.wire.opcodes import Kind, Op
from softverbs.wire.packet import Packet

PMTU = 256


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def is_read_request(pkt: Packet) -> bool:
    return kind_of(pkt) is Kind.READ_REQ


class BoundedReceiveQueue:
    """Drop what a receiver with room for ``room`` datagrams between two of its own
    sends could not hold: the b->a packets of one burst beyond the first ``room``."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.burst = 0
        self.dropped = 0

    def __call__(self, seq: int, src: str, pkt: Packet) -> str:
        if src == "a":
            self.burst = 0
            return DELIVER
        self.burst += 1
        if self.burst > self.room:
            self.dropped += 1
            return DROP
        return DELIVER


def read_bench(n: int, policy: Policy | None = None) -> Bench:
    b = Bench(pmtu=PMTU, mem_size=2 * n * PMTU + 4096)
    if policy is not None:
        b.policy = policy
    b.b.mem[: n * PMTU] = pattern(n * PMTU)
    return b


def test_long_read_is_asked_for_in_window_pieces() -> None:
    n = 1300  # packets: two full pieces of 512 and one of 276
    b = read_bench(n)
    window = b.a.qp.window
    b.a.post_send(IBV_WR_RDMA_READ, n * PMTU, n * PMTU, remote=BASE_B, rkey=b.b.mr.key)
    b.b.post_recv(0, 64)
    b.a.post_send(IBV_WR_SEND, 0, 10)  # its PSN follows the READ's: it waits for it
    b.run()
    cqes = b.a.poll_send()
    assert [c.status for c in cqes] == [IBV_WC_SUCCESS] * 2
    assert b.a.mem[n * PMTU : 2 * n * PMTU] == pattern(n * PMTU)
    reqs = [s.pkt for s in b.sent("a", is_read_request)]
    assert [r.psn for r in reqs] == [0, window, 2 * window]
    assert [r.dma_len for r in reqs] == [window * PMTU, window * PMTU, (n - 2 * window) * PMTU]
    assert [r.va for r in reqs] == [BASE_B, BASE_B + window * PMTU, BASE_B + 2 * window * PMTU]
    responses = b.sent("b", lambda p: kind_of(p) is Kind.READ_RESP)
    assert b.psns(responses) == list(range(n)), "every response once, in order"
    # each piece ends with LAST; a piece is asked for when the previous one has arrived
    ends = [s.pkt.psn for s in responses if s.pkt.opcode & 0x1F == Op.RDMA_READ_RESPONSE_LAST]
    assert ends == [window - 1, 2 * window - 1, n - 1]
    order = [("req", s.pkt.psn) if s.src == "a" else ("resp", s.pkt.psn) for s in b.log
             if is_read_request(s.pkt) or kind_of(s.pkt) is Kind.READ_RESP]  # fmt: skip
    assert order.index(("req", window)) > order.index(("resp", window - 1))
    (send,) = b.sent("a", lambda p: is_request(p) and not is_read_request(p))
    assert send.pkt.psn == n, "the SEND goes after the READ's last piece is asked for"
    assert b.a.counters.get("completer_retry_err", 0) == 0
    assert b.b.counters.get("out_of_seq_request", 0) == 0


def test_long_read_fits_a_bounded_receive_queue() -> None:
    n = 2000
    q = BoundedReceiveQueue(room=600)
    b = read_bench(n, q)
    b.a.post_send(IBV_WR_RDMA_READ, n * PMTU, n * PMTU, remote=BASE_B, rkey=b.b.mr.key)
    b.run()
    (cqe,) = b.a.poll_send()
    assert cqe.status == IBV_WC_SUCCESS
    assert b.a.mem[n * PMTU : 2 * n * PMTU] == pattern(n * PMTU)
    assert q.dropped == 0, "no burst of responses is longer than the window"
    assert len(b.sent("b")) == n


def test_lost_response_asks_again_to_the_end_of_its_piece_only() -> None:
    n = 1100
    lost = 700  # in the second piece
    seen = {"dropped": False}

    def lose_once(seq: int, src: str, pkt: Packet) -> str:
        is_lost = kind_of(pkt) is Kind.READ_RESP and pkt.psn == lost
        if src == "b" and is_lost and not seen["dropped"]:
            seen["dropped"] = True
            return DROP
        return DELIVER

    b = read_bench(n, lose_once)
    window = b.a.qp.window
    b.a.post_send(IBV_WR_RDMA_READ, n * PMTU, n * PMTU, remote=BASE_B, rkey=b.b.mr.key)
    b.run()
    (cqe,) = b.a.poll_send()
    assert cqe.status == IBV_WC_SUCCESS
    assert b.a.mem[n * PMTU : 2 * n * PMTU] == pattern(n * PMTU)
    reqs = [(s.pkt.psn, s.pkt.dma_len // PMTU) for s in b.sent("a", is_read_request)]
    # the piece [512, 1024) is asked again from 700 to its end, then [1024, 1100)
    assert reqs == [(0, window), (window, window), (lost, 2 * window - lost),
                    (2 * window, n - 2 * window)]  # fmt: skip
    assert b.b.counters.get("duplicate_request", 0) == 1  # answered from the replay cache


def _run_paced(b: Bench, gap: float, until: float, stall: tuple[int, float] = (0, 0.0)) -> None:
    """Run ``b`` with a responder that sends one packet every ``gap`` seconds: its
    responses queue up in order (behind what it owes already) and reach the requester
    one by one, as from Linux rxe under TCG (tests/interop).  Requests go at once.
    ``stall`` = (n, seconds): after its n-th packet the responder sends nothing for
    that long (the guest was not scheduled)."""
    from collections import deque

    queue: deque[Packet] = deque()
    a_hca = b.a.hca
    sent = 0
    next_at = 0.0  #: when the responder's next packet leaves
    while b.now < until:
        while batch := b._collect():
            for dst, pkt in batch:
                if dst is a_hca:
                    queue.append(pkt)
                else:
                    dst.receive(pkt, b.now)
        due = b.next_deadline()
        if queue:
            nxt = max(next_at, b.now)
            if due is not None and due < nxt:
                b.advance(due)
                continue
            b.advance(nxt)
            a_hca.receive(queue.popleft(), b.now)
            sent += 1
            next_at = b.now + gap + (stall[1] if sent == stall[0] else 0.0)
        elif due is None:
            return
        else:
            b.advance(due)


_READS, _PER = 8, 16  #: eight READs of 16 packets


def _outstanding_reads_one_response_lost() -> Bench:
    """A bench with eight 16-packet READs posted, all outstanding at once, whose
    responder's response for PSN 8 is lost once."""
    seen = {"dropped": False}

    def lose_once(seq: int, src: str, pkt: Packet) -> str:
        if src == "b" and kind_of(pkt) is Kind.READ_RESP and pkt.psn == _PER // 2 \
                and not seen["dropped"]:  # fmt: skip
            seen["dropped"] = True
            return DROP
        return DELIVER

    n = _READS * _PER
    b = read_bench(n, lose_once)
    b.a.qp.max_rd_atomic = _READS
    b.b.qp.max_dest_rd_atomic = _READS
    for i in range(_READS):
        b.a.post_send(IBV_WR_RDMA_READ, n * PMTU + i * _PER * PMTU, _PER * PMTU,
                      remote=BASE_B + i * _PER * PMTU, rkey=b.b.mr.key)  # fmt: skip
    return b


def _all_read(b: Bench) -> dict[str, int]:
    """Check that every READ completed with the responder's bytes; the requester's counters."""
    n = _READS * _PER
    cqes = b.a.poll_send()
    assert [c.status for c in cqes] == [IBV_WC_SUCCESS] * _READS, [c.reason for c in cqes]
    assert b.a.mem[n * PMTU : 2 * n * PMTU] == pattern(n * PMTU)
    return dict(b.a.counters)


def test_responses_after_a_gap_keep_the_ack_timer_from_firing() -> None:
    """Found by ``ib_read_bw -x 1 -n 200`` against rxe (tests/interop): one response
    lost before the bridge, and the READs behind it still had ~600 responses queued at
    the responder, which takes ~0.15 s to send them before it replays the lost one.
    The requester's ACK timer (67 ms) fired meanwhile although responses kept
    arriving, each time asking for every outstanding READ again (another full round of
    work queued at the responder) and spending a retry: IBV_WC_RETRY_EXC_ERR after 97
    of 200 READs.  Responses to the QP's own requests show the responder alive and at
    work: they restart the timer (as rxe's completer does), and only silence spends
    ``retry_cnt``."""
    b = _outstanding_reads_one_response_lost()
    timeout = 4.096e-6 * 2**10  # Bench's timeout=10
    _run_paced(b, timeout / 10, until=1.0)  # the backlog takes ~11 timeouts to drain
    counts = _all_read(b)
    assert counts.get("local_ack_timeout_err", 0) == 0, counts
    assert counts.get("completer_retry_err", 0) == 1, counts  # the implied NAK, once


def test_a_timeout_retry_is_not_followed_by_another_for_the_old_responses() -> None:
    """The responder stalls (sends nothing for 1.5 timeouts) while it still owes
    responses to the READs asked for before a loss: the ACK timer fires once and asks
    for every outstanding READ again.  The old responses that follow are not news of
    another loss: as after a NAK, no new retry episode (another round of requests, and
    another retry_cnt) starts before progress (rxe's ``started_retry``)."""
    b = _outstanding_reads_one_response_lost()
    timeout = 4.096e-6 * 2**10
    _run_paced(b, timeout / 10, until=1.0, stall=(3 * _PER, 1.5 * timeout))
    counts = _all_read(b)
    assert counts.get("local_ack_timeout_err", 0) == 1, counts  # the stall
    # the implied NAK, then the timeout; the old responses after it start nothing
    assert counts.get("completer_retry_err", 0) == 2, counts
    rounds = [s.t for s in b.sent("a", is_read_request) if s.pkt.psn == _PER // 2]
    assert len(rounds) == 2, rounds
