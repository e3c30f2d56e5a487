"""After a loss the requester keeps fewer packets in flight (congestion.SlowRestart).

Go-back-N resends everything after a lost packet, so a requester that keeps
its whole window in flight resends up to a window per loss.  A loss halves
``cwnd``, the part of the window the requester uses; acknowledged packets give
it back, CWND_GROWTH packets per window of them, up to the window.
"""

from __future__ import annotations

import pytest
from engine_kit import WINDOW, Bench, SeededFaults, drop_if, is_request, is_seq_nak

from softverbs.engine import congestion as requester
from softverbs.enums import IBV_WC_SUCCESS, IBV_WR_SEND

PMTU = 256


def send(b: Bench, n: int) -> None:
    """One SEND of ``n`` packets, which must arrive whole."""
    data = bytes((i * 7) & 0xFF for i in range(n * PMTU))
    b.a.mem[: n * PMTU] = data
    b.b.post_recv(n * PMTU, n * PMTU)
    b.a.post_send(IBV_WR_SEND, 0, n * PMTU)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert b.b.mem[n * PMTU : 2 * n * PMTU] == data


def test_without_loss_the_whole_window_is_used() -> None:
    n = 2000
    b = Bench(pmtu=PMTU, mem_size=2 * n * PMTU)
    send(b, n)
    assert b.a.qp.req.cc.cwnd == WINDOW
    assert [s.src for s in b.log[: WINDOW + 1]] == ["a"] * WINDOW + ["b"]


def test_a_loss_halves_what_the_retransmission_keeps_in_flight() -> None:
    n = 2000
    lost = drop_if(lambda src, pkt: src == "a" and is_request(pkt) and pkt.psn == 100)
    b = Bench(pmtu=PMTU, mem_size=2 * n * PMTU, timeout=10, policy=lost)
    send(b, n)
    naks = [i for i, s in enumerate(b.log) if s.src == "b" and is_seq_nak(s.pkt)]
    assert len(naks) == 1
    resent = []
    for s in b.log[naks[0] + 1 :]:
        if s.src == "b":
            break
        resent.append(s.pkt.psn)
    assert resent == list(range(100, 100 + WINDOW // 2)), "half a window from the lost PSN"
    # 1900 packets acknowledged since: grown back by about 16 per window of them
    assert WINDOW // 2 + 64 < b.a.qp.req.cc.cwnd < WINDOW
    # sent once each, but for the window in flight when the loss was found
    assert len(b.sent("a", is_request)) == n + WINDOW - 100


@pytest.mark.parametrize("seed", range(4))
def test_under_random_loss_less_is_sent_twice(seed: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    def sent(growth: int) -> int:
        monkeypatch.setattr(requester, "CWND_GROWTH", growth)
        n = 3000
        b = Bench(pmtu=PMTU, mem_size=2 * n * PMTU, timeout=10,
                  policy=SeededFaults(seed, loss=0.02, max_drops_per_packet=3))  # fmt: skip
        send(b, n)
        return len(b.sent("a", is_request))

    slow_restart = sent(requester.CWND_GROWTH)
    whole_window = sent(1 << 30)  # back to the whole window at the first acknowledgement
    assert slow_restart < whole_window / 2, (slow_restart, whole_window)
