"""A short pyverbs session that puts most opcodes on the wire (for the pcap tap tests).

Run as a program (``python tests/kits/pcap_session.py DEV_A DEV_B``) it uses
the process's devices, so ``SOFTVERBS_PCAP`` and ``SOFTVERBS_FAULTS`` apply;
imported, :func:`session` runs inside whatever :class:`Simulation` is active.
It exercises, between two devices:

* RC over the IPv4-mapped GID (index 1) and over the IPv6 link-local GID
  (index 0): a 3-packet SEND (the first one while no receive WQE is posted,
  which costs an RNR NAK), an RDMA WRITE with immediate, a 5-packet RDMA
  READ, fetch-and-add and compare-and-swap;
* UC: a SEND and an RDMA WRITE;
* UD: a SEND with immediate, through an address handle.

Every completion must succeed; the function raises otherwise.  RC recovers
what ``SOFTVERBS_FAULTS`` drops by itself; UC and UD do not, so the session
sends their messages again, as an application of an unreliable transport
does, until the receiver completes.  (Which packets a seeded fault layer
drops follows from how many went before; the number of RNR retries, and so
of packets, varies from run to run with the timing.)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from softverbs import (
    AH,
    CQ,
    MR,
    PD,
    QP,
    SGE,
    AHAttr,
    Context,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    counters,
    testing,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_WC_SUCCESS,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM,
)

ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
          | IBV_ACCESS_REMOTE_ATOMIC)  # fmt: skip
QKEY = 0x11111111
RESEND_AFTER = 1.0  #: seconds a UC or UD receiver is given before the message goes again
SENDS = 8  #: UC and UD: sends of a message at most


class End:
    """One QP with its PD, CQ and a 64 KiB MR."""

    def __init__(self, ctx: Context, qp_type: int) -> None:
        self.ctx = ctx
        self.pd = PD(ctx)
        self.cq = CQ(ctx, 64)
        init = QPInitAttr(qp_type=qp_type, scq=self.cq, rcq=self.cq, cap=QPCap(16, 16, 1, 1),
                          sq_sig_all=1)  # fmt: skip
        attr = QPAttr()
        attr.qp_access_flags = ACCESS
        attr.qkey = QKEY
        self.qp = QP(self.pd, init, attr)
        self.mr = MR(self.pd, 1 << 16, ACCESS)

    def sge(self, off: int, n: int) -> SGE:
        return SGE(self.mr.buf + off, n, self.mr.lkey)

    def poll_for(self, n: int, seconds: float) -> int:
        """Up to ``n`` completions within ``seconds``, all successful: how many."""
        got = 0
        deadline = time.monotonic() + seconds
        while got < n and time.monotonic() <= deadline:
            for wc in self.cq.poll(n - got)[1]:
                if wc.status != IBV_WC_SUCCESS:
                    raise RuntimeError(f"completion failed: {wc}")
                got += 1
        return got

    def wait(self, n: int = 1) -> None:
        got = self.poll_for(n, 10)
        if got < n:
            raise RuntimeError(f"{got} of {n} completions after 10 s")


def route(ctx: Context, gid_index: int) -> AHAttr:
    ah: AHAttr = testing.route(ctx, gid_index)
    return ah


def connect(me: End, peer: End, gid_index: int) -> None:
    testing.connect_qp(me.qp, peer.qp.qp_num, route(peer.ctx, gid_index), qp_access_flags=ACCESS,
                       timeout=10)  # fmt: skip


def pair(ca: Context, cb: Context, qp_type: int, gid_index: int) -> tuple[End, End]:
    a, b = End(ca, qp_type), End(cb, qp_type)
    connect(a, b, gid_index)
    connect(b, a, gid_index)
    return a, b


def rdma(a: End, b: End, wr_id: int, opcode: int, off: int, n: int, **extra: int) -> SendWR:
    wr = SendWR(wr_id, opcode, 1, sg=[a.sge(off, n)])
    wr.remote_addr = b.mr.buf + off
    wr.rkey_remote = b.mr.rkey
    for name, value in extra.items():
        setattr(wr, name, value)
    return wr


def unreliable(a: End, b: End, post: Callable[[], int]) -> None:
    """Send with ``post`` (which returns how many completions it makes on
    ``a``) until ``b``'s receive completes: UC and UD lose what is dropped."""
    for _ in range(SENDS):
        a.wait(post())
        if b.poll_for(1, RESEND_AFTER):
            return
    raise RuntimeError(f"no receive completion after {SENDS} sends")


def session(name_a: str, name_b: str) -> None:
    ca, cb = Context(name=name_a), Context(name=name_b)
    for gid_index in (1, 0):
        a, b = pair(ca, cb, IBV_QPT_RC, gid_index)
        rnr = counters(ca)["rcvd_rnr_err"]
        a.qp.post_send(SendWR(1, IBV_WR_SEND, 1, sg=[a.sge(0, 3000)]))
        deadline = time.monotonic() + 10
        while counters(ca)["rcvd_rnr_err"] == rnr:  # no receive WQE yet: an RNR NAK
            b.cq.poll(1)
            if time.monotonic() > deadline:
                raise RuntimeError("the SEND without a receive WQE drew no RNR NAK")
        b.qp.post_recv(RecvWR(1, 1, [b.sge(0, 4096)]))
        b.qp.post_recv(RecvWR(2, 1, [b.sge(4096, 64)]))
        a.wait()
        b.wait()
        a.qp.post_send(rdma(a, b, 2, IBV_WR_RDMA_WRITE_WITH_IMM, 8192, 1500, imm_data=0x1234))
        a.wait()
        b.wait()
        a.qp.post_send(rdma(a, b, 3, IBV_WR_RDMA_READ, 16384, 5000))
        a.qp.post_send(rdma(a, b, 4, IBV_WR_ATOMIC_FETCH_AND_ADD, 32768, 8, compare_add=5))
        a.qp.post_send(rdma(a, b, 5, IBV_WR_ATOMIC_CMP_AND_SWP, 32768, 8, compare_add=5,
                            swap=9))  # fmt: skip
        a.wait(3)
    a, b = pair(ca, cb, IBV_QPT_UC, 1)
    b.qp.post_recv(RecvWR(1, 1, [b.sge(0, 4096)]))

    def uc() -> int:
        a.qp.post_send(SendWR(1, IBV_WR_SEND, 1, sg=[a.sge(0, 2000)]))
        a.qp.post_send(rdma(a, b, 2, IBV_WR_RDMA_WRITE, 8192, 700))
        return 2

    unreliable(a, b, uc)
    a, b = End(ca, IBV_QPT_UD), End(cb, IBV_QPT_UD)
    b.qp.post_recv(RecvWR(1, 1, [b.sge(0, 1024)]))
    ah = AH(a.pd, attr=route(cb, 1))
    wr = SendWR(1, IBV_WR_SEND_WITH_IMM, 1, sg=[a.sge(0, 500)], imm_data=0xBEEF)
    wr.set_wr_ud(ah, b.qp.qp_num, QKEY)

    def ud() -> int:
        a.qp.post_send(wr)
        return 1

    unreliable(a, b, ud)


if __name__ == "__main__":
    session(sys.argv[1], sys.argv[2])
