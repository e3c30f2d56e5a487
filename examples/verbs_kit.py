"""Two RC QPs connected to each other on one device, as the examples and the
tutorial (docs/tutorial.md) use them: ``a, b = pair()``.

Each :class:`Side` holds a CQ, a QP and a 64 KiB MR on a shared PD, with
helpers to post a SEND or a receive from the MR and to poll.  The device is
``sv0``: the host device, or the process's own with ``SOFTVERBS_SERVICE=0``.
"""

from __future__ import annotations

import time

from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    AHAttr,
    Context,
    GlobalRoute,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_1024,
    IBV_QPT_RC,
    IBV_SEND_SIGNALED,
    IBV_WR_SEND,
)

ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
          | IBV_ACCESS_MW_BIND)
GID = 1
QKEY = 0x11111111


class Side:
    def __init__(self, ctx: Context, pd: PD, cqe: int = 64, depth: int = 16,
                 sig_all: int = 1, qp_type: int = IBV_QPT_RC, srq: object = None) -> None:
        self.ctx, self.pd = ctx, pd
        self.cq = CQ(ctx, cqe)
        init = QPInitAttr(qp_type=qp_type, scq=self.cq, rcq=self.cq,
                          cap=QPCap(depth, depth, 1, 1), sq_sig_all=sig_all)
        if srq is not None:
            init.srq = srq
        attr = QPAttr()
        attr.qkey = QKEY
        attr.qp_access_flags = ACCESS & ~IBV_ACCESS_MW_BIND  # remote access is set in INIT
        self.qp = QP(pd, init, attr)  # a UD QP goes to RTS at once
        self.mr = MR(pd, 1 << 16, ACCESS)

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq):
            obj.close()

    def send(self, wr_id: int, length: int = 64, flags: int = IBV_SEND_SIGNALED) -> None:
        self.qp.post_send(SendWR(wr_id, IBV_WR_SEND, 1, send_flags=flags,
                                 sg=[SGE(self.mr.buf, length, self.mr.lkey)]))

    def recv(self, wr_id: int, length: int = 4096) -> None:
        self.qp.post_recv(RecvWR(wr_id, 1, [SGE(self.mr.buf + 8192, length, self.mr.lkey)]))

    def wait(self, n: int, deadline: float = 10.0) -> list[object]:
        got: list[object] = []
        end = time.monotonic() + deadline
        while len(got) < n and time.monotonic() < end:
            got += self.cq.poll(n - len(got))[1]
        return got


def connect(me: Side, peer: Side) -> None:
    attr = QPAttr()
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num = peer.qp.qp_num
    attr.path_mtu = IBV_MTU_1024
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 4
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 1
    attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=peer.ctx.query_gid(1, GID),
                                                      sgid_index=GID))
    me.qp.to_rts(attr)


def close(*sides: Side) -> None:
    for s in sides:
        s.close()
    sides[0].pd.close()


def pair(**kw: int) -> tuple[Side, Side]:
    ctx = Context(name="sv0")
    pd = PD(ctx)
    a, b = Side(ctx, pd, **kw), Side(ctx, pd, **kw)
    connect(a, b)
    connect(b, a)
    return a, b


def state_attr(state: int) -> QPAttr:
    attr = QPAttr()
    attr.qp_state = state
    return attr
