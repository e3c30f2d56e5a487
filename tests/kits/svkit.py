"""Kit for the device-service tests: real processes, bounded waits.

Every participant -- the service itself, senders, receivers -- is a separate
OS process.  They are forked from a ``multiprocessing`` fork server that has
already imported softverbs (so a process costs milliseconds, not an
interpreter start), and each talks to the test over a pipe.  Nothing here
waits without a bound: :meth:`Worker.recv` and :func:`poll_cq` fail with a
message that says what was expected.

A worker runs a *role*: a class whose constructor builds the process's verbs
objects and whose ``op_*`` methods are the commands the test sends.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    SRQ,
    WC,
    XRCD,
    AHAttr,
    Context,
    GlobalRoute,
    PyverbsRDMAError,
    QPAttr,
    QPCap,
    QPInitAttr,
    QPInitAttrEx,
    RecvWR,
    SendWR,
    SrqInitAttrEx,
    XRCDInitAttr,
    open_qp,
    testing,
    xrc_rcv_qp_alloc,
    xrc_rcv_qp_register,
    xrc_rcv_qp_unregister,
)
from softverbs.device import ops, protocol, records
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_1024,
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_AV,
    IBV_QP_DEST_QPN,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_MAX_DEST_RD_ATOMIC,
    IBV_QP_MIN_RNR_TIMER,
    IBV_QP_PATH_MTU,
    IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,
    IBV_QP_RQ_PSN,
    IBV_QP_STATE,
    IBV_QPT_RC,
    IBV_QPT_XRC_SEND,
    IBV_SRQ_INIT_ATTR_CQ,
    IBV_SRQ_INIT_ATTR_PD,
    IBV_SRQ_INIT_ATTR_TYPE,
    IBV_SRQ_INIT_ATTR_XRCD,
    IBV_SRQT_XRC,
    IBV_WR_SEND,
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
)
from softverbs.verbs.served import Connection

ALL_ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
              | IBV_ACCESS_REMOTE_ATOMIC)  # fmt: skip
#: seconds any single wait may take before the test fails
WAIT = 20.0
#: receive buffer slot per message
SLOT = 256

CTX = multiprocessing.get_context("forkserver")
# What the fork server imports once for every child.  (Not this module:
# Python 3.11's fork server ignores the parent's sys.path, so it could not
# find it; children import it themselves, in a few milliseconds.)
CTX.set_forkserver_preload(["softverbs", "softverbs.verbs.served", "softverbs.service.server",
                            "multiprocessing.connection"])  # fmt: skip


# --- the service ---------------------------------------------------------------------


def _serve(path: str, env: dict[str, str]) -> None:
    from softverbs.service.server import main

    os.environ.pop("SOFTVERBS_SERVICE", None)
    os.environ.update(env)
    raise SystemExit(main(["--socket", path]))


class ServiceProc:
    """softverbsd in its own process, on its own socket."""

    def __init__(self, path: str, env: dict[str, str] | None = None) -> None:
        """``env``: settings for this service.  It is forked from the forkserver,
        whose environment is the one of the first ServiceProc: a variable set
        later in the test process does not reach it."""
        self.path = path
        self.proc = CTX.Process(target=_serve, args=(path, env or {}), name="softverbsd")
        self.proc.start()
        deadline = time.monotonic() + 3 * WAIT  # a loaded machine starts processes slowly
        while True:
            try:
                self.stats()
                return
            except (PyverbsRDMAError, OSError):
                if not self.proc.is_alive() or time.monotonic() > deadline:
                    raise AssertionError(f"softverbsd did not come up on {path} (exit code "
                                         f"{self.proc.exitcode})") from None  # fmt: skip
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def connection(self) -> Connection:
        return Connection(self.path, spawn=False)

    def stats(self) -> dict[str, Any]:
        """The service's live-object counters (this connection left out)."""
        conn = self.connection()
        try:
            _, tail = conn.call(ops.STATUS, records.Empty())
            stats: dict[str, Any] = json.loads(tail)
            stats["xrc_holders"] = {f"{x['qpn']:#x}": x["holders"] for x in stats["xrc_rcv_qps"]}
            return stats
        finally:
            conn.close()

    def counters(self, dev: str = "sv0") -> dict[str, int]:
        raw = Raw(self.path)
        try:
            ctx = raw.open_device(dev)
            reply = raw.call(ops.COUNTERS, records.Ctx(ctx, 0))
            assert not reply.header.status, reply.error
            return {str(k): int(v) for k, v in json.loads(reply.tail).items()}
        finally:
            raw.close()

    def alive(self) -> bool:
        """Running and serving: it answers a new client."""
        if not self.proc.is_alive():
            return False
        try:
            self.stats()
        except (PyverbsRDMAError, OSError):
            return False
        return True

    def wait_stats(self, pred: Callable[[dict[str, Any]], bool], what: str,
                   timeout: float = WAIT) -> dict[str, Any]:  # fmt: skip
        """Poll the stats until ``pred`` holds (the service notices a death
        when it reads the closed socket: soon, not at once)."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            if pred(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"service stats never showed {what}: {st}")
            time.sleep(0.02)

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self) -> int | None:
        if self.proc.is_alive():
            os.kill(self.pid, signal.SIGTERM)
            self.proc.join(WAIT)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
                raise AssertionError("softverbsd did not stop on SIGTERM")
        return self.proc.exitcode


class Raw:
    """A bare protocol connection: requests the verbs layer never makes, as a
    client that is not ours would send them."""

    def __init__(self, path: str, hello: bool = True, memory: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(WAIT)
        self.sock.connect(path)
        self.seq = 100
        self.keep: list[socket.socket] = []
        if hello:
            fds = [os.open("/proc/self/mem", os.O_RDWR)] if memory else []
            reply = self.call(ops.HELLO, records.Hello(0, protocol.PROTOCOL_VERSION, int(memory),
                                                   os.getpid(), 0), fds)  # fmt: skip
            for fd in fds:
                os.close(fd)
            assert not reply.header.status, reply.error

    def send(self, data: bytes, fds: list[int] | None = None) -> None:
        protocol.send(self.sock, data, fds)

    def recv(self) -> protocol.Message:
        data, got = protocol.recv(self.sock)
        for fd in got:
            os.close(fd)
        return protocol.decode(data)

    def call(self, op: Any, body: Any, fds: list[int] | None = None,
             tail: bytes = b"") -> protocol.Message:  # fmt: skip
        """One request; the reply (an error reply has ``header.status``)."""
        self.seq += 1
        self.send(protocol.encode(op, self.seq, body, tail), fds)
        while True:
            msg = self.recv()
            if msg.header.seq == self.seq:
                return msg

    def open_device(self, name: str = "sv0") -> int:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.keep.append(mine)
        fd = theirs.detach()
        try:
            reply = self.call(ops.OPEN_DEVICE, records.OpenDevice(name), [fd])
        finally:
            os.close(fd)
        assert not reply.header.status, reply.error
        return int(reply.body.ctx)

    def close(self) -> None:
        for s in self.keep:
            s.close()
        self.sock.close()


# --- workers -------------------------------------------------------------------------


def _worker_main(role: type, pipe: multiprocessing.connection.Connection, path: str,
                 args: tuple[Any, ...]) -> None:  # fmt: skip
    os.environ["SOFTVERBS_SERVICE"] = path
    try:
        obj = role(*args)
        pipe.send({"ready": getattr(obj, "info", {})})
        while True:
            if not pipe.poll(120):
                return  # the test went away
            cmd = pipe.recv()
            if cmd["op"] == "exit":
                pipe.send({"ok": True})
                return
            result = getattr(obj, f"op_{cmd['op']}")(**cmd.get("args", {}))
            pipe.send({"ok": result})
    except BaseException:
        with contextlib.suppress(Exception):
            pipe.send({"error": traceback.format_exc()})
        raise SystemExit(1) from None


class Worker:
    """A real OS process running ``role(*args)``, commanded over a pipe."""

    def __init__(self, service: ServiceProc, role: type, *args: Any, wait: bool = True) -> None:
        self.name = role.__name__
        self.pipe, child = CTX.Pipe()
        self.proc = CTX.Process(target=_worker_main, args=(role, child, service.path, args),
                                name=self.name, daemon=True)  # fmt: skip
        self.proc.start()
        child.close()
        self.info: dict[str, Any] = {}
        self.exiting = False
        if wait:
            self.ready()

    def ready(self, timeout: float = WAIT) -> dict[str, Any]:
        self.info = self._recv(timeout)["ready"]
        return self.info

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def _recv(self, timeout: float) -> dict[str, Any]:
        if not self.pipe.poll(timeout):
            raise AssertionError(f"{self.name} (pid {self.pid}) did not answer in {timeout} s")
        try:
            msg: dict[str, Any] = self.pipe.recv()
        except EOFError:
            raise AssertionError(f"{self.name} (pid {self.pid}) died "
                                 f"(exit code {self.proc.exitcode})") from None  # fmt: skip
        if "error" in msg:
            raise AssertionError(f"{self.name} (pid {self.pid}) failed:\n{msg['error']}")
        return msg

    def send(self, op: str, **args: Any) -> None:
        self.pipe.send({"op": op, "args": args})
        self.exiting = self.exiting or op == "exit"

    def result(self, timeout: float = WAIT) -> Any:
        return self._recv(timeout)["ok"]

    def call(self, op: str, *, within: float = WAIT + 5, **args: Any) -> Any:
        """Run ``op`` in the worker; its result, within ``within`` seconds."""
        self.send(op, **args)
        return self.result(within)

    def kill(self) -> None:
        if self.proc.is_alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.join(WAIT)

    def finish(self, timeout: float = WAIT) -> None:
        """Tell the worker to exit and check it did, cleanly."""
        if not self.exiting:
            self.send("exit")
        self.result(timeout)
        self.proc.join(timeout)
        assert not self.proc.is_alive(), f"{self.name} did not exit"
        assert self.proc.exitcode == 0, f"{self.name} exited with {self.proc.exitcode}"

    def cleanup(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.pipe.close()


# --- verbs helpers (used inside workers) ---------------------------------------------


def poll_cq(cq: CQ, n: int, timeout: float = WAIT, what: str = "completions") -> list[WC]:
    """Poll until ``n`` completions arrived.  In service mode the doorbell is a
    message, so work finishes a little after the post returns."""
    got: list[WC] = []
    deadline = time.monotonic() + timeout
    idle = 0
    while len(got) < n:
        _, wcs = cq.poll(n - len(got))
        if wcs:
            got.extend(wcs)
            idle = 0
            continue
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {n} {what} after {timeout} s: {got}")
        idle += 1
        if idle > 50:
            time.sleep(0.0005)
    return got


def quiet(cq: CQ, seconds: float) -> list[WC]:
    """Whatever arrives on ``cq`` within ``seconds`` (expected: nothing)."""
    got: list[WC] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got.extend(cq.poll(16)[1])
        time.sleep(0.005)
    return got


def open_xrcd(ctx: Context, path: str) -> XRCD:
    """The XRC domain shared through ``path`` (created if needed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        return XRCD(ctx, XRCDInitAttr(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
                                      os.O_CREAT, fd))  # fmt: skip
    finally:
        os.close(fd)


def xrc_srq(ctx: Context, pd: PD, xrcd: XRCD, cq: CQ, max_wr: int) -> SRQ:
    attr = SrqInitAttrEx(max_wr=max_wr, max_sge=1)
    attr.srq_type = IBV_SRQT_XRC
    attr.pd, attr.xrcd, attr.cq = pd, xrcd, cq
    attr.comp_mask = (IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ
                      | IBV_SRQ_INIT_ATTR_XRCD)  # fmt: skip
    return SRQ(ctx, attr)


def ah(ctx: Context) -> AHAttr:
    """Everyone shares the service's sv0: its own GID is the peer's."""
    return AHAttr(is_global=1, port_num=1, gr=GlobalRoute(dgid=ctx.query_gid(1, 1), sgid_index=1))


#: the mask xrc_rcv_qp_alloc is given: RESET->INIT and INIT->RTR in one
RECV_MASK = (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS | IBV_QP_AV
             | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC
             | IBV_QP_MIN_RNR_TIMER)  # fmt: skip


def recv_attr(ctx: Context, send_qpn: int) -> QPAttr:
    a = QPAttr()
    a.qp_access_flags = 0
    a.pkey_index = 0
    a.port_num = 1
    a.dest_qp_num = send_qpn
    a.path_mtu = IBV_MTU_1024
    a.rq_psn = 0
    a.max_dest_rd_atomic = 1
    a.min_rnr_timer = 1
    a.ah_attr = ah(ctx)
    return a


def connect(qp: QP, ctx: Context, dest_qpn: int, timeout: int = 14, retry_cnt: int = 7) -> None:
    """INIT -> RTR -> RTS towards ``dest_qpn`` on the same device."""
    testing.connect_qp(qp, dest_qpn, ah(ctx), qp_access_flags=ALL_ACCESS, timeout=timeout,
                       retry_cnt=retry_cnt)  # fmt: skip


def xrc_send_qp(pd: PD, cq: CQ, depth: int) -> QP:
    init = QPInitAttrEx(qp_type=IBV_QPT_XRC_SEND, scq=cq, pd=pd, comp_mask=IBV_QP_INIT_ATTR_PD,
                        cap=QPCap(max_send_wr=depth, max_recv_wr=0, max_send_sge=1,
                                  max_recv_sge=0, max_inline_data=64))  # fmt: skip
    a = QPAttr()
    a.qp_access_flags = 0
    return QP(pd.ctx, init, a)


def rc_qp(pd: PD, cq: CQ, depth: int = 16, srq: SRQ | None = None) -> QP:
    init = QPInitAttr(qp_type=IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, sq_sig_all=1,
                      cap=QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1,
                                max_recv_sge=1))  # fmt: skip
    a = QPAttr()
    a.qp_access_flags = ALL_ACCESS
    return QP(pd, init, a)


def tag(target: int, seq: int) -> bytes:
    """A message payload naming the SRQ it is for (and its sequence number)."""
    return f"to:{target}:seq:{seq}".encode().ljust(32, b".")


def untag(data: bytes) -> tuple[int, int]:
    parts = data.rstrip(b".").decode().split(":")
    return int(parts[1]), int(parts[3])


# --- roles ------------------------------------------------------------------------------


class XrcReceiver:
    """A receiving process: an XRC domain (shared through a file), a CQ and
    an XRC SRQ with receives posted.  ``alloc`` makes the receive QP
    (seed 002 step 3); ``register`` attaches to one (step 7)."""

    def __init__(self, xrcd_path: str, depth: int = 64) -> None:
        self.ctx = Context(name="sv0")
        self.pd = PD(self.ctx)
        self.xrcd = open_xrcd(self.ctx, xrcd_path)
        self.cq = CQ(self.ctx, depth * 2)
        self.mr = MR(self.pd, depth * SLOT, IBV_ACCESS_LOCAL_WRITE)
        self.depth = depth
        self.srq: SRQ | None = None
        self.qpn = 0
        self.info = {"pid": os.getpid()}

    def _make_srq(self) -> int:
        self.srq = xrc_srq(self.ctx, self.pd, self.xrcd, self.cq, self.depth)
        for i in range(self.depth):
            self._post(i)
        return int(self.srq.get_srq_num())

    def _post(self, i: int) -> None:
        assert self.srq is not None
        self.srq.post_recv(RecvWR(i, 1, [SGE(self.mr.buf + i * SLOT, SLOT, self.mr.lkey)]))

    def op_alloc(self, send_qpn: int) -> dict[str, int]:
        """Steps 3 and 4: the receive QP (registered), then the SRQ."""
        self.qpn = xrc_rcv_qp_alloc(self.xrcd, recv_attr(self.ctx, send_qpn), RECV_MASK)
        return {"qpn": self.qpn, "srqn": self._make_srq()}

    def op_srq(self) -> dict[str, int]:
        return {"srqn": self._make_srq()}

    def op_register(self, qpn: int) -> None:
        xrc_rcv_qp_register(self.xrcd, qpn)
        self.qpn = qpn

    def op_unregister(self, qpn: int | None = None) -> None:
        xrc_rcv_qp_unregister(self.xrcd, self.qpn if qpn is None else qpn)

    def op_try(self, what: str, qpn: int) -> int:
        """``register``/``unregister``/``open`` ``qpn``; the errno, 0 on success."""
        try:
            if what == "register":
                xrc_rcv_qp_register(self.xrcd, qpn)
            elif what == "unregister":
                xrc_rcv_qp_unregister(self.xrcd, qpn)
            else:
                open_qp(self.ctx, self.xrcd, qpn)
        except PyverbsRDMAError as exc:
            return exc.error_code
        return 0

    def op_expect(self, n: int, me: int, timeout: float = WAIT) -> list[int]:
        """Take ``n`` messages; each must be addressed to ``me``.  Their
        sequence numbers, in arrival order."""
        seqs = []
        for wc in poll_cq(self.cq, n, timeout, f"messages for receiver {me}"):
            assert wc.status == 0, f"receiver {me}: {wc}"
            assert wc.qp_num == self.qpn, f"receiver {me}: {wc} not from QP {self.qpn:#x}"
            data = self.mr.read(32, wc.wr_id * SLOT)
            target, seq = untag(data)
            assert target == me, f"receiver {me} got a message for {target}"
            assert wc.byte_len == 32, wc
            seqs.append(seq)
            self._post(wc.wr_id)
        return seqs

    def op_nothing(self, seconds: float = 0.3) -> int:
        """How many completions arrive in ``seconds`` (expected: none)."""
        return len(quiet(self.cq, seconds))


class XrcSender:
    """The sending process: one XRC send QP (seed 002 step 1)."""

    def __init__(self, depth: int = 64, timeout: int = 14, retry_cnt: int = 7) -> None:
        self.ctx = Context(name="sv0")
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, depth * 2)
        self.mr = MR(self.pd, depth * 64, IBV_ACCESS_LOCAL_WRITE)
        self.depth = depth
        self.qp = xrc_send_qp(self.pd, self.cq, depth)
        self.timeout, self.retry_cnt = timeout, retry_cnt
        self.info = {"qpn": self.qp.qp_num, "pid": os.getpid()}

    def op_connect(self, qpn: int) -> int:
        connect(self.qp, self.ctx, qpn, self.timeout, self.retry_cnt)
        return int(self.qp.qp_state)

    def op_send(self, msgs: list[tuple[int, int, int]], timeout: float = WAIT) -> list[int]:
        """Send (srqn, target, seq) messages, all signaled; their WC statuses."""
        statuses: list[int] = []
        pending = 0
        for i, (srqn, target, seq) in enumerate(msgs):
            while pending >= self.depth:
                wcs = poll_cq(self.cq, 1, timeout, "send completions")
                statuses.extend(w.status for w in wcs)
                pending -= len(wcs)
            off = (i % self.depth) * 64  # free: at most depth sends are pending
            self.mr.write(tag(target, seq), 32, off)
            wr = SendWR(i, IBV_WR_SEND, 1, sg=[SGE(self.mr.buf + off, 32, self.mr.lkey)])
            wr.set_qp_type_xrc(srqn)
            self.qp.post_send(wr)
            pending += 1
        statuses.extend(w.status for w in poll_cq(self.cq, pending, timeout, "send completions"))
        return statuses

    def op_state(self) -> int:
        return int(self.qp.qp_state)


class RcPeer:
    """A process with an RC QP (and, with ``loop``, a second one connected to
    the first inside the same process and PD), an MR with every right, and a
    CQ -- on a completion channel with ``channel``, taking receives from an
    SRQ with ``srq``."""

    def __init__(self, loop: bool = False, channel: bool = False, srq: bool = False,
                 extra_mrs: int = 0) -> None:  # fmt: skip
        from softverbs import CompChannel, SrqAttr, SrqInitAttr

        self.ctx = Context(name="sv0")
        self.pd = PD(self.ctx)
        self.channel = CompChannel(self.ctx) if channel else None
        self.cq = CQ(self.ctx, 64, None, self.channel)
        self.mr = MR(self.pd, 8192, ALL_ACCESS)
        self.extra = [MR(self.pd, 64, ALL_ACCESS) for _ in range(extra_mrs)]
        self.srq = SRQ(self.pd, SrqInitAttr(SrqAttr(max_wr=16))) if srq else None
        self.qp = rc_qp(self.pd, self.cq, srq=self.srq)
        self.qp2: QP | None = None
        if loop:
            self.qp2 = rc_qp(self.pd, self.cq)
            connect(self.qp, self.ctx, self.qp2.qp_num)
            connect(self.qp2, self.ctx, self.qp.qp_num)
        self.info = {"qpn": self.qp.qp_num, "qp_handle": self.qp.dev_handle,
                     "qp2n": self.qp2.qp_num if self.qp2 else None,
                     "addr": self.mr.buf, "rkey": self.mr.rkey,
                     "lkey": self.mr.lkey, "pid": os.getpid(),
                     "mr_numbers": [m.dev_handle for m in [self.mr, *self.extra]]}

    def op_connect(self, qpn: int) -> None:
        connect(self.qp, self.ctx, qpn)

    def op_recv(self, n: int, off: int = 0, length: int = 256, qp2: bool = False) -> None:
        for i in range(n):
            wr = RecvWR(100 + i, 1, [SGE(self.mr.buf + off + i * length, length, self.mr.lkey)])
            if self.srq is not None and not qp2:
                self.srq.post_recv(wr)
            else:
                (self.qp2 if qp2 else self.qp).post_recv(wr)  # type: ignore[union-attr]

    def _post(self, wr: SendWR) -> None:
        self.qp.post_send(wr)

    def op_send(self, data: bytes, off: int = 0, lkey: int | None = None,
                addr: int | None = None) -> None:  # fmt: skip
        self.mr.write(data, len(data), off)
        sge = SGE(self.mr.buf + off if addr is None else addr, len(data),
                  self.mr.lkey if lkey is None else lkey)  # fmt: skip
        self._post(SendWR(1, IBV_WR_SEND, 1, sg=[sge]))

    def op_write(self, rkey: int, addr: int, data: bytes, off: int = 0) -> None:
        from softverbs.enums import IBV_WR_RDMA_WRITE

        self.mr.write(data, len(data), off)
        wr = SendWR(2, IBV_WR_RDMA_WRITE, 1, sg=[SGE(self.mr.buf + off, len(data), self.mr.lkey)])
        wr.set_wr_rdma(rkey, addr)
        self._post(wr)

    def op_read(self, rkey: int, addr: int, length: int, off: int) -> None:
        from softverbs.enums import IBV_WR_RDMA_READ

        wr = SendWR(3, IBV_WR_RDMA_READ, 1, sg=[SGE(self.mr.buf + off, length, self.mr.lkey)])
        wr.set_wr_rdma(rkey, addr)
        self._post(wr)

    def op_atomic(self, kind: str, rkey: int, addr: int, compare_add: int, swap: int = 0,
                  off: int = 4096) -> None:  # fmt: skip
        from softverbs.enums import IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD

        opcode = IBV_WR_ATOMIC_FETCH_AND_ADD if kind == "faa" else IBV_WR_ATOMIC_CMP_AND_SWP
        wr = SendWR(4, opcode, 1, sg=[SGE(self.mr.buf + off, 8, self.mr.lkey)])
        wr.set_wr_atomic(rkey, addr, compare_add, swap)
        self._post(wr)

    def op_poll(self, n: int, timeout: float = WAIT) -> list[tuple[int, int, int, int]]:
        """(status, opcode, byte_len, qp_num) of the next ``n`` completions."""
        return [(w.status, w.opcode, w.byte_len, w.qp_num) for w in poll_cq(self.cq, n, timeout)]

    def op_nothing(self, seconds: float = 0.2) -> int:
        return len(quiet(self.cq, seconds))

    def op_mr_read(self, off: int, length: int) -> bytes:
        return bytes(self.mr.read(length, off))

    def op_mr_write(self, off: int, data: bytes) -> None:
        self.mr.write(data, len(data), off)

    def op_cq_event(self, timeout: float = WAIT) -> int:
        """Arm the CQ, wait for its completion event; then poll what is there."""
        assert self.channel is not None
        self.channel.get_cq_event(self.cq, timeout)
        self.cq.ack_events(1)
        return len(self.cq.poll(16)[1])

    def op_arm(self) -> None:
        self.cq.req_notify()

    def op_event(self, timeout: float = WAIT) -> tuple[int, str, int] | None:
        """The next async event: (type, kind of element, its QP number); None if none."""
        try:
            ev = self.ctx.get_async_event(timeout)
        except PyverbsRDMAError:
            return None
        el = ev.element
        qpn = getattr(el, "qp_num", -1) if isinstance(el, QP) else getattr(el, "qpn", -1)
        return ev.event_type, type(el).__name__, int(qpn)

    def op_to_err(self) -> None:
        from softverbs.enums import IBV_QPS_ERR

        a = QPAttr(qp_state=IBV_QPS_ERR)
        self.qp.modify(a, IBV_QP_STATE)

    def op_state(self) -> int:
        return int(self.qp.qp_state)

    def op_faults(self, rules: str) -> tuple[int, str]:
        """Seeded faults on this process's packets (SOFTVERBS_FAULTS syntax):
        (0, "") or the error's (errno, message)."""
        from softverbs.verbs.provider import Attach

        try:
            self.ctx.provider.call(ops.FAULTS, records.Ctx(self.ctx.handle, 0), Attach(text=rules))
        except PyverbsRDMAError as exc:
            return exc.error_code, str(exc)
        return 0, ""

    def op_raw(self, request: str, **kw: Any) -> tuple[int, str]:
        """A request by hand, on this process's own connection: (errno, error)."""
        conn = self.ctx.provider.conn  # type: ignore[attr-defined]
        op = ops.BY_NAME[request.upper()]
        try:
            conn.call(op, op.request(**kw))
        except PyverbsRDMAError as exc:
            return exc.error_code, str(exc)
        return 0, ""


class EnvPeer(RcPeer):
    """An RcPeer in a process with ``env`` set first (the fork server's
    children inherit the environment it started with, not the test's)."""

    def __init__(self, env: dict[str, str], extra_qps: int = 0, *args: Any) -> None:
        os.environ.update(env)
        super().__init__(*args)
        self.more = [rc_qp(self.pd, self.cq) for _ in range(extra_qps)]

    def op_close_extra(self) -> int:
        """Destroy the extra QPs; how many there were."""
        for qp in self.more:
            qp.close()
        n, self.more = len(self.more), []
        return n


class Allocator(XrcReceiver):
    """Allocates and destroys receive QPs; the numbers it got."""

    def op_churn(self, rounds: int, send_qpn: int) -> list[int]:
        out = []
        for _ in range(rounds):
            got = self.op_alloc(send_qpn)
            out.append(got["qpn"])
            self.op_unregister()
            assert self.srq is not None
            self.srq.close()
        return out


class Scribbler(RcPeer):
    """A process that writes garbage into its own send queue."""

    def op_scribble(self, how: str) -> tuple[int, int]:
        """Corrupt the SQ one way; (status of the WR, QP state after)."""
        from softverbs.enums import IBV_SEND_DEFER, IBV_SEND_SIGNALED

        sq = self.qp.sq
        assert sq is not None
        wr = SendWR(7, IBV_WR_SEND, 1, sg=[SGE(self.mr.buf, 8, self.mr.lkey)],
                    send_flags=IBV_SEND_SIGNALED | IBV_SEND_DEFER)  # deferred: no doorbell yet
        self.qp.post_send(wr)
        slots = sq.slots
        off = slots.offset(sq.pi - 1)  # type: ignore[attr-defined]
        if how == "opcode":
            slots.buf[off + 8] = 200  # type: ignore[attr-defined]
        elif how == "sges":
            slots.buf[off + 10 : off + 12] = (0xFFFF).to_bytes(2, "little")  # type: ignore[attr-defined]
        if how == "doorbell":
            sq.hdr[sq.DB] = 1 << 60  # a doorbell far beyond anything posted
        else:
            sq.ring(sq.pi)
        self.ctx.provider.doorbell(self.qp.dev_handle, records.DB_SQ)
        wcs = poll_cq(self.cq, 1)
        return wcs[0].status, int(self.qp.qp_state)


class Churner:
    """A process that attaches, builds a random set of objects -- PDs, CQs,
    MRs, an RC QP pair with a little traffic, an XRC SRQ and registrations
    with a shared receive QP, maybe a receive QP of its own -- and detaches,
    cleanly or not at all (exit without closing anything)."""

    def __init__(self, seed: int, xrcd_path: str, qpn: int) -> None:
        import random

        self.rng = random.Random(seed)
        self.xrcd_path = xrcd_path
        self.qpn = qpn
        self.info = {"pid": os.getpid()}

    def op_run(self) -> list[str]:
        rng = self.rng
        did = []
        ctx = Context(name="sv0")
        pds = [PD(ctx) for _ in range(rng.randint(1, 2))]
        cq = CQ(ctx, 32)
        keep = [MR(rng.choice(pds), rng.choice([64, 4096, 65536]), ALL_ACCESS)
                for _ in range(rng.randint(1, 3))]  # fmt: skip
        if rng.random() < 0.6:
            did.append("rc")
            pd = pds[0]
            mr = MR(pd, 4096, ALL_ACCESS)
            q1, q2 = rc_qp(pd, cq), rc_qp(pd, cq)
            connect(q1, ctx, q2.qp_num)
            connect(q2, ctx, q1.qp_num)
            n = rng.randint(1, 4)
            for i in range(n):
                q2.post_recv(RecvWR(i, 1, [SGE(mr.buf + 64 * i, 64, mr.lkey)]))
            for i in range(n):
                q1.post_send(SendWR(i, IBV_WR_SEND, 1,
                                    sg=[SGE(mr.buf + 2048 + 64 * i, 64, mr.lkey)]))  # fmt: skip
            wcs = poll_cq(cq, 2 * n)
            assert all(w.status == 0 for w in wcs), wcs
            if rng.random() < 0.5:
                q1.close()
                q2.close()
                did.append("rc-closed")
        if rng.random() < 0.7:
            did.append("xrc")
            xrcd = open_xrcd(ctx, self.xrcd_path)
            srq = xrc_srq(ctx, pds[0], xrcd, cq, 8)
            keep.append(srq)
            for _ in range(rng.randint(1, 2)):
                xrc_rcv_qp_register(xrcd, self.qpn)
            if rng.random() < 0.3:
                keep.append(open_qp(ctx, xrcd, self.qpn))
                did.append("open")
            if rng.random() < 0.2:
                xrc_rcv_qp_alloc(xrcd, recv_attr(ctx, 0x11), RECV_MASK)
                did.append("own-qp")
            if rng.random() < 0.5:
                xrc_rcv_qp_unregister(xrcd, self.qpn)
                did.append("unregistered")
        if rng.random() < 0.3:
            ctx.close()
            did.append("closed")
        return did


class SrqOwner(RcPeer):
    """An RcPeer whose QP takes receives from an SRQ, with SRQ controls."""

    def __init__(self) -> None:
        super().__init__(False, False, True)

    def op_srq_limit(self, limit: int) -> int:
        """Arm the SRQ limit; what query reports."""
        from softverbs import SrqAttr
        from softverbs.enums import IBV_SRQ_LIMIT

        assert self.srq is not None
        self.srq.modify(SrqAttr(srq_limit=limit), IBV_SRQ_LIMIT)
        return int(self.srq.query().srq_limit)

    def op_srq_query_limit(self) -> int:
        assert self.srq is not None
        return int(self.srq.query().srq_limit)

    def op_srq_resize(self, max_wr: int) -> int:
        """Resize the SRQ; the errno (0 on success)."""
        from softverbs import SrqAttr
        from softverbs.enums import IBV_SRQ_MAX_WR

        assert self.srq is not None
        try:
            self.srq.modify(SrqAttr(max_wr=max_wr), IBV_SRQ_MAX_WR)
        except PyverbsRDMAError as exc:
            return exc.error_code
        return 0

    def op_cq_resize(self, cqe: int) -> int:
        try:
            self.cq.resize(cqe)
        except PyverbsRDMAError as exc:
            return exc.error_code
        return 0


def other_uid_can_run(prefix: list[str] | tuple[str, ...], code: str,
                      env: dict[str, str] | None = None) -> None:
    """Skip, saying why, unless a process of the other uid (``prefix``: its
    ``setpriv``) can run this interpreter on ``code`` (the imports a test's
    subprocess needs), started as the test starts it: a checkout or venv in a
    directory only root may read -- a clone in ``mktemp -d``'s 0700 directory --
    is out of its reach, as tests/thirdparty/unprivileged.py finds for its
    programs."""
    r = subprocess.run([*prefix, sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"uid 65534 cannot run this checkout's softverbs ({why}); clone and "
                    "install it where that user can read it")
