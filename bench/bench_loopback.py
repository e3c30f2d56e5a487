#!/usr/bin/env python3
"""Two processes on loopback: softverbs over UDP beside UCX over TCP and a plain Python UDP loop.

A server and a client process each open their own softverbs UDP device (two
fresh addresses in 127.0.0.0/8, written to a private ``SOFTVERBS_CONFIG``),
meet over a TCP socket on 127.0.0.1, exchange QPN, GID, rkey and address,
and connect one RC QP each.  In the same run, three stacks are measured:

(1) softverbs RC RDMA WRITE bandwidth at 4 KiB, 64 KiB, 1 MiB and 4 MiB.  The
    client keeps a window of WRITEs posted (chains of ``SIGNAL_EVERY``, the
    last one signaled, ``sq_sig_all=0``) and polls.  The server only keeps
    its QP alive: it sleeps in a socket read while its device's progress
    thread receives the packets and ACKs them.  After each size the server's
    buffer is hashed and must equal the client's.  Each process's CPU time
    per packet is reported too: on a shared machine it moves much less than
    MB/s does.
(2) softverbs 8-byte RC SEND ping-pong: the client times each round trip and
    reports half of it (one-way, as perftest and ucx_perftest report
    latency): median and p99.  Both sides busy-poll their CQs, dropping the
    GIL with ``os.sched_yield()`` after an empty poll unless ``--spin`` (see idle()).
(3) ``ucx_perftest`` (Debian ``ucx-utils``) over TCP on loopback
    (``UCX_TLS=tcp UCX_NET_DEVICES=lo``), server and client processes:
    ``ucp_put_bw`` at the same sizes (at most ``WINDOW`` puts and 4 MiB
    outstanding, see ucx_outstanding()) and ``tag_lat`` at 8 bytes (median
    and p99 through ``-R``).  Without
    ucx_perftest, or with ``--no-ucx``, that column says n/a.
(4) A plain Python UDP loop, the ceiling for any stack written in Python on
    this machine: one process blasts datagrams of the size softverbs sends
    for a full MTU (BTH + 4096 payload bytes + ICRC) with ``sendto`` and the
    other counts them with ``recvfrom``, as the softverbs UDP fabric does;
    packets/s and MB/s of payload, from the receiver's first to last packet.
    Plus a ping-pong of the datagram an 8-byte SEND makes (BTH + 8 + ICRC).

Every figure is the median of several runs after a warm-up run, except the
latency percentiles, which are over all timed round trips.  MB = 10^6 bytes
(UCX's "MB/s" is MiB/s; its message rate times the size is used instead).
Every subprocess has a timeout and is killed with its process group if it
overstays.  Not a test: nothing asserts a speed.

    python bench/bench_loopback.py [--quick] [--runs N] [--no-ucx] [--sizes 4K,1M]
                                   [--spin] [--loss P] [--no-latency] [--plot FILE.png] [--json]
                                   [--profile DIR [--profiler cprofile|py-spy]]

``--profile DIR`` runs only the softverbs WRITE bandwidth (1 MiB unless
``--sizes`` says otherwise) with cProfile on every thread of both processes
and writes ``DIR/{client,server}-<thread>.prof``; with ``--profiler py-spy``
each process runs under ``py-spy record`` instead (wall clock, idle
included, per thread) and ``DIR/{client,server}.txt`` hold collapsed stacks.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import platform
import random
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)
WINDOW = 16  #: WRITEs (and UCX puts) outstanding at most
SIGNAL_EVERY = 4  #: WRITEs per post_send chain; the last of each is signaled
LAT_SIZE = 8  #: ping-pong message size
QUEUE = 64  #: send/receive queue depth of each softverbs QP
#: Local ACK timeout exponent: 4.096 us * 2**16 = 268 ms.  With perftest's 14 (67 ms) we saw
#: spurious go-back-N retransmissions on a loaded VM that deschedules a process for long.
ACK_TIMEOUT = 16
BTH, ICRC = 12, 4
MTU = 4096
UDP_PAYLOAD = BTH + MTU + ICRC  #: a full-MTU middle WRITE packet as softverbs sends it
LAT_DATAGRAM = BTH + LAT_SIZE + ICRC  #: the datagram of an 8-byte SEND
MAX_DATAGRAM = 65536  #: recvfrom size, as in softverbs.fabric.udp
STALL_TIMEOUT = 20.0  #: seconds without an expected completion or reply
UCX_MAX_OUTSTANDING = 4 << 20  #: bytes of puts ucx_perftest may have outstanding
UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}
SCRIPT = Path(__file__).resolve()


class BenchError(Exception):
    """A completion failed, a payload was wrong, a peer stalled or died."""


@dataclass(frozen=True)
class Settings:
    runs: int  #: timed runs per figure (the median is reported)
    warmup: int  #: untimed runs before them
    write_bytes: int  #: softverbs bytes per timed WRITE run
    lat_iters: int  #: timed softverbs ping-pong round trips (0: skip)
    lat_warmup: int
    udp_packets: int  #: datagrams per Python UDP blast
    udp_lat_iters: int
    ucx_bytes: int  #: bytes per ucx_perftest put_bw run
    ucx_lat_iters: int
    timeout: float  #: wall-clock limit of one group of subprocesses, seconds
    sizes: tuple[int, ...] = SIZES
    spin: bool = False  #: poll without pausing (see idle())
    loss: float = 0.0  #: seeded packet loss on what each softverbs process sends (--loss)


FULL = Settings(runs=5, warmup=1, write_bytes=32 << 20, lat_iters=5000, lat_warmup=200,
                udp_packets=50000, udp_lat_iters=5000, ucx_bytes=128 << 20,
                ucx_lat_iters=50000, timeout=300.0)  # fmt: skip
QUICK = Settings(runs=3, warmup=1, write_bytes=2 << 20, lat_iters=200, lat_warmup=20,
                 udp_packets=2000, udp_lat_iters=200, ucx_bytes=8 << 20,
                 ucx_lat_iters=2000, timeout=60.0)  # fmt: skip


def messages_for(size: int, nbytes: int) -> int:
    """WRITEs per run: about ``nbytes``, a whole number of signaled chains."""
    n = max(SIGNAL_EVERY, nbytes // size)
    return -(-n // SIGNAL_EVERY) * SIGNAL_EVERY


def human(size: int) -> str:
    if size >= 1 << 20:
        return f"{size >> 20} MiB"
    return f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B"


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KkMm]?)i?[Bb]?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 4K, 64K, 1M)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20}[m.group(2).lower()]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


# --- the control channel (JSON lines over TCP) ---------------------------------------------
class Control:
    """One JSON object per line over a TCP connection, with a read timeout."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        sock.settimeout(timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.file = sock.makefile("rwb")

    def send(self, **msg: Any) -> None:
        self.file.write(json.dumps(msg).encode() + b"\n")
        self.file.flush()

    def recv(self) -> dict[str, Any]:
        try:
            line = self.file.readline()
        except TimeoutError:
            raise BenchError("the peer did not answer on the control socket") from None
        if not line:
            raise BenchError("the peer closed the control socket")
        msg: dict[str, Any] = json.loads(line)
        if "error" in msg:
            raise BenchError(f"the peer failed: {msg['error']}")
        return msg

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
            self.sock.close()


def serve_control(timeout: float) -> Control:
    """Listen on 127.0.0.1, tell the parent the port, accept one client."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    lsock.settimeout(timeout)
    print(f"LISTEN {lsock.getsockname()[1]}", flush=True)
    try:
        conn, _ = lsock.accept()
    except TimeoutError:
        raise BenchError("no client connected") from None
    finally:
        lsock.close()
    return Control(conn, timeout)


def connect_control(port: int, timeout: float) -> Control:
    return Control(socket.create_connection(("127.0.0.1", port), timeout=timeout), timeout)


# --- softverbs roles ------------------------------------------------------------------------
class SvEnd:
    """One side: a UDP device, an RC QP, a big MR for WRITEs and slots for ping-pong."""

    def __init__(self, device: str, buf_size: int) -> None:
        from softverbs import CQ, MR, PD, QP, CompChannel, Context, QPAttr, QPCap, QPInitAttr
        from softverbs.enums import (
            IBV_ACCESS_LOCAL_WRITE,
            IBV_ACCESS_REMOTE_WRITE,
            IBV_QPT_RC,
        )

        access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
        self.ctx = Context(name=device)
        self.pd = PD(self.ctx)
        self.channel = CompChannel(self.ctx)  #: for the ping-pong that sleeps (events)
        self.cq = CQ(self.ctx, 4 * QUEUE, None, self.channel, 0)
        cap = QPCap(max_send_wr=QUEUE, max_recv_wr=QUEUE, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        attr = QPAttr()
        attr.qp_access_flags = access
        self.qp = QP(self.pd, init, attr)
        self.mr = MR(self.pd, buf_size, access)
        #: QUEUE receive slots, then one send slot, LAT_SIZE bytes each
        self.msg = MR(self.pd, (QUEUE + 1) * LAT_SIZE, access)

    def info(self) -> dict[str, Any]:
        return {"qpn": self.qp.qp_num, "gid": str(self.ctx.query_gid(1, 0)),
                "rkey": self.mr.rkey, "addr": self.mr.buf}  # fmt: skip

    def connect(self, peer: dict[str, Any]) -> None:
        from softverbs import GID, AHAttr, GlobalRoute, testing
        from softverbs.enums import IBV_MTU_4096

        ah = AHAttr(is_global=1, port_num=1, gr=GlobalRoute(dgid=GID(peer["gid"]), sgid_index=0))
        testing.connect_qp(self.qp, int(peer["qpn"]), ah, IBV_MTU_4096, max_dest_rd_atomic=1,
                           max_rd_atomic=1, min_rnr_timer=12, timeout=ACK_TIMEOUT)  # fmt: skip
        for slot in range(QUEUE):
            self.post_recv(slot)

    def post_recv(self, slot: int) -> None:
        from softverbs import SGE, RecvWR

        sge = SGE(self.msg.buf + slot * LAT_SIZE, LAT_SIZE, self.msg.lkey)
        self.qp.post_recv(RecvWR(slot, 1, [sge]))

    def close(self) -> None:
        self.pd.close()
        self.cq.close()
        self.ctx.close()


def _check(wc: Any, what: str) -> None:
    from softverbs import wc_status_str

    if wc.status != 0:
        raise BenchError(f"{what}: wr_id={wc.wr_id} failed: {wc_status_str(wc.status)} "
                         f"({wc.status}) {getattr(wc, 'reason', '')}")  # fmt: skip


def idle(spin: bool) -> None:
    """After an empty poll: drop the GIL for a moment (unless ``--spin``).

    A poller that never pauses keeps the GIL, so the device's progress thread,
    woken by a datagram or a timer, waits up to the interpreter's switch
    interval (5 ms) for it -- visible as a p99 latency of milliseconds -- and
    then contends for the runtime lock.  Up to commit 1888029 such a poller
    could also deadlock: it wrote a wake-up byte per poll into a blocking
    socketpair the starved thread never drained, and blocked in send() with
    the lock held (fixed in da22929: the pair is non-blocking).
    ``os.sched_yield()`` lets the thread in; ``--spin`` measures without it.
    Not ``time.sleep(0)``: Linux rounds that sleep up by the thread's timer
    slack (50 us by default), 76 us a call on the benchmark's VM.
    """
    if not spin:
        os.sched_yield()


def _deadline() -> float:
    return time.monotonic() + STALL_TIMEOUT


def write_run(end: SvEnd, peer: dict[str, Any], size: int, count: int, spin: bool) -> float:
    """Seconds for ``count`` WRITEs of ``size`` bytes, at most WINDOW outstanding."""
    from softverbs import SGE, SendWR
    from softverbs.enums import IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE

    sge = SGE(end.mr.buf, size, end.mr.lkey)
    wrs = [SendWR(i, IBV_WR_RDMA_WRITE, 1, sg=[sge], send_flags=0) for i in range(SIGNAL_EVERY)]
    for w in wrs:
        w.set_wr_rdma(int(peer["rkey"]), int(peer["addr"]))
    for w, nxt in itertools.pairwise(wrs):
        w.next_wr = nxt
    wrs[-1].send_flags = IBV_SEND_SIGNALED
    chains = count // SIGNAL_EVERY
    window = WINDOW // SIGNAL_EVERY
    posted = done = 0
    qp, cq = end.qp, end.cq
    t0 = time.perf_counter()
    deadline = _deadline()
    while done < chains:
        while posted < chains and posted - done < window:
            qp.post_send(wrs[0])
            posted += 1
        n, wcs = cq.poll(window)
        if n:
            for wc in wcs:
                _check(wc, f"RDMA WRITE {size} B")
            done += n
            deadline = _deadline()
        else:
            idle(spin)
            if time.monotonic() > deadline:
                raise BenchError(f"RDMA WRITE {size} B: {done} of {chains} chains after "
                                 f"{STALL_TIMEOUT} s")  # fmt: skip
    return time.perf_counter() - t0


class PingPong:
    """8-byte SEND ping-pong on a connected SvEnd (receives are kept posted).

    With :attr:`events`, an empty CQ is armed and the side sleeps in
    ``get_cq_event``, as ``ibv_rc_pingpong -e`` does, instead of polling."""

    def __init__(self, end: SvEnd, spin: bool) -> None:
        from softverbs import SGE, SendWR
        from softverbs.enums import IBV_SEND_SIGNALED, IBV_WC_RECV, IBV_WR_SEND

        self.end = end
        self.spin = spin
        self.recv_op = IBV_WC_RECV
        self.send_off = QUEUE * LAT_SIZE
        sge = SGE(end.msg.buf + self.send_off, LAT_SIZE, end.msg.lkey)
        self.wr = SendWR(0, IBV_WR_SEND, 1, sg=[sge], send_flags=IBV_SEND_SIGNALED)
        self.sends_out = 0
        self.events = False
        self._armed = False

    def send(self, payload: bytes | memoryview) -> None:
        while self.sends_out >= QUEUE - 1:
            self.wait_recv(block_on_send=True)
        self.end.msg.view[self.send_off : self.send_off + LAT_SIZE] = payload
        self.end.qp.post_send(self.wr)
        self.sends_out += 1

    def wait_recv(self, block_on_send: bool = False) -> bytes:
        """Poll until a receive completes; repost it and return its bytes."""
        cq, view = self.end.cq, self.end.msg.view
        deadline = _deadline()
        out = b""
        while True:
            _, wcs = cq.poll(4)
            for wc in wcs:
                _check(wc, "ping-pong")
                if wc.opcode == self.recv_op:
                    slot = wc.wr_id
                    out = bytes(view[slot * LAT_SIZE : (slot + 1) * LAT_SIZE])
                    self.end.post_recv(slot)
                    if not block_on_send:
                        return out
                else:
                    self.sends_out -= 1
                    if block_on_send:
                        return out
            if not wcs:
                if self.events:
                    self._sleep(cq)
                    continue
                idle(self.spin)
                if time.monotonic() > deadline:
                    raise BenchError(f"ping-pong: no completion for {STALL_TIMEOUT} s")

    def _sleep(self, cq: Any) -> None:
        """The CQ was empty: arm it and poll once more (a completion written
        before the arming is not announced), or sleep until its event."""
        if not self._armed:
            cq.req_notify()
            self._armed = True
            return
        from softverbs import PyverbsError

        try:
            self.end.channel.get_cq_event(cq, timeout=STALL_TIMEOUT)
        except PyverbsError as e:
            raise BenchError(f"ping-pong: no completion event for {STALL_TIMEOUT} s: {e}") from e
        cq.ack_events(1)
        self._armed = False


def _install_profiler(prefix: str) -> Callable[[], None]:
    """cProfile every thread started from now on, and this one; returns the dump function."""
    import cProfile
    import threading

    profiles: list[tuple[str, cProfile.Profile]] = []
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        profiles.append((self.name, prof))
        prof.enable()
        try:
            original(self)
        finally:
            prof.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main = cProfile.Profile()
    profiles.append(("main", main))
    main.enable()

    def dump() -> None:
        main.disable()
        for name, prof in profiles:
            prof.dump_stats(f"{prefix}-{name}.prof")

    return dump


def role_sv_server(args: argparse.Namespace, s: Settings) -> None:
    from softverbs import counters

    dump = _install_profiler(os.path.join(args.profile, "server")) if args.profile else None
    end = SvEnd(args.device, max(s.sizes))
    ctl = serve_control(s.timeout)
    try:
        ctl.send(**end.info())
        end.connect(ctl.recv())
        pp = PingPong(end, s.spin)
        while True:
            msg = ctl.recv()
            cmd = msg["cmd"]
            if cmd == "zero":
                end.mr.view[:] = bytes(len(end.mr.view))
                ctl.send(ok=True)
            elif cmd == "counters":
                ctl.send(**{k: v for k, v in counters(end.ctx).items() if v})
            elif cmd == "cpu":
                ctl.send(seconds=time.process_time())
            elif cmd == "hash":
                ctl.send(sha256=hashlib.sha256(end.mr.view[: msg["size"]]).hexdigest())
            elif cmd == "pingpong":
                pp.events = bool(msg.get("events"))
                ctl.send(ok=True)
                for _ in range(msg["iters"]):
                    pp.send(pp.wait_recv())
                ctl.send(ok=True)
            elif cmd == "quit":
                break
            else:
                raise BenchError(f"unknown command {cmd!r}")
    except Exception as e:
        with contextlib.suppress(OSError):
            ctl.send(error=f"server: {e}")
        raise
    finally:
        end.close()
        if dump is not None:
            dump()
        ctl.close()


def role_sv_client(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    from softverbs import counters

    dump = _install_profiler(os.path.join(args.profile, "client")) if args.profile else None
    end = SvEnd(args.device, max(s.sizes))
    ctl = connect_control(args.ctl, s.timeout)
    result: dict[str, Any] = {"write": {}}
    try:
        peer = ctl.recv()
        ctl.send(**end.info())
        end.connect(peer)
        for size in s.sizes:
            ctl.send(cmd="zero")
            ctl.recv()
            end.mr.view[:size] = os.urandom(size)
            count = messages_for(size, s.write_bytes)
            for _ in range(s.warmup):
                write_run(end, peer, size, count, s.spin)
            ctl.send(cmd="cpu")
            server_cpu, client_cpu = ctl.recv()["seconds"], time.process_time()
            rates = [
                count * size / write_run(end, peer, size, count, s.spin) for _ in range(s.runs)
            ]
            ctl.send(cmd="cpu")
            server_cpu = ctl.recv()["seconds"] - server_cpu
            client_cpu = time.process_time() - client_cpu
            ctl.send(cmd="hash", size=size)
            theirs = ctl.recv()["sha256"]
            if theirs != hashlib.sha256(end.mr.view[:size]).hexdigest():
                raise BenchError(f"RDMA WRITE {size} B: the server's buffer differs (hash)")
            packets = s.runs * count * -(-size // MTU)
            result["write"][str(size)] = {
                "rates": rates, "messages": count, "packets": packets,
                "client_cpu_us_per_packet": client_cpu / packets * 1e6,
                "server_cpu_us_per_packet": server_cpu / packets * 1e6,
            }  # fmt: skip
        # the WRITE runs' own (under --loss, the ping-pong adds a timeout per lost packet)
        result["write_counters"] = {k: v for k, v in counters(end.ctx).items() if v}
        if s.lat_iters:
            pp = PingPong(end, s.spin)
            for key, events in (("latency_us", False), ("latency_events_us", True)):
                pp.events = events
                result[key] = _pingpong(ctl, pp, s)
        result["counters"] = {k: v for k, v in counters(end.ctx).items() if v}
        ctl.send(cmd="counters")
        result["server_counters"] = ctl.recv()
        ctl.send(cmd="quit")
    finally:
        end.close()
        if dump is not None:
            dump()
        ctl.close()
    return result


def _pingpong(ctl: Control, pp: PingPong, s: Settings) -> list[float]:
    """One-way latencies (half of each timed round trip, usec) of a ping-pong
    with the server, both sides in ``pp.events``' mode."""
    total = s.lat_warmup + s.lat_iters
    ctl.send(cmd="pingpong", iters=total, events=pp.events)
    ctl.recv()
    samples: list[float] = []
    for i in range(total):
        ping = i.to_bytes(LAT_SIZE, "little")
        t0 = time.perf_counter()
        pp.send(ping)
        pong = pp.wait_recv()
        dt = time.perf_counter() - t0
        if pong != ping:
            raise BenchError(f"ping-pong {i}: got {pong!r} back, sent {ping!r}")
        if i >= s.lat_warmup:
            samples.append(dt / 2 * 1e6)
    ctl.recv()
    return samples


# --- Python UDP roles ------------------------------------------------------------------------
def _udp_socket(addr: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    sock.bind((addr, 0))
    return sock


def role_udp_server(args: argparse.Namespace, s: Settings) -> None:
    sock = _udp_socket(args.addr)
    sock.settimeout(STALL_TIMEOUT)
    ctl = serve_control(s.timeout)
    try:
        ctl.send(port=sock.getsockname()[1])
        while True:
            msg = ctl.recv()
            if msg["cmd"] == "blast":
                count, first, last = 0, 0.0, 0.0
                while True:
                    data, _ = sock.recvfrom(MAX_DATAGRAM)
                    if len(data) < UDP_PAYLOAD:
                        break  # the end marker
                    last = time.perf_counter()
                    if not count:
                        first = last
                    count += 1
                ctl.send(count=count, seconds=last - first)
            elif msg["cmd"] == "pingpong":
                done = 0
                while done < msg["iters"]:
                    data, peer = sock.recvfrom(MAX_DATAGRAM)
                    if len(data) == LAT_DATAGRAM:  # not a late end marker of the blast
                        sock.sendto(data, peer)
                        done += 1
                ctl.send(ok=True)
            elif msg["cmd"] == "quit":
                break
    except TimeoutError:
        with contextlib.suppress(OSError):
            ctl.send(error="udp server: no datagram for a while")
        raise
    finally:
        ctl.close()
        sock.close()


def role_udp_client(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    sock = _udp_socket(args.addr)
    sock.settimeout(STALL_TIMEOUT)
    ctl = connect_control(args.ctl, s.timeout)
    result: dict[str, Any] = {"blast": [], "latency_us": []}
    try:
        dest = (args.peer, int(ctl.recv()["port"]))
        packet = os.urandom(UDP_PAYLOAD)
        for run in range(s.warmup + s.runs):
            ctl.send(cmd="blast")
            t0 = time.perf_counter()
            for _ in range(s.udp_packets):
                sock.sendto(packet, dest)
            sent_s = time.perf_counter() - t0
            # End markers until the count comes back: one may be dropped if the queue is full.
            while not select.select([ctl.sock], [], [], 0.005)[0]:
                sock.sendto(b"end", dest)
            reply = ctl.recv()
            if run >= s.warmup:
                result["blast"].append({"sent": s.udp_packets, "sent_seconds": sent_s, **reply})
        ctl.send(cmd="pingpong", iters=s.warmup * 20 + s.udp_lat_iters)
        ping = os.urandom(LAT_DATAGRAM)
        for i in range(s.warmup * 20 + s.udp_lat_iters):
            t0 = time.perf_counter()
            sock.sendto(ping, dest)
            pong, _ = sock.recvfrom(MAX_DATAGRAM)
            dt = time.perf_counter() - t0
            if pong != ping:
                raise BenchError("UDP ping-pong: the reply differs")
            if i >= s.warmup * 20:
                result["latency_us"].append(dt / 2 * 1e6)
        ctl.recv()
        ctl.send(cmd="quit")
    finally:
        ctl.close()
        sock.close()
    return result


ROLES: dict[str, Callable[[argparse.Namespace, Settings], dict[str, Any] | None]] = {
    "sv-server": role_sv_server,
    "sv-client": role_sv_client,
    "udp-server": role_udp_server,
    "udp-client": role_udp_client,
}


def run_role(args: argparse.Namespace) -> int:
    raw = json.loads(args.settings)
    raw["sizes"] = tuple(raw["sizes"])
    s = Settings(**raw)
    try:
        result = ROLES[args.role](args, s)
    except (BenchError, OSError) as e:
        print(f"bench_loopback {args.role}: {e}", file=sys.stderr)
        return 1
    if result is not None:
        print("RESULT " + json.dumps(result), flush=True)
    return 0


# --- subprocesses -----------------------------------------------------------------------------
class Children:
    """Subprocesses of one measurement: each in its own process group, all killed at exit."""

    def __init__(self, limit: float) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.names: dict[int, str] = {}
        self.end = time.monotonic() + limit

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()

    def remaining(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise BenchError("timed out")
        return left

    def start(
        self, name: str, cmd: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        self.procs.append(p)
        self.names[p.pid] = name
        return p

    def read_line(self, p: subprocess.Popen[str], prefix: str) -> str:
        """The first stdout line of ``p`` that starts with ``prefix`` (rest of the line)."""
        assert p.stdout is not None
        while True:
            name = self.names[p.pid]
            if not select.select([p.stdout], [], [], self.remaining())[0]:
                raise BenchError(f"{name}: no {prefix!r} line in time")
            line = p.stdout.readline()
            if not line:
                raise BenchError(f"{name} exited without {prefix!r}: {self.stderr_of(p)}")
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    def finish(self, p: subprocess.Popen[str]) -> str:
        """Wait for ``p``; its stdout, or BenchError if it failed or overstayed."""
        try:
            out, err = p.communicate(timeout=self.remaining())
        except subprocess.TimeoutExpired:
            raise BenchError(f"{self.names[p.pid]}: timed out") from None
        if p.returncode != 0:
            tail = err.strip()[-2000:]
            raise BenchError(f"{self.names[p.pid]} exited with {p.returncode}: {tail}")
        return out

    @staticmethod
    def stderr_of(p: subprocess.Popen[str]) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=2)
        if p.stderr is None or p.poll() is None:
            return "(still running)"
        return p.stderr.read().strip()[-2000:]


def _role_cmd(role: str, s: Settings, *extra: str) -> list[str]:
    raw = asdict(s)
    raw["sizes"] = list(s.sizes)
    return [sys.executable, str(SCRIPT), "--role", role, "--settings", json.dumps(raw), *extra]


def _result(out: str) -> dict[str, Any]:
    for line in out.splitlines():
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return data
    raise BenchError("the client printed no result")


def _fresh_addrs() -> tuple[str, str]:
    """Two addresses of a /24 in 127.0.0.0/8 that nobody else is likely to use."""
    net = f"127.{random.randint(100, 254)}.{random.randint(1, 254)}"
    return f"{net}.1", f"{net}.2"


def run_softverbs(s: Settings, profile: str | None, profiler: str = "cprofile") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="svbench-") as tmp:
        srv, cli = _fresh_addrs()
        config = Path(tmp) / "links.json"
        config.write_text(json.dumps({"links": [{"name": "lb_srv", "addrs": [srv]},
                                                {"name": "lb_cli", "addrs": [cli]}]}))  # fmt: skip
        # each process has its own UDP device, in the process, as two hosts would (the
        # host device would serve both from one softverbsd)
        env = {**os.environ, "SOFTVERBS_CONFIG": str(config), "SOFTVERBS_SERVICE": "0"}
        for var in ("SOFTVERBS_FAULTS", "SOFTVERBS_PCAP"):
            env.pop(var, None)
        if s.loss:
            env["SOFTVERBS_FAULTS"] = f"seed=1;drop={s.loss}"
        extra = ["--profile", profile] if profile and profiler == "cprofile" else []

        def wrap(cmd: list[str], who: str) -> list[str]:
            if not profile or profiler != "py-spy":
                return cmd
            out = os.path.join(profile, f"{who}.txt")
            return ["py-spy", "record", "--format", "raw", "--threads", "--idle", "--nonblocking",
                    "-r", "500", "-o", out, "--", *cmd]  # fmt: skip

        with Children(s.timeout) as ch:
            cmd = _role_cmd("sv-server", s, "--device", "lb_srv", *extra)
            server = ch.start("softverbs server", wrap(cmd, "server"), env)
            port = ch.read_line(server, "LISTEN ")
            cmd = _role_cmd("sv-client", s, "--device", "lb_cli", "--ctl", port, *extra)
            client = ch.start("softverbs client", wrap(cmd, "client"), env)
            result = _result(ch.finish(client))
            ch.finish(server)
    return result


def run_python_udp(s: Settings) -> dict[str, Any]:
    srv, cli = _fresh_addrs()
    with Children(s.timeout) as ch:
        server = ch.start("UDP server", _role_cmd("udp-server", s, "--addr", srv))
        port = ch.read_line(server, "LISTEN ")
        cmd = _role_cmd("udp-client", s, "--addr", cli, "--peer", srv, "--ctl", port)
        client = ch.start("UDP client", cmd)
        result = _result(ch.finish(client))
        ch.finish(server)
    return result


# --- ucx_perftest ----------------------------------------------------------------------------
def _free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    """Is some socket listening on TCP ``port``?  (Read /proc, so no probe connection.)"""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as f:
            for line in itertools.islice(f, 1, None):
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def ucx_run(test: list[str], limit: float) -> list[float]:
    """One ucx_perftest server/client pair; the client's final CSV row as floats."""
    exe = shutil.which("ucx_perftest")
    assert exe is not None
    env = {**os.environ, **UCX_ENV}
    for _ in range(3):
        port = _free_tcp_port()
        with Children(limit) as ch:
            server = ch.start("ucx_perftest server", [exe, "-p", str(port)], env)
            while not _listening(port):
                if server.poll() is not None:
                    break
                ch.remaining()
                time.sleep(0.01)
            if server.poll() is not None:
                continue  # the port was taken after all: try another
            cmd = [exe, "127.0.0.1", "-p", str(port), *test, "-f", "-v"]
            client = ch.start(f"ucx_perftest {' '.join(test)}", cmd, env)
            out = ch.finish(client)
            rows = [ln for ln in out.splitlines() if re.match(r"\s*\d+,", ln)]
            if not rows:
                raise BenchError(f"ucx_perftest {' '.join(test)}: no result row in {out!r}")
            with contextlib.suppress(BenchError):
                ch.finish(server)
            return [float(x) for x in rows[-1].split(",")]
    raise BenchError("ucx_perftest: the server did not start")


def ucx_outstanding(size: int) -> int:
    """UCX's ``-O``: WINDOW puts, but no more than UCX_MAX_OUTSTANDING bytes of them.

    UCX 1.13's TCP transport slows to tens of MB/s (sometimes) when tens of
    MiB of puts are queued; softverbs' engine itself never has more than 1024
    packets (4 MiB) unacknowledged, so a byte cap keeps the comparison fair.
    """
    return max(1, min(WINDOW, UCX_MAX_OUTSTANDING // size))


def run_ucx(s: Settings) -> dict[str, Any]:
    """put_bw bytes/s per size (median of runs) and tag_lat median and p99 in usec."""
    bw: dict[str, float] = {}
    for size in s.sizes:
        n = max(16, s.ucx_bytes // size)
        test = ["-t", "ucp_put_bw", "-s", str(size), "-n", str(n), "-w", str(max(2, n // 10)),
                "-O", str(ucx_outstanding(size))]  # fmt: skip
        # Final row: iterations, lat percentile, avg lat, overall lat, avg bw, overall bw,
        # avg msg rate, overall msg rate.  UCX's MB/s are MiB/s; msg/s * size is unambiguous.
        rates = [ucx_run(test, s.timeout)[7] * size for _ in range(s.runs)]
        bw[str(size)] = statistics.median(rates)
    lat: dict[str, float] = {}
    for rank in (50, 99):
        test = ["-t", "tag_lat", "-s", str(LAT_SIZE), "-n", str(s.ucx_lat_iters),
                "-w", str(max(100, s.ucx_lat_iters // 10)), "-R", str(rank)]  # fmt: skip
        lat[f"p{rank}"] = statistics.median(ucx_run(test, s.timeout)[1] for _ in range(s.runs))
    return {"put_bw": bw, "tag_lat_us": lat}


# --- output ----------------------------------------------------------------------------------
def machine() -> str:
    import softverbs

    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"machine: {platform.machine()}, {cpus} CPUs ({usable} usable), "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"softverbs {softverbs.__version__}, Linux {platform.release()}, load {load:.2f}"
    )


def _mb(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 1e6:,.1f}"


def _ratio(a: float, b: float | None) -> str:
    return "n/a" if not b else f"{a / b:.4f}"


def summarize(sv: dict[str, Any], ucx: dict[str, Any] | None, udp: dict[str, Any] | None,
              s: Settings) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {"machine": machine(), "settings": asdict(s), "bandwidth": []}
    ceiling = None
    if udp is not None:
        blasts = udp["blast"]
        pps = statistics.median(b["count"] / b["seconds"] for b in blasts if b["seconds"] > 0)
        ceiling = pps * MTU
        out["python_udp"] = {
            "datagram_bytes": UDP_PAYLOAD,
            "packets_per_s": pps,
            "payload_MBps": ceiling / 1e6,
            "sender_packets_per_s": statistics.median(
                b["sent"] / b["sent_seconds"] for b in blasts
            ),
            "loss_pct": statistics.median(100 * (1 - b["count"] / b["sent"]) for b in blasts),
        }
    for size in s.sizes:
        w = sv["write"][str(size)]
        rates = w["rates"]
        mine = statistics.median(rates)
        theirs = ucx["put_bw"].get(str(size)) if ucx else None
        out["bandwidth"].append({
            "size": size, "softverbs_Bps": mine, "softverbs_runs_Bps": rates,
            "ucx_Bps": theirs, "ratio_ucx": mine / theirs if theirs else None,
            "python_udp_Bps": ceiling, "ratio_python_udp": mine / ceiling if ceiling else None,
            "client_cpu_us_per_packet": w["client_cpu_us_per_packet"],
            "server_cpu_us_per_packet": w["server_cpu_us_per_packet"],
        })  # fmt: skip
    lat: dict[str, Any] = {}
    for key, name in (("latency_us", "softverbs"), ("latency_events_us", "softverbs_events")):
        if sv.get(key):
            v = sv[key]
            lat[name] = {"median": statistics.median(v), "p99": percentile(v, 99), "n": len(v)}
    if ucx is not None:
        lat["ucx"] = {"median": ucx["tag_lat_us"]["p50"], "p99": ucx["tag_lat_us"]["p99"]}
    if udp is not None and udp["latency_us"]:
        v = udp["latency_us"]
        lat["python_udp"] = {"median": statistics.median(v), "p99": percentile(v, 99),
                             "n": len(v)}  # fmt: skip
    out["latency_us"] = lat
    out["softverbs_client_counters"] = sv.get("counters", {})
    out["softverbs_server_counters"] = sv.get("server_counters", {})
    out["softverbs_client_write_counters"] = sv.get("write_counters", {})
    return out


def print_tables(r: dict[str, Any], s: Settings, ucx_note: str) -> None:
    print(r["machine"])
    if s.loss:
        print(f"softverbs runs with seeded loss: {s.loss:.0%} of the packets each process sends")
    print(f"median of {s.runs} runs after {s.warmup} warm-up run(s); MB = 10^6 bytes")
    print()
    print(f"(1) RC RDMA WRITE bandwidth, client -> server process (path MTU {MTU}, "
          f"{WINDOW} outstanding, every {SIGNAL_EVERY}th signaled)")  # fmt: skip
    print(f"    UCX: ucp_put_bw over TCP on lo (-O {WINDOW}, at most "
          f"{human(UCX_MAX_OUTSTANDING)} outstanding){ucx_note}")  # fmt: skip
    print(f"    ceiling: Python UDP blast, {UDP_PAYLOAD}-byte datagrams, "
          f"{MTU} payload bytes counted each")  # fmt: skip
    cols = ("size", "softverbs MB/s", "UCX MB/s", "softverbs/UCX", "Py-UDP MB/s",
            "softverbs/Py-UDP")  # fmt: skip
    print(" {:>7}  {:>14}  {:>10}  {:>13}  {:>11}  {:>16}".format(*cols))
    for row in r["bandwidth"]:
        print(" {:>7}  {:>14}  {:>10}  {:>13}  {:>11}  {:>16}".format(
            human(row["size"]), _mb(row["softverbs_Bps"]), _mb(row["ucx_Bps"]),
            _ratio(row["softverbs_Bps"], row["ucx_Bps"]), _mb(row["python_udp_Bps"]),
            _ratio(row["softverbs_Bps"], row["python_udp_Bps"])))  # fmt: skip
    print()
    print(f"(1b) softverbs process CPU time per {MTU}-byte packet during (1), usec, all threads")
    print("     (the server's is its cost per packet received, steadier than MB/s on a shared")
    print("     machine; the client busy-polls, so its figure is close to wall time)")
    print(" {:>7}  {:>11}  {:>11}".format("size", "client", "server"))
    for row in r["bandwidth"]:
        print(f" {human(row['size']):>7}  {row['client_cpu_us_per_packet']:>11.1f}  "
              f"{row['server_cpu_us_per_packet']:>11.1f}")  # fmt: skip
    print()
    print(f"(2) one-way latency (round trip / 2), {LAT_SIZE}-byte messages, usec")
    print(" {:<34}  {:>8}  {:>8}".format("stack", "median", "p99"))
    names = {"softverbs": f"softverbs RC SEND {LAT_SIZE} B (busy poll)",
             "softverbs_events": f"softverbs RC SEND {LAT_SIZE} B (events)",
             "ucx": f"UCX tag_lat {LAT_SIZE} B, TCP",
             "python_udp": f"Python UDP {LAT_DATAGRAM} B datagram"}  # fmt: skip
    for key, name in names.items():
        v = r["latency_us"].get(key)
        med, p99 = ("n/a", "n/a") if v is None else (f"{v['median']:.1f}", f"{v['p99']:.1f}")
        print(f" {name:<34}  {med:>8}  {p99:>8}")
    u = r.get("python_udp")
    if u:
        print()
        print(f"Python UDP ceiling: {u['packets_per_s']:,.0f} packets/s received "
              f"({u['payload_MBps']:,.1f} MB/s payload), sender {u['sender_packets_per_s']:,.0f}"
              f" packets/s, loss {u['loss_pct']:.1f}%")  # fmt: skip
    for side in ("client", "server"):
        c = r[f"softverbs_{side}_counters"]
        print(f"softverbs {side} counters: " + (", ".join(f"{k} {v}" for k, v in c.items()) or "-"))
    if s.loss:
        c = r["softverbs_client_write_counters"]
        print("softverbs client counters after (1): " + ", ".join(f"{k} {v}" for k, v in c.items()))


def plot(path: str, r: dict[str, Any], out: IO[str]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable; skipping the plot ({path}).", file=out)
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = r["bandwidth"]
    xs = range(len(rows))
    series = (("softverbs", "softverbs_Bps"), ("UCX TCP", "ucx_Bps"),
              ("Python UDP", "python_udp_Bps"))  # fmt: skip
    for k, (label, key) in enumerate(series):
        ys = [(row[key] or 0) / 1e6 for row in rows]
        ax1.bar([x + (k - 1) * 0.27 for x in xs], ys, 0.27, label=label)
    ax1.set_xticks(list(xs), [human(row["size"]) for row in rows])
    ax1.set(title="RDMA WRITE / put bandwidth, two processes", ylabel="MB/s (log)",
            yscale="log")  # fmt: skip
    ax1.legend(fontsize=8)
    lat = r["latency_us"]
    names = [k for k in ("softverbs", "softverbs_events", "ucx", "python_udp") if k in lat]
    ax2.bar(names, [lat[k]["median"] for k in names], label="median")
    ax2.scatter(names, [lat[k]["p99"] for k in names], color="k", marker="_", s=400, label="p99")
    ax2.set(title=f"one-way latency, {LAT_SIZE} B", ylabel="usec (log)", yscale="log")
    ax2.legend(fontsize=8)
    fig.suptitle(r["machine"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}", file=out)


def print_profiles(directory: str) -> None:
    import pstats

    for prof in sorted(Path(directory).glob("*.prof")):
        print(f"--- {prof.name} (top 15 by own time)")
        stats = pstats.Stats(str(prof), stream=sys.stdout)
        stats.strip_dirs().sort_stats("tottime").print_stats(15)


@contextlib.contextmanager
def step(what: str, quiet: bool) -> Iterator[None]:
    t0 = time.monotonic()
    if not quiet:
        print(f"[{what} ...]", file=sys.stderr, flush=True)
    yield
    if not quiet:
        print(f"[{what}: {time.monotonic() - t0:.1f} s]", file=sys.stderr, flush=True)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (small counts)")
    ap.add_argument("--runs", type=int, help="timed runs per figure (median reported)")
    ap.add_argument("--sizes", help="comma-separated WRITE sizes (default 4K,64K,1M,4M)")
    ap.add_argument("--no-ucx", action="store_true", help="skip ucx_perftest")
    ap.add_argument(
        "--spin",
        action="store_true",
        help="softverbs pollers never pause (default: sched_yield() after an empty poll)",
    )
    ap.add_argument("--loss", type=float, default=0.0, metavar="P",
                    help="drop this fraction of the packets each softverbs process sends "
                    "(seeded: SOFTVERBS_FAULTS=seed=1;drop=P)")  # fmt: skip
    ap.add_argument("--no-latency", action="store_true",
                    help="leave out softverbs' ping-pong (under --loss, each packet it "
                    "loses waits out the ACK timeout)")  # fmt: skip
    ap.add_argument("--plot", metavar="FILE", help="also write a PNG plot (needs matplotlib)")
    ap.add_argument("--json", action="store_true", help="print one JSON object, not tables")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress lines on stderr (also with --json)")  # fmt: skip
    ap.add_argument(
        "--profile", metavar="DIR", help="profile the softverbs WRITE case in both processes"
    )
    ap.add_argument("--profiler", choices=("cprofile", "py-spy"), default="cprofile")
    ap.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--settings", help=argparse.SUPPRESS)
    for internal in ("--device", "--addr", "--peer"):
        ap.add_argument(internal, help=argparse.SUPPRESS)
    ap.add_argument("--ctl", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        return run_role(args)
    quiet = args.json or args.quiet

    # SIGTERM (e.g. from timeout(1)) unwinds like Ctrl-C, so the children are killed too.
    signal.signal(signal.SIGTERM, _terminate)
    s = QUICK if args.quick else FULL
    if args.runs:
        s = replace(s, runs=args.runs)
    if args.sizes:
        s = replace(s, sizes=tuple(parse_size(x) for x in args.sizes.split(",")))
    if args.spin:
        s = replace(s, spin=True)
    if args.loss:
        if not 0 < args.loss < 1:
            print("bench_loopback: --loss must be between 0 and 1", file=sys.stderr)
            return 2
        s = replace(s, loss=args.loss)
    if args.no_latency:
        s = replace(s, lat_iters=0)
    try:
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            sizes = s.sizes if args.sizes else (1 << 20,)
            sp = replace(s, sizes=sizes, lat_iters=0)
            if args.profiler == "py-spy" and shutil.which("py-spy") is None:
                print("bench_loopback: py-spy is not installed", file=sys.stderr)
                return 1
            with step(f"softverbs under {args.profiler}", False):
                res = run_softverbs(sp, os.path.abspath(args.profile), args.profiler)
            for size in sp.sizes:
                w = res["write"][str(size)]
                print(f"{human(size)}: {statistics.median(w['rates']) / 1e6:,.1f} MB/s (profiled)")
            for side in ("counters", "server_counters"):
                print(f"{side}: {res.get(side)}")
            if args.profiler == "cprofile":
                print_profiles(args.profile)
            return 0
        with step("softverbs", quiet):
            sv = run_softverbs(s, None)
        with step("Python UDP", quiet):
            udp = run_python_udp(s)
        ucx: dict[str, Any] | None = None
        note = ""
        if args.no_ucx:
            note = ": skipped (--no-ucx)"
        elif shutil.which("ucx_perftest") is None:
            note = ": skipped, ucx_perftest not found (apt-get install ucx-utils)"
        else:
            with step("ucx_perftest", quiet):
                ucx = run_ucx(s)
    except BenchError as e:
        print(f"bench_loopback: FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"bench_loopback: interrupted ({e or 'Ctrl-C'}); children killed", file=sys.stderr)
        return 130
    r = summarize(sv, ucx, udp, s)
    r["ucx_note"] = note
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print_tables(r, s, note)
    if args.plot:
        out = sys.stderr if args.json else sys.stdout
        print(file=out)
        plot(args.plot, r, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
