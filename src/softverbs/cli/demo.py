"""``softverbs demo``: RC ping-pong between two queue pairs on one device.

This is rdma-core's ``ibv_rc_pingpong`` with both ends in one process.  A
*client* QP and a *server* QP are created on the embedded device (``sv0``)
with the pyverbs API, connected to each other, and then play ping-pong::

    client ──ping──►  server     (SEND, or RDMA WRITE with --op write)
    client ◄──pong──  server     (the server returns the bytes it received)

Read it top to bottom; it is the life of any RC program:

1. open the device and create a PD, a CQ, an MR and an RC QP per side;
2. move each QP RESET -> INIT -> RTR -> RTS, giving it the other side's QP
   number, PSN and GID -- the "address" that ``ibv_rc_pingpong`` sends
   over TCP and that we simply hand over in memory (:class:`Dest`);
3. post work requests and poll completions.  Every completion must be
   ``IBV_WC_SUCCESS`` and every message must carry exactly the bytes that
   were sent, or the demo stops with an error and exit status 1.

With ``--op send`` the receiver learns that a message arrived from a receive
completion.  With ``--op write`` the receiver posts nothing and gets no
completion -- that is what one-sided means -- so, like perftest's
``ib_write_lat``, it watches the last byte of its buffer change.

The summary has perftest's header and result table and ibv_rc_pingpong's
closing lines.  As in perftest's latency tests, ``t_*`` are one-way
latencies (half a round trip); ``usec/iter`` is a whole round trip, as
``ibv_rc_pingpong`` prints it.  Bandwidth counts both directions, as
``ibv_rc_pingpong`` does, and ``MiB`` is 2**20 bytes (perftest's unit).
Times include the payload checks, so they measure this Python program, not
a network.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from softverbs import (
    CQ,
    GID,
    MR,
    PD,
    QP,
    SGE,
    AHAttr,
    Context,
    GlobalRoute,
    PyverbsError,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    wc_status_str,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_LINK_LAYER_ETHERNET,
    IBV_MTU_256,
    IBV_MTU_512,
    IBV_MTU_1024,
    IBV_MTU_2048,
    IBV_MTU_4096,
    IBV_QPT_RC,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)

MTUS = {
    256: IBV_MTU_256,
    512: IBV_MTU_512,
    1024: IBV_MTU_1024,
    2048: IBV_MTU_2048,
    4096: IBV_MTU_4096,
}
PORT = 1
RX_DEPTH = 16  #: receives each side keeps posted (send mode)
TX_DEPTH = 4  #: send queue slots; one WR is in flight at a time
RECV_WRID, SEND_WRID = 1, 2  #: wr_ids, as ibv_rc_pingpong tags them
STALL_TIMEOUT = 10.0  #: seconds without the expected event before giving up
RULE = "-" * 87  #: perftest's RESULT_LINE
#: Payload bytes.  0 never occurs, so a zeroed buffer never looks like a
#: message, and shifting the start by one per iteration changes every byte.
PATTERN = bytes(range(1, 252))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-s",
        "--size",
        type=_positive,
        default=4096,
        help="size of message to exchange (default 4096)",
    )
    parser.add_argument(
        "-n", "--iters", type=_positive, default=1000, help="number of exchanges (default 1000)"
    )
    parser.add_argument(
        "-m", "--mtu", type=int, default=1024, choices=sorted(MTUS), help="path MTU (default 1024)"
    )
    parser.add_argument("-d", "--ib-dev", default="sv0", help="device (default sv0)")
    parser.add_argument(
        "-g",
        "--gid-idx",
        type=int,
        default=1,
        help="local port GID index (default 1, the IPv4-mapped GID)",
    )
    parser.add_argument(
        "--op",
        choices=("send", "write"),
        default="send",
        help="SEND/RECV (two-sided) or RDMA WRITE (one-sided); default send",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the text summary"
    )


def _positive(text: str) -> int:
    value = int(text, 0)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class DemoError(Exception):
    """The ping-pong went wrong: a failed completion, a wrong payload, a stall."""


@dataclass
class Dest:
    """What one side tells the other to connect (ibv_rc_pingpong's pingpong_dest).

    ``rkey`` and ``addr`` name the receive buffer, for RDMA WRITE.
    """

    lid: int
    qpn: int
    psn: int
    gid: GID
    rkey: int
    addr: int


class Peer:
    """One end of the connection: a CQ, a buffer and an RC QP.

    The buffer (one MR) has two halves: ``inbox``, where the other side's
    message lands, and ``outbox``, what this side sends.
    """

    remote: Dest  #: the other side's address, set by connect()
    peer: Peer  #: the other side's object (both live in this process)

    def __init__(self, name: str, ctx: Context, pd: PD, size: int, op: str) -> None:
        self.name = name
        self.ctx = ctx
        self.size = size
        self.op = op
        self.sends_done = 0
        self.recvs_done = 0
        self.last_recv_len = 0
        self.cq = CQ(ctx, RX_DEPTH + TX_DEPTH)
        # The device writes received data into the buffer: LOCAL_WRITE always,
        # REMOTE_WRITE only if the peer is to RDMA WRITE into it.
        access = IBV_ACCESS_LOCAL_WRITE | (IBV_ACCESS_REMOTE_WRITE if op == "write" else 0)
        self.mr = MR(pd, 2 * size, access)
        self.inbox = self.mr.view[:size]
        self.outbox = self.mr.view[size:]
        cap = QPCap(max_send_wr=TX_DEPTH, max_recv_wr=RX_DEPTH, max_send_sge=1, max_recv_sge=1)
        init_attr = QPInitAttr(qp_type=IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        attr = QPAttr()  # pkey index 0, port 1
        attr.qp_access_flags = access
        self.qp = QP(pd, init_attr, attr)  # given a QPAttr, QP() moves it to INIT
        self.psn = random.getrandbits(24)  # ibv_rc_pingpong: lrand48() & 0xffffff

    def dest(self, gid_idx: int) -> Dest:
        port: Any = self.ctx.query_port(PORT)
        lid = port.lid  # 0: RoCE addresses by GID, not LID
        return Dest(
            lid,
            self.qp.qp_num,
            self.psn,
            self.ctx.query_gid(PORT, gid_idx),
            self.mr.rkey,
            self.mr.buf,
        )

    def connect(self, remote: Dest, mtu: int, gid_idx: int) -> None:
        """INIT -> RTR -> RTS with ibv_rc_pingpong's attributes."""
        self.remote = remote
        attr = QPAttr()
        attr.path_mtu = MTUS[mtu]
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn  # the first PSN the peer will send
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.ah_attr = AHAttr(
            is_global=1, port_num=PORT, gr=GlobalRoute(dgid=remote.gid, sgid_index=gid_idx)
        )
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.sq_psn = self.psn  # the first PSN we send
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)  # to_rtr, then RTS, each with the attributes it needs

    # --- work requests -----------------------------------------------------------
    def post_recv(self, count: int = 1) -> None:
        for _ in range(count):
            sge = SGE(self.mr.buf, self.size, self.mr.lkey)  # into the inbox
            self.qp.post_recv(RecvWR(RECV_WRID, 1, [sge]))

    def post(self, from_inbox: bool = False) -> None:
        """Send the outbox (or echo the inbox) to the peer, signaled."""
        addr = self.mr.buf if from_inbox else self.mr.buf + self.size
        sge = SGE(addr, self.size, self.mr.lkey)
        opcode = IBV_WR_RDMA_WRITE if self.op == "write" else IBV_WR_SEND
        wr = SendWR(SEND_WRID, opcode, 1, sg=[sge], send_flags=IBV_SEND_SIGNALED)
        if self.op == "write":
            wr.set_wr_rdma(self.remote.rkey, self.remote.addr)  # the peer's inbox
        self.qp.post_send(wr)

    # --- completions ---------------------------------------------------------------
    def poll(self) -> None:
        """Poll the CQ once (this also moves the in-process fabric along)."""
        _, wcs = self.cq.poll(RX_DEPTH + TX_DEPTH)
        for wc in wcs:
            if wc.status != IBV_WC_SUCCESS:
                reason = f": {wc.reason}" if wc.reason else ""
                raise DemoError(
                    f"{self.name}: Failed status {wc_status_str(wc.status)} "
                    f"({wc.status}) for wr_id {wc.wr_id}{reason}"
                )
            if wc.wr_id == SEND_WRID:
                self.sends_done += 1
            elif wc.wr_id == RECV_WRID:
                self.recvs_done += 1
                self.last_recv_len = wc.byte_len
                self.post_recv()  # keep RX_DEPTH receives posted
            else:
                raise DemoError(f"{self.name}: Completion for unknown wr_id {wc.wr_id}")

    def wait(self, done: Callable[[], bool], what: str) -> None:
        """Poll until ``done()``.

        Both ends live in this process, so the peer's CQ is polled too: a
        failure on either side is reported at once, not as a stall here.
        """
        deadline = time.monotonic() + STALL_TIMEOUT
        while not done():
            self.poll()
            self.peer.poll()
            if time.monotonic() > deadline:
                raise DemoError(f"{self.name}: no {what} within {STALL_TIMEOUT:.0f} s")

    def wait_for_message(self, n: int, expected: memoryview) -> None:
        """Wait until message number ``n`` (1-based) is in the inbox, then check it."""
        if self.op == "send":
            self.wait(lambda: self.recvs_done >= n, f"receive completion #{n}")
            if self.last_recv_len != self.size:
                raise DemoError(
                    f"{self.name}: message #{n} has {self.last_recv_len} "
                    f"bytes, expected {self.size}"
                )
        else:
            last, inbox = expected[-1], self.inbox
            self.wait(lambda: inbox[-1] == last, f"RDMA WRITE #{n} in the buffer")
        if self.inbox != expected:
            bad = next(i for i in range(self.size) if self.inbox[i] != expected[i])
            raise DemoError(
                f"{self.name}: message #{n} is corrupt: byte {bad} is "
                f"{self.inbox[bad]:#04x}, expected {expected[bad]:#04x}"
            )

    def wait_sends(self, n: int) -> None:
        self.wait(lambda: self.sends_done >= n, f"send completion #{n}")


def ping_pong(client: Peer, server: Peer, iters: int) -> tuple[float, list[float]]:
    """Run the exchanges: (total seconds, round-trip seconds of each)."""
    size = client.size
    patterns = memoryview(PATTERN * (size // len(PATTERN) + 2))
    rtts: list[float] = []
    start = time.perf_counter()
    for i in range(iters):
        expected = patterns[i % len(PATTERN) :][:size]
        t0 = time.perf_counter()
        client.outbox[:] = expected
        client.post()  # ping
        server.wait_for_message(i + 1, expected)
        server.post(from_inbox=True)  # pong: the same bytes, straight back
        client.wait_for_message(i + 1, expected)
        rtts.append(time.perf_counter() - t0)
        # Polling a send completion frees its send queue slot.
        client.wait_sends(i + 1)
        server.wait_sends(i + 1)
    return time.perf_counter() - start, rtts


def run(args: argparse.Namespace) -> int:
    try:
        result = _run(args)
    except (DemoError, PyverbsError) as e:
        print(f"softverbs demo: FAILED: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_summary(result)
    return 0


def _run(args: argparse.Namespace) -> dict[str, Any]:
    with Context(name=args.ib_dev) as ctx:
        pd = PD(ctx)
        client = Peer("client", ctx, pd, args.size, args.op)
        server = Peer("server", ctx, pd, args.size, args.op)
        local, remote = client.dest(args.gid_idx), server.dest(args.gid_idx)
        client.connect(remote, args.mtu, args.gid_idx)
        server.connect(local, args.mtu, args.gid_idx)
        client.peer, server.peer = server, client  # see Peer.wait
        if args.op == "send":  # a SEND needs a receive waiting for it
            client.post_recv(RX_DEPTH)
            server.post_recv(RX_DEPTH)
        seconds, rtts = ping_pong(client, server, args.iters)
        port: Any = ctx.query_port(PORT)
        link = "Ethernet" if port.link_layer == IBV_LINK_LAYER_ETHERNET else "IB"
    return _result(args, link, local, remote, seconds, rtts)


def _result(
    args: argparse.Namespace,
    link: str,
    local: Dest,
    remote: Dest,
    seconds: float,
    rtts: list[float],
) -> dict[str, Any]:
    nbytes = args.size * args.iters * 2  # both directions, as ibv_rc_pingpong counts
    one_way_us = sorted(rtt / 2 * 1e6 for rtt in rtts)

    def addr(d: Dest) -> dict[str, Any]:
        return {
            "lid": d.lid,
            "qpn": d.qpn,
            "psn": d.psn,
            "gid": socket.inet_ntop(socket.AF_INET6, d.gid.raw),
        }

    return {
        "device": args.ib_dev,
        "qp_type": "RC",
        "op": args.op,
        "mtu": args.mtu,
        "link_type": link,
        "gid_index": args.gid_idx,
        "size": args.size,
        "iterations": args.iters,
        "local": addr(local),
        "remote": addr(remote),
        "bytes": nbytes,
        "seconds": seconds,
        "mbit_per_sec": nbytes * 8 / seconds / 1e6,
        "usec_per_iter": seconds * 1e6 / args.iters,
        "bw_average_mib_per_sec": nbytes / seconds / 2**20,
        "msg_rate_mpps": 2 * args.iters / seconds / 1e6,
        "t_min_usec": one_way_us[0],
        "t_typical_usec": statistics.median(one_way_us),
        "t_avg_usec": statistics.fmean(one_way_us),
        "t_max_usec": one_way_us[-1],
        "verified": True,
    }


def _print_summary(r: dict[str, Any]) -> None:
    test = "Send" if r["op"] == "send" else "RDMA_Write"  # perftest's test names
    print(RULE)
    print(f"{'':20}{test} Ping-Pong Test")
    print(f" Device          : {r['device']:<16}Transport type : IB")
    print(f" Connection type : {r['qp_type']:<16}Using SRQ      : OFF")
    print(" Number of qps   : 2 (client and server, one process)")
    print(f" Mtu             : {r['mtu']}[B]")
    print(f" Link type       : {r['link_type']}")
    print(f" GID index       : {r['gid_index']}")
    print(f" Message size    : {r['size']}[B]")
    print(f" Iterations      : {r['iterations']}")
    print(RULE)
    for which in ("local", "remote"):  # ibv_rc_pingpong's address lines
        d = r[which]
        print(
            f"  {which + ' address:':<16}LID 0x{d['lid']:04x}, QPN 0x{d['qpn']:06x}, "
            f"PSN 0x{d['psn']:06x}, GID {d['gid']}"
        )
    print(RULE)
    columns = [
        ("#bytes", f"{r['size']}"),
        ("#iterations", f"{r['iterations']}"),
        ("BW average[MiB/sec]", f"{r['bw_average_mib_per_sec']:.2f}"),
        ("MsgRate[Mpps]", f"{r['msg_rate_mpps']:.6f}"),
        ("t_min[usec]", f"{r['t_min_usec']:.2f}"),
        ("t_typical[usec]", f"{r['t_typical_usec']:.2f}"),
        ("t_avg[usec]", f"{r['t_avg_usec']:.2f}"),
        ("t_max[usec]", f"{r['t_max_usec']:.2f}"),
    ]
    print(" " + "    ".join(title for title, _ in columns))
    print(" " + "    ".join(f"{value:<{len(title)}}" for title, value in columns).rstrip())
    print(RULE)
    secs = r["seconds"]
    print(f"{r['bytes']} bytes in {secs:.2f} seconds = {r['mbit_per_sec']:.2f} Mbit/sec")
    print(f"{r['iterations']} iters in {secs:.2f} seconds = {r['usec_per_iter']:.2f} usec/iter")
