"""The UDP fabric's wakeups: waiters are woken, and waking never blocks.

A UD or UC receive (or an RC ACK) produces a CQE and no packet.  The progress
thread delivers it; it must then wake an application thread sleeping in
``get_cq_event``, or that thread sleeps until its timeout -- forever without
one, which hung ``softverbs ud-pingpong -e`` and ``uc-pingpong -e``.

Two UDP devices on private loopback addresses, in this process.  The send is
posted from another thread after the receiver is already asleep, so the
datagram is certainly delivered by the progress thread, not by the waiter.

``UdpRuntime.wake`` is called under the runtime lock (every verb's progress
call does it when a timer is due sooner than the thread sleeps).  It writes
to a socket pair the progress thread drains -- after taking that same lock.
A blocking write into a full pair therefore deadlocked a busy-polling RC
program against rxe; the write must not block.

While an application thread busy-polls, the progress thread stands back
away from the sockets, and posts take no datagrams: the polls do.  A poller
that then blocks in ``get_cq_event`` must not wait for the standing back to
end; one that drives the device from its wait leaves the progress thread
asleep, going in and coming out.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from softverbs import (
    AH,
    CQ,
    MR,
    PD,
    QP,
    SGE,
    AHAttr,
    CompChannel,
    Context,
    GlobalRoute,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    counters,
)
from softverbs.enums import IBV_ACCESS_LOCAL_WRITE, IBV_QPT_UD, IBV_WC_SUCCESS
from softverbs.fabric import udp
from softverbs.fabric.udp import UdpRuntime, explicit_addresses

QKEY = 0x11111111


@pytest.fixture
def two_udp_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    # 127.x.y.z all route through lo; an uncommon pair avoids other users of 4791
    x = 100 + os.getpid() % 100
    links = [{"name": "wake1", "addrs": [f"127.{x}.7.1"]},
             {"name": "wake2", "addrs": [f"127.{x}.7.2"]}]  # fmt: skip
    cfg = tmp_path / "links.json"
    cfg.write_text(json.dumps({"links": links}))
    monkeypatch.setenv("SOFTVERBS_CONFIG", str(cfg))
    return "wake1", "wake2"


def _ud_qp(pd: PD, cq: CQ) -> QP:
    attr = QPAttr()
    attr.qkey = QKEY
    init = QPInitAttr(qp_type=IBV_QPT_UD, scq=cq, rcq=cq, cap=QPCap(4, 4, 1, 1))
    return QP(pd, init, attr)  # pyverbs moves a UD QP to RTS when given a QPAttr


def _ud_pair(tx: Context, rx: Context, channel: CompChannel | None = None) -> tuple[
        CQ, QP, CQ, QP, SendWR, list[RecvWR]]:  # fmt: skip
    """A UD QP on ``tx`` that sends 64 bytes to a UD QP on ``rx`` with two receives ready."""
    pd_tx, pd_rx = PD(tx), PD(rx)
    cq_tx = CQ(tx, 8)
    cq_rx = CQ(rx, 8, None, channel, 0) if channel is not None else CQ(rx, 8)
    qp_tx, qp_rx = _ud_qp(pd_tx, cq_tx), _ud_qp(pd_rx, cq_rx)
    mr_tx = MR(pd_tx, 64, IBV_ACCESS_LOCAL_WRITE)
    mr_rx = MR(pd_rx, 2 * 104, IBV_ACCESS_LOCAL_WRITE)
    mr_tx.write(b"x" * 64, 64)
    recvs = [RecvWR(i, 1, [SGE(mr_rx.buf + 104 * i, 104, mr_rx.lkey)]) for i in range(2)]
    route = GlobalRoute(dgid=rx.query_gid(1, 0), sgid_index=0)
    ah = AH(pd_tx, attr=AHAttr(is_global=1, port_num=1, gr=route))
    wr = SendWR(2, num_sge=1, sg=[SGE(mr_tx.buf, 64, mr_tx.lkey)])
    wr.set_wr_ud(ah, qp_rx.qp_num, QKEY)
    return cq_tx, qp_tx, cq_rx, qp_rx, wr, recvs


def _waited_for_delivery(qp_tx: QP, wr: SendWR, channel: CompChannel, cq_rx: CQ) -> float:
    """Seconds get_cq_event waited for a send posted 0.3 s after it began
    (from another thread: the waiter certainly sleeps first)."""
    cq_rx.req_notify()
    sender = threading.Timer(0.3, qp_tx.post_send, args=(wr,))
    sender.start()
    t0 = time.monotonic()
    channel.get_cq_event(cq_rx, timeout=5.0)
    waited = time.monotonic() - t0
    sender.join()
    cq_rx.ack_events(1)
    return waited


def _open_udp_as(cls: type[UdpRuntime], monkeypatch: pytest.MonkeyPatch) -> None:
    """Open this test's UDP devices with ``cls``, a subclass that changes one
    method (compiled, UdpRuntime is an extension type: its methods cannot be
    replaced on the class)."""
    monkeypatch.setattr(udp, "UdpRuntime", cls)  # the registry imports it when it opens one


@pytest.mark.parametrize("progress_thread", [True, False], ids=["thread", "no-thread"])
def test_ud_receive_wakes_get_cq_event(two_udp_devices: tuple[str, str], progress_thread: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Woken by the delivery (about 0.3 s), not by the 5 s timeout.  Without a
    progress thread at all (issue 11: a blocking get_cq_event on a device with
    nothing else to do runs the device itself) the completion arrives too."""
    if not progress_thread:

        class Unstarted(UdpRuntime):
            def start(self) -> None:
                pass

        _open_udp_as(Unstarted, monkeypatch)
    name_tx, name_rx = two_udp_devices
    with Context(name=name_tx) as tx, Context(name=name_rx) as rx:
        assert (rx.runtime._thread is None) is not progress_thread  # type: ignore[attr-defined]
        channel = CompChannel(rx)
        _, qp_tx, cq_rx, qp_rx, wr, recvs = _ud_pair(tx, rx, channel)
        qp_rx.post_recv(recvs[0])
        waited = _waited_for_delivery(qp_tx, wr, channel, cq_rx)
        assert waited < 2.5, f"get_cq_event returned after {waited:.2f} s: not woken"
        n, wcs = cq_rx.poll(1)
        assert n == 1 and wcs[0].status == IBV_WC_SUCCESS and wcs[0].byte_len == 104


def test_wake_never_blocks() -> None:
    """Far more wakeups than the socket pair holds, with no thread draining it."""
    x = 100 + os.getpid() % 100
    runtime = UdpRuntime(explicit_addresses([f"127.{x}.8.1"]))  # not started: no drainer
    try:
        waker = threading.Thread(target=lambda: [runtime.wake() for _ in range(200_000)],
                                 daemon=True)  # fmt: skip
        waker.start()
        waker.join(timeout=20)
        assert not waker.is_alive(), "wake() blocked on a full socket pair"
    finally:
        # stop() wakes the thread too: if wake() blocks, do not hang the test run
        stopper = threading.Thread(target=runtime.stop, daemon=True)
        stopper.start()
        stopper.join(timeout=10)


def test_posts_leave_datagrams_to_the_poller(two_udp_devices: tuple[str, str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A post sends what it made and takes no datagram: the poll does (a receive
    system call in every post cost the ping-pong two per message and side), and
    the progress thread stands back for a busy poller."""
    monkeypatch.setattr(udp, "POLLER_STANDS_BACK", 60.0)  # the poller stays "busy"
    name_tx, name_rx = two_udp_devices
    with Context(name=name_tx) as tx, Context(name=name_rx) as rx:
        _, qp_tx, cq_rx, qp_rx, wr, recvs = _ud_pair(tx, rx)
        qp_rx.post_recv(recvs[0])
        assert cq_rx.poll(1)[0] == 0  # an empty poll: a busy poller from now on
        qp_tx.post_send(wr)
        time.sleep(0.3)  # the datagram waits in rx's socket
        assert counters(rx)["rcvd_pkts"] == 0, "the progress thread took the datagram"
        qp_rx.post_recv(recvs[1])
        assert counters(rx)["rcvd_pkts"] == 0, "post_recv took the datagram"
        n, wcs = cq_rx.poll(1)
        assert n == 1 and wcs[0].status == IBV_WC_SUCCESS and wcs[0].byte_len == 104
        assert counters(rx)["rcvd_pkts"] == 1


def test_a_poller_that_blocks_ends_the_standing_back(
        two_udp_devices: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A thread that polled its CQ empty and then blocks in get_cq_event is no
    longer polling: the progress thread takes the sockets at once, not when its
    standing back (here made a minute long) ends."""
    monkeypatch.setattr(udp, "POLLER_STANDS_BACK", 60.0)
    monkeypatch.setattr(udp, "STAND_BACK_SLEEP", 60.0)
    name_tx, name_rx = two_udp_devices
    with Context(name=name_tx) as tx, Context(name=name_rx) as rx:
        channel = CompChannel(rx)
        _, qp_tx, cq_rx, qp_rx, wr, recvs = _ud_pair(tx, rx, channel)
        qp_rx.post_recv(recvs[0])
        assert cq_rx.poll(1)[0] == 0  # a busy poller: the thread stands back
        time.sleep(0.05)  # and is asleep
        waited = _waited_for_delivery(qp_tx, wr, channel, cq_rx)
        assert waited < 2.5, f"get_cq_event returned after {waited:.2f} s: the thread stood back"
        n, wcs = cq_rx.poll(1)
        assert n == 1 and wcs[0].status == IBV_WC_SUCCESS


def test_a_thread_that_drives_its_waits_leaves_the_progress_thread_asleep(
        two_udp_devices: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A thread that blocks in get_cq_event drives the device itself; neither the
    start nor the end of its wait wakes the progress thread, which would take the
    next datagram from it and hand the GIL and the lock between the two threads
    on every message (the standing back is made a minute long: only a wakeup
    can end it)."""
    monkeypatch.setattr(udp, "POLLER_STANDS_BACK", 60.0)
    monkeypatch.setattr(udp, "STAND_BACK_SLEEP", 60.0)
    by_thread: list[UdpRuntime] = []  # the runtimes whose progress thread ran progress

    class Counted(UdpRuntime):
        def progress(self) -> bool:
            if threading.current_thread() is self._thread:
                by_thread.append(self)
            return UdpRuntime.progress(self)

    _open_udp_as(Counted, monkeypatch)
    name_tx, name_rx = two_udp_devices
    with Context(name=name_tx) as tx, Context(name=name_rx) as rx:
        channel = CompChannel(rx)
        cq_tx, qp_tx, cq_rx, qp_rx, wr, recvs = _ud_pair(tx, rx, channel)
        rt = rx.runtime
        assert isinstance(rt, Counted)
        qp_rx.post_recv(recvs[0])
        assert cq_rx.poll(1)[0] == 0  # a poller: the thread stands back from now on
        for i in range(20):
            qp_rx.post_recv(recvs[(i + 1) % 2])
            cq_rx.req_notify()
            qp_tx.post_send(wr)
            assert cq_tx.poll(1)[0] == 1  # the send queue's slot back
            channel.get_cq_event(cq_rx, timeout=5.0)
            cq_rx.ack_events(1)
            n, wcs = cq_rx.poll(1)
            assert n == 1 and wcs[0].status == IBV_WC_SUCCESS, f"message {i}"
        ran = [r for r in by_thread if r is rt]  # the receiver's; the sender's may run
        assert ran == [], f"the progress thread ran {len(ran)} times"
