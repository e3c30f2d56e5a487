"""The pyverbs-style API across processes, through softverbsd's sv0.

Two processes, each its own Context on the service's sv0, connect RC QPs
and do SEND, RDMA WRITE, RDMA READ and both atomics; a receiver takes its
receives from an SRQ; completions wake a CompChannel; async events reach the
process that owns the object, and only that one.  Then memory isolation: a
process cannot use another's lkey or rkey through its own QPs (its PD is
not theirs), and cannot name another's objects by number.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from svkit import RcPeer, ServiceProc, SrqOwner, Worker

from softverbs.enums import (
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_QP_LAST_WQE_REACHED,
    IBV_EVENT_SRQ_LIMIT_REACHED,
    IBV_QPS_ERR,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_RDMA_READ,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
)


def _pair(spawn: Callable[..., Worker], **b_kw: bool) -> tuple[Worker, Worker]:
    a = spawn(RcPeer)
    b = spawn(RcPeer, False, b_kw.get("channel", False), b_kw.get("srq", False))
    a.call("connect", qpn=b.info["qpn"])
    b.call("connect", qpn=a.info["qpn"])
    return a, b


def test_rc_operations_between_processes(service: ServiceProc,
                                         spawn: Callable[..., Worker]) -> None:  # fmt: skip
    a, b = _pair(spawn)
    bi = b.info
    # SEND / RECV
    b.call("recv", n=1, off=0)
    a.call("send", data=b"hello from another process")
    assert a.call("poll", n=1) == [(IBV_WC_SUCCESS, IBV_WC_SEND, 26, a.info["qpn"])]
    assert b.call("poll", n=1) == [(IBV_WC_SUCCESS, IBV_WC_RECV, 26, bi["qpn"])]
    assert b.call("mr_read", off=0, length=26) == b"hello from another process"
    # RDMA WRITE into B's MR; B's CPU is not involved
    a.call("write", rkey=bi["rkey"], addr=bi["addr"] + 1000, data=b"written" * 300)
    assert a.call("poll", n=1)[0][:2] == (IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    assert b.call("mr_read", off=1000, length=2100) == b"written" * 300
    # RDMA READ from B's MR (multi-packet: 3000 bytes at MTU 1024)
    b.call("mr_write", off=5000, data=bytes(range(256)) * 12)
    a.call("read", rkey=bi["rkey"], addr=bi["addr"] + 5000, length=3000, off=2000)
    assert a.call("poll", n=1)[0][:3] == (IBV_WC_SUCCESS, IBV_WC_RDMA_READ, 3000)
    assert a.call("mr_read", off=2000, length=3000) == (bytes(range(256)) * 12)[:3000]
    # atomics on an 8-byte word of B's MR
    b.call("mr_write", off=8000, data=(40).to_bytes(8, "little"))
    a.call("atomic", kind="faa", rkey=bi["rkey"], addr=bi["addr"] + 8000, compare_add=2)
    assert a.call("poll", n=1)[0][:2] == (IBV_WC_SUCCESS, IBV_WC_FETCH_ADD)
    assert a.call("mr_read", off=4096, length=8) == (40).to_bytes(8, "little")
    a.call("atomic", kind="cas", rkey=bi["rkey"], addr=bi["addr"] + 8000, compare_add=42,
           swap=7)  # fmt: skip
    assert a.call("poll", n=1)[0][:2] == (IBV_WC_SUCCESS, IBV_WC_COMP_SWAP)
    assert a.call("mr_read", off=4096, length=8) == (42).to_bytes(8, "little")
    assert b.call("mr_read", off=8000, length=8) == (7).to_bytes(8, "little")
    assert b.call("nothing", seconds=0.05) == 0  # one-sided: no CQE at B
    a.finish()
    b.finish()
    st = service.wait_stats(lambda s: s["clients"] == 0, "both processes gone")
    assert st["engine_qps"] == 0 and st["keys"] == 0, st


def test_srq_and_completion_channel(service: ServiceProc,
                                    spawn: Callable[..., Worker]) -> None:  # fmt: skip
    a, b = _pair(spawn, channel=True, srq=True)
    b.call("recv", n=4)  # into B's SRQ
    b.call("arm")
    b.send("cq_event")  # B sleeps on its completion channel...
    a.call("send", data=b"wake up")  # ...until A's message completes there
    assert b.result() >= 1
    for i in range(3):
        a.call("send", data=f"msg {i}".encode(), off=64 * i)
    assert [s for s, *_ in a.call("poll", n=4)] == [IBV_WC_SUCCESS] * 4
    got = b.call("poll", n=2)
    assert all(w[:2] == (IBV_WC_SUCCESS, IBV_WC_RECV) for w in got), got


def test_async_events_reach_the_owner(service: ServiceProc,
                                      spawn: Callable[..., Worker]) -> None:  # fmt: skip
    a, b = _pair(spawn, srq=True)
    # A bad rkey: A's WR fails with REM_ACCESS_ERR; the access error is B's
    # QP's event (IBV_EVENT_QP_ACCESS_ERR), delivered to B's process.
    a.call("write", rkey=b.info["rkey"] ^ 0x5500, addr=b.info["addr"], data=b"x")
    assert a.call("poll", n=1)[0][0] == IBV_WC_REM_ACCESS_ERR
    ev = b.call("event")
    assert ev == (IBV_EVENT_QP_ACCESS_ERR, "QP", b.info["qpn"]), ev
    assert b.call("state") == IBV_QPS_ERR
    # B's QP takes its receives from an SRQ: in ERR it will take no more, and
    # says so with QP_LAST_WQE_REACHED -- to B, not to A.
    ev = b.call("event")
    assert ev == (IBV_EVENT_QP_LAST_WQE_REACHED, "QP", b.info["qpn"]), ev
    assert a.call("event", timeout=0.3) is None


def test_memory_isolation(service: ServiceProc, spawn: Callable[..., Worker]) -> None:
    a = spawn(RcPeer, True, False, False, 8)  # A: a looped QP pair and 9 MRs
    b = spawn(RcPeer, True)  # B: the same, one MR
    ai = a.info
    # B uses A's lkey (and A's address) in its own SEND: B's PD does not own
    # the key -> local protection error, and nothing of A's leaves.
    b.call("recv", n=1, qp2=True)
    b.call("send", data=b"steal", lkey=ai["lkey"], addr=ai["addr"])
    assert b.call("poll", n=1)[0][0] == IBV_WC_LOC_PROT_ERR
    # B uses its own lkey past the end of its own MR -> the same.  (A's
    # address means nothing in B: both may even map their MRs at the same
    # virtual address.)
    b2 = spawn(RcPeer, True)
    b2.call("recv", n=1, qp2=True)
    b2.call("send", data=b"steal", lkey=b2.info["lkey"], addr=b2.info["addr"] + 8190)
    assert b2.call("poll", n=1)[0][0] == IBV_WC_LOC_PROT_ERR
    # B writes to A's MR with A's rkey, through B's own QPs: the responder
    # QP is B's, in B's PD -> remote access error; A's memory is untouched.
    a.call("mr_write", off=0, data=b"A" * 64)
    b3 = spawn(RcPeer, True)
    b3.call("write", rkey=ai["rkey"], addr=ai["addr"], data=b"B" * 64)
    statuses = [s for s, *_ in b3.call("poll", n=1)]
    assert statuses == [IBV_WC_REM_ACCESS_ERR], statuses
    assert a.call("mr_read", off=0, length=64) == b"A" * 64
    # Handles belong to their process: B naming A's MR handles is refused
    # (EPERM), and A's MRs are untouched.
    assert not set(b.info["mr_numbers"]) & set(ai["mr_numbers"]), "handles are unique"
    for number in ai["mr_numbers"]:
        code, msg = b.call("raw", request="destroy", kind=3, handle=number, flags=0,
                           reserved=0)  # fmt: skip
        assert code == errno.EPERM and "belongs to another process" in msg, (code, msg)
    # ...and A's MRs still work: A writes through its own pair.
    a.call("recv", n=1, qp2=True, off=4096)
    a.call("send", data=b"still mine")
    assert [w[0] for w in a.call("poll", n=2)] == [IBV_WC_SUCCESS, IBV_WC_SUCCESS]
    for w in (b, b2, b3):
        w.kill()
    st = service.wait_stats(lambda s: s["clients"] == 1, "B's gone")
    assert st["objects"]["mr"] == 9, st
    a.finish()


def test_flush_in_another_process_does_not_leak(service: ServiceProc,
                                                spawn: Callable[..., Worker]) -> None:  # fmt: skip
    """A process moves its QP to ERR with receives posted: they flush to its
    own CQ; its peer in another process sees nothing."""
    a, b = _pair(spawn)
    b.call("recv", n=3)
    b.call("to_err")
    assert [w[0] for w in b.call("poll", n=3)] == [IBV_WC_WR_FLUSH_ERR] * 3
    assert a.call("nothing", seconds=0.1) == 0


def test_srq_limit_event_and_resize(service: ServiceProc, spawn: Callable[..., Worker]) -> None:
    """The SRQ limit is armed in the device (the service), fires once to the
    owner, and reads back disarmed; the SRQ and the CQ resize in the device
    (their rings move to new shared memory) and go on working."""
    a = spawn(RcPeer)
    b = spawn(SrqOwner)
    a.call("connect", qpn=b.info["qpn"])
    b.call("connect", qpn=a.info["qpn"])
    b.call("recv", n=4)
    assert b.call("srq_limit", limit=3) == 3
    a.call("send", data=b"one")
    a.call("send", data=b"two")  # 2 left < 3: the limit is reached
    assert [w[0] for w in a.call("poll", n=2)] == [IBV_WC_SUCCESS] * 2
    ev = b.call("event")
    assert ev is not None and ev[0] == IBV_EVENT_SRQ_LIMIT_REACHED, ev
    assert b.call("srq_query_limit") == 0  # one-shot: disarmed
    assert b.call("event", timeout=0.2) is None
    assert b.call("srq_resize", max_wr=32) == 0
    assert b.call("cq_resize", cqe=128) == 0
    b.call("recv", n=8)
    for word in (b"three", b"four", b"five"):
        a.call("send", data=word)
    assert [w[0] for w in a.call("poll", n=3)] == [IBV_WC_SUCCESS] * 3
    assert [w[0] for w in b.call("poll", n=5)] == [IBV_WC_SUCCESS] * 5


def test_faults_are_per_process(service: ServiceProc, spawn: Callable[..., Worker]) -> None:
    """FAULTS (a client's SOFTVERBS_FAULTS) acts on that process's packets
    only: A's loop loses every packet and its SEND exhausts its retries; B's
    loop, on the same device at the same time, is untouched.  Bad rules are
    EINVAL and change nothing."""
    a = spawn(RcPeer, True)
    b = spawn(RcPeer, True)
    assert a.call("faults", rules="seed=1;drop=1.0") == (0, "")
    for w in (a, b):
        w.call("recv", n=1, qp2=True)
        w.call("send", data=b"through the fault layer?")
    assert a.call("poll", n=1)[0][0] == IBV_WC_RETRY_EXC_ERR
    assert sorted(b.call("poll", n=2)) == [(IBV_WC_SUCCESS, IBV_WC_SEND, 24, b.info["qpn"]),
                                           (IBV_WC_SUCCESS, IBV_WC_RECV, 24, b.info["qp2n"])]
    code, msg = b.call("faults", rules="seed=1;drop=lots")
    assert code == errno.EINVAL and "FAULTS" in msg and "drop" in msg, msg
    b.call("recv", n=1, qp2=True)
    b.call("send", data=b"still fine")
    assert [w[0] for w in b.call("poll", n=2)] == [IBV_WC_SUCCESS] * 2
