"""``softverbs srq-pingpong``: rdma-core's ``ibv_srq_pingpong`` on softverbs.

RC ping-pong over several QPs whose receives all come from one shared
receive queue.  Options, rendezvous and output follow ``ibv_srq_pingpong``
(rdma-core ``libibverbs/examples``), so either end may be the C tool::

    softverbs srq-pingpong                 # server
    softverbs srq-pingpong SERVER          # client

Theory of operation
-------------------
1. **Resources.**  One buffer of ``size`` bytes (zeroed) and an MR with
   local write access, one CQ of ``rx_depth + num_qp`` entries (on a
   completion channel with ``-e``), one SRQ of ``rx_depth`` WRs with one
   SGE, and ``num_qp`` RC QPs on the CQ and the SRQ, each with one send WR
   and one send SGE, moved to INIT with no remote rights.  ``rx_depth``
   receives are posted to the SRQ.
2. **Rendezvous** over TCP (port 18515 by default): each side sends one
   ``"%04x:%06x:%06x:%s"`` message (LID, QPN, a random PSN, the GID of
   ``-g``) per QP -- always 256 of them, the C tool's ``MAX_QP``, the unused
   ones zero -- the client first; the server reads all, connects, answers
   with its own 256, and waits for the client's ``"done\\0"``.  QP *i*
   connects to the peer's QP *i* (RTR with ``min_rnr_timer`` 12, RTS with
   ``timeout`` 14, ``retry_cnt`` 7, ``rnr_retry`` 7); the route is global
   only if the peer's first message carried a GID.  Without ``-g`` on RoCE
   the connect fails, as with rxe; softverbs picks the first IPv4 RoCEv2
   GID when ``-g`` is not given (``-g -1``: none).
3. **Ping-pong.**  The client posts one send on every QP.  Each QP takes
   turns: its next send goes when its previous send and a receive on it
   have completed.  The SRQ is refilled to ``rx_depth`` whenever ``num_qp``
   or fewer receives remain.  The run ends when ``iters`` sends and
   ``iters`` receives have completed in all (the C tool's count, though its
   help says "per QP").
4. **Report** as the C tool: bytes (``size * iters * 2``) and time.

Errors print the C tool's message on stderr and exit with status 1.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys

from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    SRQ,
    CompChannel,
    PyverbsError,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    SrqAttr,
    SrqInitAttr,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_QPT_RC,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
    IBV_WR_SEND,
    bytes_to_mtu,
)
from softverbs.samples import rendezvous as rv
from softverbs.samples.pingpong import (
    DONE,
    MSG_SIZE,
    RECV_WRID,
    SEND_WRID,
    Dest,
    _device_name,
    _make,
    _opt,
    _uint,
    add_options,
    check_common,
    next_completions,
    post_recvs,
    timed,
    wc_failure,
)
from softverbs.samples.rendezvous import PingPongError
from softverbs.verbs.addr import default_gid_index

MAX_QP = 256  #: the C tool's MAX_QP: messages each side sends in the rendezvous
PAGE = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "rdma-core's ibv_srq_pingpong on softverbs: RC ping-pong over several QPs sharing one "
        "SRQ. Without SERVER, wait for a client on the TCP port; with SERVER, connect to it."
    )
    num_qp = _opt("-q", "--num-qp", type=_uint, default=16, metavar="NUM",
                  help="number of QPs to use (default 16)")  # fmt: skip
    add_options(parser, ("server", "port", "ib_dev", "ib_port", "size", "mtu", "num_qp",
                         "rx_depth", "iters", "sl", "events", "gid_idx", "odp", "chk"),
                tool="ibv_srq_pingpong", size=4096, own={"num_qp": num_qp})  # fmt: skip


def _check_options(args: argparse.Namespace) -> None:
    check_common(args)
    if args.size < 1:
        raise PingPongError("size must be at least 1")
    if not 1 <= args.num_qp <= MAX_QP:
        raise PingPongError(f"num-qp {args.num_qp} is out of range (1 to {MAX_QP})")
    if args.num_qp > args.rx_depth:
        raise PingPongError(f"rx_depth {args.rx_depth} is too small for {args.num_qp} QPs -- "
                            "must have at least one receive per QP.")  # fmt: skip
    if args.odp:
        raise PingPongError("The device isn't ODP capable or does not support RC send "
                            "and receive with ODP")  # fmt: skip


class SrqPingPong:
    """One end: the C tool's ``struct pingpong_context`` with its SRQ and QPs."""

    def __init__(self, args: argparse.Namespace, devname: str) -> None:
        from softverbs import Context

        self.args = args
        self.size: int = args.size
        self.num_qp: int = args.num_qp
        self.rx_depth: int = args.rx_depth
        self.port: int = args.ib_port
        self.send_flags = IBV_SEND_SIGNALED
        self.channel: CompChannel | None = None
        self.pending = [0] * self.num_qp
        self.qps: list[QP] = []
        try:
            self.ctx = Context(name=devname)
        except PyverbsError as exc:
            raise PingPongError(f"Couldn't get context for {devname}\n{exc}") from None
        if args.gid_idx is None:
            args.gid_idx = default_gid_index(self.ctx, self.port)
        try:
            self._init()
        except BaseException:
            self.close()
            raise

    def _init(self) -> None:
        ctx = self.ctx
        if self.args.events:
            self.channel = _make(CompChannel, "Couldn't create completion channel", ctx)
        self.pd = _make(PD, "Couldn't allocate PD", ctx)
        self.mr = _make(MR, "Couldn't register MR", self.pd, self.size, IBV_ACCESS_LOCAL_WRITE)
        self.buf = self.mr.view
        self.cq = _make(CQ, "Couldn't create CQ", ctx, self.rx_depth + self.num_qp, None,
                        self.channel, 0)  # fmt: skip
        self.srq = _make(SRQ, "Couldn't create SRQ", self.pd,
                         SrqInitAttr(SrqAttr(max_wr=self.rx_depth, max_sge=1)))  # fmt: skip
        cap = QPCap(max_send_wr=1, max_send_sge=1, max_recv_wr=0, max_recv_sge=0)
        for i in range(self.num_qp):
            init = QPInitAttr(qp_type=IBV_QPT_RC, scq=self.cq, rcq=self.cq, srq=self.srq,
                              cap=cap)  # fmt: skip
            qp = _make(QP, f"Couldn't create QP[{i}]", self.pd, init)
            self.qps.append(qp)
            _, init_attr = qp.query(0)
            if init_attr.cap.max_inline_data >= self.size:
                self.send_flags |= IBV_SEND_INLINE
        for i, qp in enumerate(self.qps):
            rv.modify(qp, rv.init_attrs(IBV_QPT_RC, self.port), f"QP[{i}]")

    def local_dests(self, gidx: int) -> list[Dest]:
        lid = rv.port_lid(self.ctx, self.port)
        gid = rv.local_gid(self.ctx, self.port, gidx, "Could not get local gid for gid index")
        return [Dest(lid, qp.qp_num, random.getrandbits(24), gid) for qp in self.qps]

    def connect(self, mine: list[Dest], remote: list[Dest]) -> None:
        """``pp_connect_ctx``: QP *i* to the peer's QP *i*, INIT -> RTR -> RTS."""
        first = remote[0]
        for i, qp in enumerate(self.qps):
            dest = remote[i]
            # the C tool looks at the first message's GID for every QP
            ah = rv.ah_attr(lid=dest.lid, gid=first.gid, sl=self.args.sl, port=self.port,
                            sgid_index=self.args.gid_idx)  # fmt: skip
            rv.connect(qp, IBV_QPT_RC, dest_qpn=dest.qpn, rq_psn=dest.psn, sq_psn=mine[i].psn,
                       mtu=bytes_to_mtu(self.args.mtu), ah=ah, which=f"QP[{i}]")  # fmt: skip

    def post_recv(self, n: int) -> int:
        wr = RecvWR(RECV_WRID, 1, [SGE(self.mr.buf, self.size, self.mr.lkey)])
        return post_recvs(self.srq, wr, n)

    def post_send(self, index: int) -> None:
        wr = SendWR(SEND_WRID, IBV_WR_SEND, 1, sg=[SGE(self.mr.buf, self.size, self.mr.lkey)],
                    send_flags=self.send_flags)  # fmt: skip
        try:
            self.qps[index].post_send(wr)
        except PyverbsError as exc:
            raise PingPongError(f"Couldn't post send\n{exc}") from None

    def run_loop(self, iters: int, routs: int) -> None:
        by_qpn = {qp.qp_num: i for i, qp in enumerate(self.qps)}
        rcnt = scnt = 0
        num_cq_events = 0
        cq, channel = self.cq, self.channel
        while rcnt < iters or scnt < iters:
            wcs = next_completions(cq, channel, self.num_qp + self.rx_depth)
            num_cq_events += channel is not None
            for wc in wcs:
                if wc.status != IBV_WC_SUCCESS:
                    raise wc_failure(wc)
                index = by_qpn.get(wc.qp_num)
                if index is None:
                    raise PingPongError(f"Couldn't find QPN {wc.qp_num:06x}")
                if wc.wr_id == SEND_WRID:
                    scnt += 1
                elif wc.wr_id == RECV_WRID:
                    routs -= 1
                    if routs <= self.num_qp:
                        routs += self.post_recv(self.rx_depth - routs)
                        if routs < self.rx_depth:
                            raise PingPongError(f"Couldn't post receive ({routs})")
                    rcnt += 1
                else:
                    raise PingPongError(f"Completion for unknown wr_id {wc.wr_id}")
                self.pending[index] &= ~wc.wr_id
                if scnt < iters and not self.pending[index]:
                    self.post_send(index)
                    self.pending[index] = RECV_WRID | SEND_WRID
        if num_cq_events:
            cq.ack_events(num_cq_events)

    def close(self) -> None:
        for obj in (*self.qps, getattr(self, "srq", None), getattr(self, "cq", None),
                    getattr(self, "mr", None), getattr(self, "pd", None), self.channel,
                    self.ctx):  # fmt: skip
            if obj is not None:
                obj.close()


# --- the rendezvous: MAX_QP messages each way -------------------------------------------


def _wire(dests: list[Dest]) -> bytes:
    blank = Dest(0, 0, 0, bytes(16))
    return b"".join((dests[i] if i < len(dests) else blank).to_wire() for i in range(MAX_QP))


def _read_dests(sock: socket.socket, who: str) -> list[Dest]:
    out = []
    for i in range(MAX_QP):
        msg = rv.recv_exact(sock, MSG_SIZE)
        if len(msg) != MSG_SIZE:
            raise PingPongError(f"{len(msg)}/{MSG_SIZE}: Couldn't read remote address [{i}]")
        try:
            out.append(Dest.from_wire(msg))
        except ValueError as exc:
            raise PingPongError(f"{who}: Couldn't read remote address [{i}]: {exc}") from None
    return out


def client_exchange(server: str, port: int, mine: list[Dest]) -> list[Dest]:
    with rv.tcp_connect(server, port) as sock:
        try:
            sock.sendall(_wire(mine))
        except OSError:
            raise PingPongError("Couldn't send local address") from None
        remote = _read_dests(sock, "client read")
        try:
            sock.sendall(DONE)
        except OSError as exc:
            raise PingPongError(f"client write: {exc}") from None
    return remote


def server_exchange(port: int, pp: SrqPingPong, mine: list[Dest]) -> list[Dest]:
    with rv.tcp_serve_one(port) as conn:
        remote = _read_dests(conn, "server read")
        try:
            pp.connect(mine, remote)
        except PingPongError as exc:
            raise PingPongError(f"{exc}\nCouldn't connect to remote QP") from None
        try:
            conn.sendall(_wire(mine))
        except OSError:
            raise PingPongError("Couldn't send local address") from None
        done = rv.recv_exact(conn, len(DONE))
        if len(done) != len(DONE):
            raise PingPongError("client write: the client did not say done")
    return remote


# --- main ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    try:
        _check_options(args)
        pp = SrqPingPong(args, _device_name(args.ib_dev))
        try:
            return _session(pp, args)
        finally:
            pp.close()
    except PingPongError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


def _session(pp: SrqPingPong, args: argparse.Namespace) -> int:
    routs = pp.post_recv(pp.rx_depth)
    if routs < pp.rx_depth:
        raise PingPongError(f"Couldn't post receive ({routs})")
    if pp.channel is not None:
        pp.cq.req_notify(False)
    mine = pp.local_dests(args.gid_idx)
    for d in mine:
        print(d.line("local"), flush=True)
    if args.server:
        remote = client_exchange(args.server, args.port, mine)
    else:
        remote = server_exchange(args.port, pp, mine)
    for d in remote[: pp.num_qp]:
        print(d.line("remote"), flush=True)
    if args.server:
        pp.connect(mine, remote)
        if args.chk:  # a known byte at the start of every page: the server checks them
            pages = len(range(0, pp.size, PAGE))
            pp.buf[0 : pp.size : PAGE] = bytes(i & 0xFF for i in range(pages))
        for i in range(pp.num_qp):
            pp.post_send(i)
            pp.pending[i] = SEND_WRID | RECV_WRID
    else:
        pp.pending = [RECV_WRID] * pp.num_qp
    timed(lambda: pp.run_loop(args.iters, routs), args.size, args.iters)
    if not args.server and args.chk:
        for page, byte in enumerate(pp.buf[0 : pp.size : PAGE]):
            if byte != page & 0xFF:
                print(f"invalid data in page {page}")
    sys.stdout.flush()
    return 0
