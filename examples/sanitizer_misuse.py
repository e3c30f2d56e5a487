"""Programs that commit the misuse each sanitizer check reports (docs/sanitizer.md).

Run one with ``softverbs exec --sanitize -- python examples/sanitizer_misuse.py mr-in-use``.

``python sanitizer_misuse.py CHECK`` runs the program for one check on
device ``sv0`` -- in-process or the host device, as the environment says --
with ``SOFTVERBS_SANITIZE`` set by the caller.  Each program does the wrong
thing once, then carries on as a careless program would; it prints ``done``
at the end.  Apart from the misuse they are correct: with the misuse taken
out (``python sanitizer_misuse.py CHECK --correct``) they produce no report.
"""

from __future__ import annotations

import mmap
import os
import sys
import time

from verbs_kit import ACCESS, GID, QKEY, Side, close, connect, pair, state_attr

from softverbs import (
    AH,
    MR,
    MW,
    PD,
    SGE,
    SRQ,
    AHAttr,
    Context,
    GlobalRoute,
    MWBindInfo,
    RecvWR,
    SendWR,
    SrqAttr,
    SrqInitAttr,
    hostmem,
)
from softverbs.enums import (
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MW_TYPE_2,
    IBV_QPS_ERR,
    IBV_QPT_UD,
    IBV_SEND_DEFER,
    IBV_SEND_SIGNALED,
    IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)


def send_buffer_changed(correct: bool) -> None:
    a, b = pair()
    a.mr.write(b"x" * 64, 64, 0)
    a.send(1)  # b has no receive: RNR NAK, the SEND waits
    time.sleep(0.05)
    if not correct:
        a.mr.write(b"y" * 64, 64, 0)  # misuse: the buffer changes before the completion
    b.recv(2)
    assert len(a.wait(1)) == 1 and len(b.wait(1)) == 1
    close(a, b)


def mr_in_use(correct: bool) -> None:
    a, b = pair()
    a.send(1)  # b has no receive: the SEND stays outstanding
    time.sleep(0.05)
    if not correct:
        a.mr.close()  # misuse: the MR of an outstanding SEND
    b.recv(2)
    a.wait(1)
    b.wait(1) if correct else None
    a.qp.close()
    if correct:
        a.mr.close()
    a.cq.close()
    close(b)


def mw_in_use(correct: bool) -> None:
    """With ``--remote`` (and SOFTVERBS_FAULTS losing all but a WRITE's first packet):
    the window is deallocated while the peer's RDMA WRITE through it is in progress."""
    a, b = pair()
    if "--remote" in sys.argv:
        mw = MW(b.pd, IBV_MW_TYPE_2)
        bind = SendWR(9, IBV_WR_BIND_MW, send_flags=IBV_SEND_SIGNALED)
        bind.set_bind_wr(mw, MWBindInfo(b.mr, b.mr.buf, 4096, IBV_ACCESS_REMOTE_WRITE))
        b.qp.post_send(bind)
        assert b.wait(1)[0].status == 0
        write = SendWR(10, IBV_WR_RDMA_WRITE, 1, sg=[SGE(a.mr.buf, 3000, a.mr.lkey)])
        write.set_wr_rdma(mw.rkey, b.mr.buf)
        a.qp.post_send(write)  # three packets: the first arrives, the rest are lost
        time.sleep(0.1)
        b.cq.poll(1)  # the device delivers what is due
        if not correct and "--invalidate" in sys.argv:
            inv = SendWR(11, IBV_WR_LOCAL_INV, send_flags=IBV_SEND_SIGNALED)
            inv.invalidate_rkey = mw.rkey
            b.qp.post_send(inv)  # misuse: a WRITE through it is half done
            b.wait(1)
        elif not correct:
            mw.close()  # misuse: a WRITE through it is half done
        a.qp.close()
        b.qp.close()
        if correct:
            mw.close()  # no QP uses it any more
        for side in (a, b):
            side.mr.close()
            side.cq.close()
        a.pd.close()
        return
    mw = MW(a.pd, IBV_MW_TYPE_2)
    wr = SendWR(9, IBV_WR_BIND_MW, send_flags=IBV_SEND_SIGNALED | IBV_SEND_DEFER)
    wr.set_bind_wr(mw, MWBindInfo(a.mr, a.mr.buf, 4096, IBV_ACCESS_REMOTE_WRITE))
    a.qp.post_send(wr)  # deferred: the bind is outstanding
    if not correct:
        mw.close()  # misuse: the window a posted BIND_MW names
    a.send(10)  # rings the doorbell for both
    b.recv(11)
    a.wait(2)
    if correct:
        mw.close()
    close(a, b)


def mr_unmapped(correct: bool) -> None:
    """A region registered by address is unmapped and a file mapped at the same
    address; the peer's RDMA WRITE through the old rkey fails (the host device
    checks a region's mapping before each access).  Correct: deregister first."""
    a, b = pair()
    length = 8192
    addr = hostmem.mmap(length=length)
    mr = MR(b.pd, length, ACCESS, address=addr)
    rkey = mr.rkey
    if correct:
        mr.close()  # the region goes before its memory does
        rkey, target = b.mr.rkey, b.mr.buf
    else:
        target = addr
    hostmem.munmap(addr, length)  # misuse (unless deregistered): the memory of a region
    fd = os.memfd_create("other", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, length)
    hostmem.mmap(addr, length, flags=mmap.MAP_SHARED | hostmem.MAP_FIXED_, fd=fd)
    write = SendWR(1, IBV_WR_RDMA_WRITE, 1, sg=[SGE(a.mr.buf, 64, a.mr.lkey)])
    write.set_wr_rdma(rkey, target)
    a.qp.post_send(write)
    status = [wc.status for wc in a.wait(1)]  # type: ignore[attr-defined]
    assert os.pread(fd, 64, 0) == bytes(64), "the WRITE reached the new mapping"
    assert status == [0 if correct else 10], status  # IBV_WC_REM_ACCESS_ERR
    hostmem.munmap(addr, length)
    os.close(fd)
    if not correct:
        mr.close()
    close(a, b)


def ah_in_use(correct: bool) -> None:
    ctx = Context(name="sv0")
    pd = PD(ctx)
    a = Side(ctx, pd, qp_type=IBV_QPT_UD)
    ah = AH(pd, attr=AHAttr(port_num=1, is_global=1,
                            gr=GlobalRoute(dgid=ctx.query_gid(1, GID), sgid_index=GID)))
    wr = SendWR(1, IBV_WR_SEND, 1, send_flags=IBV_SEND_SIGNALED | IBV_SEND_DEFER,
                sg=[SGE(a.mr.buf, 64, a.mr.lkey)])
    wr.set_wr_ud(ah, a.qp.qp_num, QKEY)
    a.qp.post_send(wr)  # deferred: written, not yet handed to the device
    if not correct:
        ah.close()  # misuse: the AH of an outstanding WR
    if not correct:
        ah.close()  # misuse: the AH of an outstanding WR
        ah = AH(pd, attr=AHAttr(port_num=1, is_global=1,
                                gr=GlobalRoute(dgid=ctx.query_gid(1, GID), sgid_index=GID)))
    wr2 = SendWR(2, IBV_WR_SEND, 1, send_flags=IBV_SEND_SIGNALED, sg=[SGE(a.mr.buf, 64, a.mr.lkey)])
    wr2.set_wr_ud(ah, a.qp.qp_num, QKEY)
    a.qp.post_send(wr2)  # rings the doorbell for both
    a.wait(2)
    ah.close()
    close(a)


def unsignaled_send_queue(correct: bool) -> None:
    a, b = pair(sig_all=0, depth=4)
    for i in range(4):
        b.recv(100 + i)
    for i in range(4):  # misuse: four unsignaled WRs fill the queue for good
        a.send(i, flags=IBV_SEND_SIGNALED if correct and i == 3 else 0)
    a.wait(1) if correct else None
    b.wait(4)
    close(a, b)


def send_queue_full(correct: bool) -> None:
    a, b = pair(sig_all=0, depth=4)
    for i in range(4):
        b.recv(100 + i)
    for i in range(6):
        if i == 4:
            b.wait(4)
            for j in range(4):
                b.recv(200 + j)
        try:
            a.send(i, flags=IBV_SEND_SIGNALED if correct and i % 2 else 0)
        except Exception as exc:  # ENOMEM: the queue is full of unsignaled WRs
            print(f"post {i}: {exc}"[:60])
        if correct and i % 2:
            a.wait(1)
    b.wait(2 if correct else 0)
    close(a, b)


def cq_too_small(correct: bool) -> None:
    a, b = pair(cqe=32 if correct else 8, depth=8)
    a.recv(1)
    for i in range(8):
        b.recv(100 + i)
    b.send(1)  # misuse: 8 receives and 1 signaled send may complete into a CQ of 8
    assert len(b.wait(1)) == 1 and len(a.wait(1)) == 1
    close(a, b)


def cq_overrun(correct: bool) -> None:
    a, b = pair(cqe=4 if not correct else 32, depth=8)
    for i in range(6):
        b.recv(100 + i)
    for i in range(6):
        a.send(i)
        if correct:
            a.wait(1)
            b.wait(1)
    time.sleep(0.1)
    a.qp.close()
    b.qp.close()
    for s in (a, b):
        s.mr.close()
        s.cq.close()
    a.pd.close()


def qp_destroyed_while_flushing(correct: bool) -> None:
    a, b = pair()
    for i in range(4):
        b.recv(100 + i)
    b.qp.modify(state_attr(IBV_QPS_ERR), 1)  # IBV_QP_STATE: flush the receives
    if correct:
        assert len(b.wait(4)) == 4
    b.close()  # misuse unless polled: the flush's completions are discarded
    close(a)


def srq_qp_destroyed_early(correct: bool) -> None:
    """Run with SOFTVERBS_FAULTS dropping every SEND packet after the first:
    the receiving QP holds an SRQ WQE for a message that never ends."""
    ctx = Context(name="sv0")
    pd = PD(ctx)
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8)))
    a, b = Side(ctx, pd), Side(ctx, pd, srq=srq)
    connect(a, b)
    connect(b, a)
    srq.post_recv(RecvWR(100, 1, [SGE(b.mr.buf, 4096, b.mr.lkey)]))
    a.send(1, length=3000)  # three packets: the first arrives, the rest are lost
    time.sleep(0.1)
    b.cq.poll(1)  # the in-process device runs when called: the first packet arrives now
    if correct:
        b.qp.to_error() if hasattr(b.qp, "to_error") else b.qp.modify(state_attr(IBV_QPS_ERR), 1)
        b.wait(1)
    b.close()  # misuse unless moved to ERR first: the SRQ WQE is lost
    a.close()
    srq.close()
    pd.close()


def deferred_wr_never_rung(correct: bool) -> None:
    a, b = pair()
    b.recv(100)
    a.send(1, flags=IBV_SEND_SIGNALED | IBV_SEND_DEFER)  # written, not rung
    if "--late" in sys.argv:  # the program goes on: reported after deferred_timeout
        a.recv(101)  # the device sees the unrung WR from this doorbell on
        time.sleep(1.2)
        b.send(2)
        assert len(a.wait(1)) == 1
    if correct:
        a.send(2)  # the chain ends with a post that is not deferred
        a.wait(2)
        b.wait(1)
        close(a, b)
    # misuse: exit with the deferred WR never handed to the device


def leak(correct: bool) -> None:
    a, b = pair()
    if correct:
        a.close()
        b.close()
        a.pd.close()
    # misuse: exit with the QPs, CQs, MRs and the PD never destroyed


PROGRAMS = {name.replace("_", "-"): fn for name, fn in list(globals().items())
            if callable(fn) and fn.__module__ == __name__ and not name.startswith("_")
            and name not in ("connect", "pair", "Side")}


if __name__ == "__main__":
    PROGRAMS[sys.argv[1]]("--correct" in sys.argv)
    print("done", flush=True)
