"""``softverbs demo``: RC traffic between two queue pairs, with a perftest-style summary.

This is rdma-core's ``ibv_rc_pingpong`` and perftest's latency tests, written
with the pyverbs API.  By default both ends live in one process on ``sv0``
(the host device, or this process's own with ``SOFTVERBS_SERVICE=0``): a
*client* QP and a *server* QP on one device.
It also runs as two processes that meet over TCP, like ``ibv_rc_pingpong``::

    softverbs demo                       # both ends in this process
    softverbs demo --listen -d DEV       # server: waits for one client on TCP port 18515
    softverbs demo -d DEV HOST           # client: connects to the server on HOST

Both processes must give the same ``--op``, ``-s``, ``-n`` and ``-m`` (they
check), and need a device that reaches across processes: a UDP link
(``softverbs link add``) or one served by the device service.

What travels (``--op``):

* ``send`` (default) and ``write`` -- ping-pong: the client sends a message
  (SEND, or RDMA WRITE into the server's buffer), the server sends the same
  bytes back.  With SEND the receiver learns of a message from its receive
  completion; with WRITE the receiver posts nothing and gets no completion --
  that is what one-sided means -- so, like perftest's ``ib_write_lat``, it
  watches the last byte of its buffer change.
* ``read`` -- the client RDMA READs the server's buffer.  The server does
  nothing at all: its device answers.
* ``fetch_add`` and ``cmp_swap`` -- 8-byte atomics on a counter in the
  server's buffer.  ``fetch_add`` adds 1 and gets the old value back;
  ``cmp_swap`` swaps ``i`` for ``i + 1``.  The client checks each old value
  and, at the end, the server checks that its counter reached ``--iters``.

Read it top to bottom; it is the life of any RC program:

1. open the device and create a PD, a CQ, an MR and an RC QP per side;
2. move each QP RESET -> INIT -> RTR -> RTS, giving it the other side's QP
   number, PSN, GID and buffer (:class:`Dest`) -- over TCP between two
   processes, as ``ibv_rc_pingpong`` does, or simply handed over in memory;
3. post work requests and poll completions.  Every completion must be
   ``IBV_WC_SUCCESS`` and every byte must be the one expected, or the demo
   stops with an error and exit status 1.

The summary has perftest's header and result table and ibv_rc_pingpong's
closing lines.  As in perftest, ``t_*`` are one-way latencies (half a round
trip) for ping-pong and whole round trips for READ and atomics; the
percentile columns are perftest's (``99% percentile[usec]``, computed as
perftest does: the slowest two samples dropped, then the sample at
``ceil(n * 0.99)``).  ``usec/iter`` is a whole iteration, as
``ibv_rc_pingpong`` prints it.  Bytes count both directions for ping-pong,
as ``ibv_rc_pingpong`` does, and ``MiB`` is 2**20 bytes (perftest's unit).
Times include the payload checks, so they measure this Python program, not
a network.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import socket
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from softverbs import (
    CQ,
    GID,
    MR,
    PD,
    QP,
    SGE,
    Context,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    wc_status_str,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
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
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)
from softverbs.errors import UserError
from softverbs.samples import rendezvous as rv

MTUS = {
    256: IBV_MTU_256,
    512: IBV_MTU_512,
    1024: IBV_MTU_1024,
    2048: IBV_MTU_2048,
    4096: IBV_MTU_4096,
}
PORT = 1
DEFAULT_TCP_PORT = rv.DEFAULT_PORT  #: ibv_rc_pingpong's and perftest's rendezvous port
RX_DEPTH = 16  #: receives each side keeps posted (send mode)
TX_DEPTH = 4  #: send queue slots; one WR is in flight at a time
RECV_WRID, SEND_WRID = 1, 2  #: wr_ids, as ibv_rc_pingpong tags them
STALL_TIMEOUT = 10.0  #: seconds without the expected event before giving up
CONNECT_WAIT = 10.0  #: seconds a client waits for its server to listen
RULE = "-" * 87  #: perftest's RESULT_LINE
LAT_MEASURE_TAIL = 2  #: perftest drops this many slowest samples before its statistics
ATOMIC_SIZE = 8
#: Payload bytes.  0 never occurs, so a zeroed buffer never looks like a
#: message, and shifting the start by one per iteration changes every byte.
PATTERN = bytes(range(1, 252))
_U64 = struct.Struct("<Q")  #: an atomic's operand in memory (host order: little-endian)


@dataclass(frozen=True)
class Op:
    """What differs between the ``--op`` choices."""

    title: str  #: perftest's test name in the header
    opcode: int
    access: int  #: what the peer's buffer must allow
    pingpong: bool  #: both sides send (SEND/WRITE); else the client alone acts
    atomic: bool = False


OPS: dict[str, Op] = {
    "send": Op("Send", IBV_WR_SEND, 0, True),
    "write": Op("RDMA_Write", IBV_WR_RDMA_WRITE, IBV_ACCESS_REMOTE_WRITE, True),
    "read": Op("RDMA_Read", IBV_WR_RDMA_READ, IBV_ACCESS_REMOTE_READ, False),
    "fetch_add": Op("Atomic FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD,
                    IBV_ACCESS_REMOTE_ATOMIC, False, atomic=True),
    "cmp_swap": Op("Atomic CMP_AND_SWAP", IBV_WR_ATOMIC_CMP_AND_SWP,
                   IBV_ACCESS_REMOTE_ATOMIC, False, atomic=True),
}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", nargs="?", metavar="HOST",
                        help="run as the client of a 'softverbs demo --listen' on HOST "
                             "(default: both ends in this process)")  # fmt: skip
    parser.add_argument("--listen", action="store_true",
                        help="run as the server: wait for one client on --port")  # fmt: skip
    parser.add_argument("-p", "--port", type=tcp_port, default=DEFAULT_TCP_PORT,
                        help=f"TCP port of the rendezvous (default {DEFAULT_TCP_PORT})")
    parser.add_argument("-s", "--size", type=positive_int, default=4096,
                        help="size of message to exchange (default 4096; atomics: 8)")
    parser.add_argument("-n", "--iters", type=positive_int, default=1000,
                        help="number of exchanges (default 1000)")  # fmt: skip
    parser.add_argument("-m", "--mtu", type=int, default=1024, choices=sorted(MTUS),
                        help="path MTU (default 1024)")  # fmt: skip
    parser.add_argument("-d", "--ib-dev", default="sv0", help="device (default sv0)")
    parser.add_argument("-g", "--gid-idx", type=int, default=1,
                        help="local port GID index (default 1, the IPv4-mapped GID)")
    parser.add_argument("--op", choices=tuple(OPS), default="send",
                        help="send (two-sided), write, read (one-sided), or the atomics "
                             "fetch_add and cmp_swap; default send")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the text summary")  # fmt: skip


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (decimal or 0x hex)."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer (at least 1)")
    return value


def tcp_port(text: str) -> int:
    """argparse type: a TCP port number."""
    try:
        value = int(text, 0)
    except ValueError:
        value = -1
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return value


class DemoError(Exception):
    """The traffic went wrong: a failed completion, a wrong payload, a stall."""


@dataclass
class Dest:
    """What one side tells the other to connect (ibv_rc_pingpong's pingpong_dest),
    and where its buffer is (``rkey``, ``addr``) for WRITE, READ and atomics."""

    lid: int
    qpn: int
    psn: int
    gid: str  #: as str(GID) prints it
    rkey: int
    addr: int


class Peer:
    """One end of the connection: a CQ, a buffer and an RC QP.

    The buffer (one MR) has two halves: ``inbox``, where the other side's
    message lands (and, for READ and atomics, what the client gets back), and
    ``outbox``, what this side sends.
    """

    remote: Dest  #: the other side's address, set by connect()

    def __init__(self, name: str, ctx: Context, pd: PD, size: int, op: Op) -> None:
        self.name = name
        self.ctx = ctx
        self.size = size
        self.op = op
        self.peer: Peer | None = None  #: the other side when it lives in this process
        self.sends_done = 0
        self.recvs_done = 0
        self.last_recv_len = 0
        self.cq = CQ(ctx, RX_DEPTH + TX_DEPTH)
        # The device writes received data into the buffer: LOCAL_WRITE always;
        # the remote rights only the operation needs.
        access = IBV_ACCESS_LOCAL_WRITE | op.access
        self.mr = MR(pd, 2 * size, access)
        self.inbox = self.mr.view[:size]
        self.outbox = self.mr.view[size:]
        cap = QPCap(max_send_wr=TX_DEPTH, max_recv_wr=RX_DEPTH, max_send_sge=1, max_recv_sge=1)
        init_attr = QPInitAttr(qp_type=IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        self.qp = QP(pd, init_attr)
        rv.modify(self.qp, rv.init_attrs(IBV_QPT_RC, PORT, access))  # RESET -> INIT
        self.psn = random.getrandbits(24)  # ibv_rc_pingpong: lrand48() & 0xffffff

    def dest(self, gid_idx: int) -> Dest:
        port: Any = self.ctx.query_port(PORT)
        gid: GID = self.ctx.query_gid(PORT, gid_idx)
        # lid 0: RoCE addresses by GID, not LID
        return Dest(port.lid, self.qp.qp_num, self.psn, str(gid), self.mr.rkey, self.mr.buf)

    def connect(self, remote: Dest, mtu: int, gid_idx: int) -> None:
        """INIT -> RTR -> RTS with ibv_rc_pingpong's attributes (:mod:`.rendezvous`)."""
        self.remote = remote
        ah = rv.ah_attr(lid=remote.lid, gid=GID(remote.gid).raw, sl=0, port=PORT,
                        sgid_index=gid_idx)  # fmt: skip
        # rq_psn: the first PSN the peer will send; sq_psn: the first we send
        rv.connect(self.qp, IBV_QPT_RC, dest_qpn=remote.qpn, rq_psn=remote.psn, sq_psn=self.psn,
                   mtu=MTUS[mtu], ah=ah)  # fmt: skip

    # --- work requests -----------------------------------------------------------
    def post_recv(self, count: int = 1) -> None:
        for _ in range(count):
            sge = SGE(self.mr.buf, self.size, self.mr.lkey)  # into the inbox
            self.qp.post_recv(RecvWR(RECV_WRID, 1, [sge]))

    def post(self, from_inbox: bool = False, compare_add: int = 0, swap: int = 0) -> None:
        """One signaled WR of the demo's operation.  SEND/WRITE send the outbox (or
        echo the inbox); READ and atomics land in the inbox."""
        op = self.op
        lands_here = not op.pingpong
        addr = self.mr.buf if (from_inbox or lands_here) else self.mr.buf + self.size
        sge = SGE(addr, self.size, self.mr.lkey)
        wr = SendWR(SEND_WRID, op.opcode, 1, sg=[sge], send_flags=IBV_SEND_SIGNALED)
        if op.atomic:
            wr.set_wr_atomic(self.remote.rkey, self.remote.addr, compare_add, swap)
        elif op.opcode != IBV_WR_SEND:
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

        When both ends live in this process the peer's CQ is polled too: a
        failure on either side is reported at once, not as a stall here.
        """
        deadline = time.monotonic() + STALL_TIMEOUT
        while not done():
            self.poll()
            if self.peer is not None:
                self.peer.poll()
            if time.monotonic() > deadline:
                raise DemoError(f"{self.name}: no {what} within {STALL_TIMEOUT:.0f} s")

    def wait_for_message(self, n: int, expected: memoryview) -> None:
        """Wait until message number ``n`` (1-based) is in the inbox, then check it."""
        if self.op.opcode == IBV_WR_SEND:
            self.wait(lambda: self.recvs_done >= n, f"receive completion #{n}")
            if self.last_recv_len != self.size:
                raise DemoError(
                    f"{self.name}: message #{n} has {self.last_recv_len} "
                    f"bytes, expected {self.size}"
                )
        else:
            last, inbox = expected[-1], self.inbox
            self.wait(lambda: inbox[-1] == last, f"RDMA WRITE #{n} in the buffer")
        self.check_inbox(n, expected)

    def check_inbox(self, n: int, expected: bytes | memoryview) -> None:
        if self.inbox != expected:
            bad = next(i for i in range(self.size) if self.inbox[i] != expected[i])
            raise DemoError(
                f"{self.name}: message #{n} is corrupt: byte {bad} is "
                f"{self.inbox[bad]:#04x}, expected {expected[bad]:#04x}"
            )

    def wait_sends(self, n: int) -> None:
        self.wait(lambda: self.sends_done >= n, f"send completion #{n}")


def _patterns(size: int) -> memoryview:
    return memoryview(PATTERN * (size // len(PATTERN) + 2))


def message(patterns: memoryview, i: int, size: int) -> memoryview:
    """The bytes of message ``i``: the same on both sides, different every time."""
    return patterns[i % len(PATTERN) :][:size]


# --- the traffic: each loop works with the server here or in another process ----------------


def ping_pong(client: Peer, server: Peer | None, iters: int) -> list[float]:
    """SEND or WRITE ping-pong as the client; returns each round trip in seconds.
    ``server`` is the server's Peer when it lives in this process, else None."""
    size = client.size
    patterns = _patterns(size)
    rtts: list[float] = []
    for i in range(iters):
        expected = message(patterns, i, size)
        t0 = time.perf_counter()
        client.outbox[:] = expected
        client.post()  # ping
        if server is not None:
            serve_one(server, i, expected)
        client.wait_for_message(i + 1, expected)
        rtts.append(time.perf_counter() - t0)
        # Polling a send completion frees its send queue slot.
        client.wait_sends(i + 1)
        if server is not None:
            server.wait_sends(i + 1)
    return rtts


def serve_one(server: Peer, i: int, expected: memoryview) -> None:
    server.wait_for_message(i + 1, expected)
    server.post(from_inbox=True)  # pong: the same bytes, straight back


def serve_ping_pong(server: Peer, iters: int) -> None:
    """The server's side of :func:`ping_pong`, when the client is another process."""
    patterns = _patterns(server.size)
    for i in range(iters):
        serve_one(server, i, message(patterns, i, server.size))
        server.wait_sends(i + 1)


def prepare_target(server: Peer) -> None:
    """What READ reads (the pattern) and the counter the atomics work on (0)."""
    if server.op.atomic:
        server.inbox[:ATOMIC_SIZE] = _U64.pack(0)
    else:
        server.inbox[:] = message(_patterns(server.size), 0, server.size)


def one_sided(client: Peer, iters: int) -> list[float]:
    """READ or atomics as the client; returns each round trip in seconds.  The
    server's device answers without its program doing anything."""
    op, size = client.op, client.size
    target = message(_patterns(size), 0, size)
    zeros = bytes(size)
    rtts: list[float] = []
    for i in range(iters):
        client.inbox[:] = zeros  # a READ that did not land cannot pass for one that did
        t0 = time.perf_counter()
        if op.opcode == IBV_WR_ATOMIC_CMP_AND_SWP:
            client.post(compare_add=i, swap=i + 1)
        else:
            client.post(compare_add=1)  # FETCH_AND_ADD adds 1 (READ ignores it)
        client.wait_sends(i + 1)
        rtts.append(time.perf_counter() - t0)
        client.check_inbox(i + 1, _U64.pack(i) if op.atomic else target)
    return rtts


def check_target(server: Peer, iters: int) -> None:
    """After the atomics: the counter must have counted every one of them."""
    if server.op.atomic:
        (value,) = _U64.unpack(server.inbox[:ATOMIC_SIZE])
        if value != iters:
            raise DemoError(f"server: the counter is {value} after {iters} atomics")


# --- running it ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    if args.host and args.listen:
        raise UserError("give HOST (client) or --listen (server), not both")
    try:
        result = _run(args)
    except (DemoError, rv.PingPongError) as e:
        raise UserError(f"FAILED: {e}") from None
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_summary(result)
    return 0


def _run(args: argparse.Namespace) -> dict[str, Any]:
    op = OPS[args.op]
    size = ATOMIC_SIZE if op.atomic else args.size
    with Context(name=args.ib_dev) as ctx:
        pd = PD(ctx)
        role = "server" if args.listen else "client"
        me = Peer(role, ctx, pd, size, op)
        local = me.dest(args.gid_idx)
        if args.host or args.listen:
            other = None
            remote = _rendezvous(args, local, me)
        else:
            other = Peer("server", ctx, pd, size, op)
            remote = other.dest(args.gid_idx)
            other.connect(local, args.mtu, args.gid_idx)
            me.peer, other.peer = other, me  # see Peer.wait
        me.connect(remote, args.mtu, args.gid_idx)
        server = me if args.listen else other
        if op.opcode == IBV_WR_SEND:  # a SEND needs a receive waiting for it
            for peer in (me, other):
                if peer is not None:
                    peer.post_recv(RX_DEPTH)
        if server is not None and not op.pingpong:
            prepare_target(server)
        if args.host or args.listen:
            _sync(args, "ready")  # both QPs are in RTS, receives are posted
        start = time.perf_counter()
        if args.listen:
            if op.pingpong:
                serve_ping_pong(me, args.iters)
            rtts: list[float] = []
        elif op.pingpong:
            rtts = ping_pong(me, other, args.iters)
        else:
            rtts = one_sided(me, args.iters)
        if args.host or args.listen:
            _sync(args, "done")  # the server's buffer stays until the client is done
        # the client times its own loop; a server, the whole run it took part in
        seconds = time.perf_counter() - start
        if server is not None:
            check_target(server, args.iters)
        port: Any = ctx.query_port(PORT)
        link = "Ethernet" if port.link_layer == IBV_LINK_LAYER_ETHERNET else "IB"
    return _result(args, size, link, local, remote, seconds, rtts)


# --- two processes: the rendezvous over TCP -------------------------------------------------

_conn: socket.socket | None = None  #: the rendezvous connection, open for the whole run
_rx = bytearray()  #: what it received past the last whole line taken


def _rendezvous(args: argparse.Namespace, local: Dest, me: Peer) -> Dest:
    """Exchange addresses and settings with the other process (one JSON line each)."""
    global _conn
    settings = {"op": args.op, "size": me.size, "iters": args.iters, "mtu": args.mtu}
    _conn = rv.tcp_serve_one(args.port) if args.listen else _connect(args.host, args.port)
    _rx.clear()
    _send(dict(settings, dest=asdict(local)))
    theirs = _recv()
    mismatch = [f"{k} {theirs.get(k)} here {v}" for k, v in settings.items() if theirs.get(k) != v]
    if mismatch:
        raise UserError("the other side runs with other settings: " + ", ".join(mismatch))
    return Dest(**theirs["dest"])


def _connect(host: str, port: int) -> socket.socket:
    """Connect to the server, waiting CONNECT_WAIT seconds for it to start listening
    (the two terminals may start in either order)."""
    deadline = time.monotonic() + CONNECT_WAIT
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=STALL_TIMEOUT)
        except ConnectionRefusedError:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise UserError(f"no demo server on {host} port {port} (start one with "
                            "'softverbs demo --listen')") from None  # fmt: skip
        except OSError as exc:
            raise UserError(f"cannot reach {host} port {port}: {exc.strerror or exc}") from None
        conn.settimeout(None)
        return conn


def _send(msg: dict[str, Any]) -> None:
    assert _conn is not None
    _conn.sendall(json.dumps(msg).encode() + b"\n")


def _recv() -> dict[str, Any]:
    """The next message: one line.  A receive may hold more than one (the other side
    may send its next before this side reads), or part of one."""
    assert _conn is not None
    while b"\n" not in _rx:
        part = _conn.recv(4096)
        if not part:
            raise DemoError("the other side closed the rendezvous connection")
        _rx.extend(part)
    end = _rx.index(b"\n") + 1
    line = bytes(_rx[:end])
    del _rx[:end]
    try:
        msg = json.loads(line)
    except ValueError:
        raise DemoError("the other side is not a softverbs demo") from None
    if not isinstance(msg, dict):
        raise DemoError("the other side is not a softverbs demo")
    return msg


def _sync(args: argparse.Namespace, word: str) -> None:
    """Both sides reach ``word`` before either goes on."""
    _send({"sync": word})
    got = _recv().get("sync")
    if got != word:
        raise DemoError(f"the other side said {got!r}, expected {word!r}")


# --- the summary ----------------------------------------------------------------------------


def latency_stats(rtts: list[float], one_way: bool) -> dict[str, float]:
    """perftest's latency figures in microseconds: the sorted samples less the
    LAT_MEASURE_TAIL slowest; the median as t_typical; the percentiles at
    ``ceil(n * p)`` of what is left, as perftest indexes them."""
    if not rtts:
        return {}
    scale = 1e6 / (2 if one_way else 1)
    samples = sorted(t * scale for t in rtts)
    n = len(samples) - LAT_MEASURE_TAIL if len(samples) > LAT_MEASURE_TAIL else len(samples)
    kept = samples[:n]

    def at(p: float) -> float:
        return samples[min(math.ceil(n * p), len(samples) - 1)]

    return {
        "t_min_usec": kept[0],
        "t_max_usec": kept[-1],
        "t_typical_usec": statistics.median(kept),
        "t_avg_usec": statistics.fmean(kept),
        "t_stdev_usec": statistics.pstdev(kept),
        "percentile_99_usec": at(0.99),
        "percentile_99_9_usec": at(0.999),
    }


def _result(args: argparse.Namespace, size: int, link: str, local: Dest, remote: Dest,
            seconds: float, rtts: list[float]) -> dict[str, Any]:  # fmt: skip
    op = OPS[args.op]
    nbytes = size * args.iters * (2 if op.pingpong else 1)

    def addr(d: Dest) -> dict[str, Any]:
        gid = socket.inet_ntop(socket.AF_INET6, GID(d.gid).raw)  # as ibv_rc_pingpong prints it
        return {"lid": d.lid, "qpn": d.qpn, "psn": d.psn, "gid": gid}

    seconds = max(seconds, 1e-9)
    return {
        "device": args.ib_dev,
        "qp_type": "RC",
        "op": args.op,
        "role": "server" if args.listen else "client" if args.host else "both",
        "mtu": args.mtu,
        "link_type": link,
        "gid_index": args.gid_idx,
        "size": size,
        "iterations": args.iters,
        "local": addr(local),
        "remote": addr(remote),
        "bytes": nbytes,
        "seconds": seconds,
        "mbit_per_sec": nbytes * 8 / seconds / 1e6,
        "usec_per_iter": seconds * 1e6 / args.iters,
        "bw_average_mib_per_sec": nbytes / seconds / 2**20,
        "msg_rate_mpps": (2 if op.pingpong else 1) * args.iters / seconds / 1e6,
        **latency_stats(rtts, one_way=op.pingpong),
        "verified": True,
    }


#: (column title, result key, format) of the result table; perftest's titles
COLUMNS = (
    ("#bytes", "size", "d"),
    ("#iterations", "iterations", "d"),
    ("BW average[MiB/sec]", "bw_average_mib_per_sec", ".2f"),
    ("MsgRate[Mpps]", "msg_rate_mpps", ".6f"),
    ("t_min[usec]", "t_min_usec", ".2f"),
    ("t_max[usec]", "t_max_usec", ".2f"),
    ("t_typical[usec]", "t_typical_usec", ".2f"),
    ("t_avg[usec]", "t_avg_usec", ".2f"),
    ("t_stdev[usec]", "t_stdev_usec", ".2f"),
    ("99% percentile[usec]", "percentile_99_usec", ".2f"),
    ("99.9% percentile[usec]", "percentile_99_9_usec", ".2f"),
)


def _print_summary(r: dict[str, Any]) -> None:
    op = OPS[r["op"]]
    kind = "Ping-Pong Test" if op.pingpong else "Latency Test"
    qps = {"both": "2 (client and server, one process)", "client": "1 (client)",
           "server": "1 (server)"}[r["role"]]  # fmt: skip
    print(RULE)
    print(f"{'':20}{op.title} {kind}")
    print(f" Device          : {r['device']:<16}Transport type : IB")
    print(f" Connection type : {r['qp_type']:<16}Using SRQ      : OFF")
    print(f" Number of qps   : {qps}")
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
    if "t_min_usec" in r:  # the client measures; a server of READ/atomics has nothing to time
        columns = [(title, format(r[key], fmt)) for title, key, fmt in COLUMNS]
        print(" " + "    ".join(title for title, _ in columns))
        print(" " + "    ".join(f"{value:<{len(title)}}" for title, value in columns).rstrip())
        print(RULE)
    secs = r["seconds"]
    print(f"{r['bytes']} bytes in {secs:.2f} seconds = {r['mbit_per_sec']:.2f} Mbit/sec")
    print(f"{r['iterations']} iters in {secs:.2f} seconds = {r['usec_per_iter']:.2f} usec/iter")
