"""Fuzzing the device service's protocol and a client's ring indices.

The service is driven in this process (no socket round trip per input), as
a client that is not ours would drive it: every message is bytes -- random,
or a real operation's record with random field values -- with random file
descriptors of every kind a hostile client could pass (memfds sealed as the
doc says, unsealed, too small, or cut after the request; a regular file, a
pipe, stream and seqpacket sockets, ``/dev/null``, another process's
``/proc/PID/mem``, its own), and with any of them as the ``HELLO_MEMORY``
descriptor.  Every memfd is then cut to nothing and each queue of each QP
the input made gets a doorbell, so a ring the service mapped unsealed would
fault it (SIGBUS kills this process: the test fails loudly).  A second
test makes *valid* creates (a CQ, a QP's two rings, an SRQ, a region) with
descriptors of those kinds: only a sealed memfd of the right size is taken.
After each input the service must not have raised, must not have logged
an internal error, and must still serve; at the end, once the fuzzing
client is gone, nothing it made may be left.

The ring-index fuzz writes random words into the header of a real shared
send queue, receive queue and CQ -- pi, db, ci, arm -- and rings doorbells:
the device clamps what it reads, so the engine never fails and the QP's
completions come out in order or the QP goes to ERR, never anything else.

``SOFTVERBS_FUZZ_EXAMPLES`` sets the number of inputs per test (default
6,000 for the protocol, 2,000 creates with hostile descriptors, 4,000 for
the rings: 12,000 in all).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softverbs.device import ops, protocol, records
from softverbs.layout import Record
from softverbs.service.server import Client, Service

PROTOCOL_EXAMPLES = int(os.environ.get("SOFTVERBS_FUZZ_EXAMPLES", "6000"))
DESCRIPTOR_EXAMPLES = max(1, PROTOCOL_EXAMPLES // 3)
RING_EXAMPLES = max(1, PROTOCOL_EXAMPLES * 2 // 3)


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with tempfile.TemporaryDirectory(prefix="svfz", dir="/tmp") as d:
        svc = Service(str(Path(d) / "sv.sock"))
        yield svc
        svc.stop()
        svc._shutdown()


class Peer:
    """A client of ``service`` driven by hand: its socket's other end is ours."""

    def __init__(self, service: Service, memory: int | None = None) -> None:
        self.service = service
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        a.setblocking(False)
        self.mine = b
        from softverbs.device.core import Owner

        owner = service.host.add_owner(Owner("fuzz", os.getpid(), os.getuid()))
        self.client = Client(a, os.getpid(), os.getuid(), owner, lambda c: None)
        service.clients[a] = self.client
        # HELLO, with ``memory`` (any descriptor) as the process's /proc/self/mem
        flags = 0 if memory is None else records.HELLO_MEMORY
        self.feed(protocol.encode(ops.HELLO, 1, records.Hello(0, protocol.PROTOCOL_VERSION, flags,
                                                          os.getpid(), 0)),
                  [] if memory is None else [memory])  # fmt: skip
        if not self.client.greeted:  # a descriptor that was refused: greet as a plain client
            self.feed(protocol.encode(ops.HELLO, 1, records.Hello(0, protocol.PROTOCOL_VERSION, 0,
                                                              os.getpid(), 0)))  # fmt: skip
        self.open()
        self.ctx = self._reply_body().ctx

    def feed(self, data: bytes, fds: list[int] | None = None) -> None:
        self.service.handle(self.client, data, list(fds or []))

    def request(self, op: Any, body: Any, fds: list[int] | None = None) -> protocol.Message:
        """One request; its reply."""
        self.drain()
        self.feed(protocol.encode(op, 77, body), fds)
        return protocol.decode(self.mine.recv(protocol.MAX_MESSAGE))

    def _reply_body(self) -> Any:
        while True:
            data = self.mine.recv(protocol.MAX_MESSAGE)
            msg = protocol.decode(data)
            if msg.op is ops.OPEN_DEVICE:
                return msg.body

    def open(self) -> None:
        x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._events = x
        self.feed(protocol.encode(ops.OPEN_DEVICE, 2, records.OpenDevice("sv0")), [y.detach()])

    def drain(self) -> None:
        self.mine.setblocking(False)
        try:
            while True:
                self.mine.recv(protocol.MAX_MESSAGE)
        except BlockingIOError:
            pass
        self.mine.setblocking(True)

    def close(self) -> None:
        self.service.drop(self.client)
        self.mine.close()
        self._events.close()


def _record(cls: type[Record]) -> st.SearchStrategy[bytes]:
    """Bytes of ``cls``'s layout with each integer field drawn at random
    (small values and boundaries are likely: handles, kinds and sizes bite there)."""
    fmt = cls._struct.format

    def ints(code: str) -> st.SearchStrategy[Any]:
        if code.endswith("s"):
            n = int(code[:-1])
            return st.binary(min_size=n, max_size=n)
        bits = struct.calcsize("<" + code) * 8
        hi = (1 << bits) - 1 if code.isupper() else (1 << (bits - 1)) - 1
        lo = 0 if code.isupper() else -(1 << (bits - 1))
        return st.one_of(st.integers(0, 40), st.sampled_from([lo, hi, hi // 2 + 1]),
                         st.integers(lo, hi))  # fmt: skip

    import re

    codes = re.findall(r"\d*[a-zA-Z]", fmt.lstrip("<"))
    expanded: list[str] = []
    for c in codes:
        if c[-1] == "s":
            expanded.append(c)
        else:
            expanded.extend([c[-1]] * int(c[:-1] or 1))
    return st.tuples(*[ints(c) for c in expanded]).map(lambda v: cls._struct.pack(*v))


OPS = [op for op in ops.OPS if op not in (ops.HELLO,)]
_message = st.one_of(
    st.binary(max_size=600),
    st.sampled_from(OPS).flatmap(lambda op: st.tuples(st.just(op), _record(op.request),
                                                       st.binary(max_size=32))).map(
        lambda t: protocol.Header(16 + len(t[1]) + len(t[2]), t[0].code, 0, 7, 0).pack()
        + t[1] + t[2]),
)  # fmt: skip
#: what a hostile client may pass where the service expects a memfd, a socket or
#: /proc/self/mem: memfds sealed as the doc says, unsealed, too small, or cut after
#: the request ("resized"); other files; other processes' memory
FD_KINDS = ["memfd", "unsealed", "resized", "small", "file", "pipe", "sock", "stream",
            "null", "other_mem", "own_mem", "none"]  # fmt: skip
_fd_kinds = st.lists(st.sampled_from(FD_KINDS), max_size=3)
_STRANGER: list[int] = []  #: the pid of another process of this user (module fixture)


@pytest.fixture(scope="module", autouse=True)
def stranger() -> Iterator[None]:
    import subprocess

    proc = subprocess.Popen(["sleep", "3600"])
    _STRANGER[:] = [proc.pid]
    yield
    proc.kill()
    proc.wait()


def _memfd(nbytes: int, seal: bool) -> int:
    import fcntl

    fd = os.memfd_create("fz", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def _make_fd(kind: str) -> int | None:
    if kind in ("memfd", "small"):
        return _memfd(1 << 16 if kind == "memfd" else 8, seal=True)
    if kind in ("unsealed", "resized"):
        return _memfd(1 << 16, seal=False)
    if kind == "file":
        with tempfile.TemporaryFile() as f:
            os.ftruncate(f.fileno(), 1 << 16)
            return os.dup(f.fileno())
    if kind == "pipe":
        r, w = os.pipe()
        os.close(w)
        return r
    if kind in ("sock", "stream"):
        kind_ = socket.SOCK_SEQPACKET if kind == "sock" else socket.SOCK_STREAM
        a, b = socket.socketpair(socket.AF_UNIX, kind_)
        a.close()
        return b.detach()
    if kind == "null":
        return os.open("/dev/null", os.O_RDWR)
    if kind == "other_mem":
        return os.open(f"/proc/{_STRANGER[0]}/mem", os.O_RDWR)
    if kind == "own_mem":
        return os.open("/proc/self/mem", os.O_RDWR)
    return None


def _touch_everything(peer: Peer) -> None:
    """Make the device use every ring the peer's objects hold: a doorbell on each
    queue of each QP (the drop that follows writes every CQ ring's error word)."""
    from softverbs.device.records import DB_RQ, DB_SQ, KIND_QP

    for rec in list(peer.client.owner.objects.values()):
        if rec.kind == KIND_QP:
            for queue in (DB_SQ, DB_RQ):
                peer.feed(protocol.encode(ops.DOORBELL, 8, records.Doorbell(rec.handle, queue)))


@settings(max_examples=PROTOCOL_EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(data=_message, fd_kinds=_fd_kinds, hello_fd=st.sampled_from(FD_KINDS))
def test_no_message_breaks_the_service(service: Service, data: bytes, fd_kinds: list[str],
                                       hello_fd: str) -> None:  # fmt: skip
    peer = Peer(service, _make_fd(hello_fd))
    fds = [fd for fd in (_make_fd(k) for k in fd_kinds) if fd is not None]
    # The client keeps its own descriptor of every memfd, and cuts each one once
    # the service had its chance to map it.
    cut = [os.dup(fd) for fd, k in zip(fds, [k for k in fd_kinds if k != "none"], strict=True)
           if k in ("memfd", "unsealed", "resized", "small")]  # fmt: skip
    try:
        peer.feed(data, fds)  # every descriptor is the service's to close now
        for fd in cut:
            with contextlib.suppress(OSError):  # EPERM: sealed, as it should be
                os.ftruncate(fd, 0)
        _touch_everything(peer)
    finally:
        for fd in cut:
            os.close(fd)
        peer.close()
    assert not service.stats["internal_errors"], "softverbsd logged a bug"
    assert not service.stats["engine_errors"]
    leftover = [o for o in service.host.owners if o.label == "fuzz"]
    assert not leftover, "the fuzzing client's objects outlived it"


_CREATES = ["cq", "qp", "srq", "mr"]
_CREATE_KINDS = [k for k in FD_KINDS if k != "none"]


@settings(max_examples=DESCRIPTOR_EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(what=st.sampled_from(_CREATES), kinds=st.tuples(*[st.sampled_from(_CREATE_KINDS)] * 2),
       depth=st.integers(1, 64))  # fmt: skip
def test_no_descriptor_breaks_a_create(service: Service, what: str, kinds: tuple[str, str],
                                       depth: int) -> None:  # fmt: skip
    """A valid create with any descriptor: taken only if it is a sealed memfd large
    enough; whatever was taken is then cut (if it can be) and used by the device."""
    from softverbs.device.records import DB_RQ, DB_SQ, REG_MR_HAS_FD
    from softverbs.engine.rings import recv_slot_size, send_slot_size
    from softverbs.enums import IBV_QP_STATE, IBV_QPS_ERR, IBV_QPT_RC

    peer = Peer(service)
    try:
        pd = peer.request(ops.ALLOC_PD, records.Ctx(peer.ctx, 0)).body.handle
        good = _make_fd("memfd")
        assert good is not None
        cq = peer.request(ops.CREATE_CQ, records.CreateCQ(peer.ctx, 64, 0, 0), [good]).body.cq
        used = kinds[:2] if what == "qp" else kinds[:1]
        fds = [_make_fd(k) for k in used]
        cut = [os.dup(fd) for fd in fds if fd is not None]
        if what == "cq":
            req: tuple[Any, Any] = (ops.CREATE_CQ, records.CreateCQ(peer.ctx, depth, 0, 0))
        elif what == "qp":
            caps = records.QPCaps(depth, depth, 1, 1, 0, 0)
            req = (ops.CREATE_QP, records.CreateQP(0, caps, peer.ctx, pd, IBV_QPT_RC, cq, cq, 0,
                                                   0, 1, 0, send_slot_size(1, 0),
                                                   recv_slot_size(1), 0))  # fmt: skip
        elif what == "srq":
            req = (ops.CREATE_SRQ, records.CreateSRQ(peer.ctx, pd, 0, depth, 1, 0, 0, 0,
                                                 recv_slot_size(1), 0))  # fmt: skip
        else:
            req = (ops.REG_MR, records.RegMR(0x10000, 4096, 0x10000, 0, pd, 3, REG_MR_HAS_FD, 0))
        reply = peer.request(*req, [fd for fd in fds if fd is not None])
        taken = all(k == "memfd" for k in used)
        assert (reply.header.status == 0) == taken, (what, used, reply.header.status)
        for fd in cut:
            with contextlib.suppress(OSError):  # EPERM: sealed, as it should be
                os.ftruncate(fd, 0)
            os.close(fd)
        if what == "qp" and taken:
            qp = reply.body.qp
            for queue in (DB_SQ, DB_RQ):
                peer.feed(protocol.encode(ops.DOORBELL, 8, records.Doorbell(qp, queue)))
            attr = records.QPAttrs.unpack(bytes(records.QPAttrs.size()))
            attr.qp_state = IBV_QPS_ERR
            peer.request(ops.MODIFY_QP, records.ModifyQP(attr, qp, IBV_QP_STATE))
    finally:
        peer.close()  # destroying the CQs writes their rings' error words
    assert not service.stats["internal_errors"], "softverbsd logged a bug"
    assert not [o for o in service.host.owners if o.label == "fuzz"]


def test_the_service_serves_after_the_fuzz(service: Service) -> None:
    peer = Peer(service)
    peer.drain()
    peer.feed(protocol.encode(ops.ALLOC_PD, 9, records.Ctx(peer.ctx, 0)))
    msg = protocol.decode(peer.mine.recv(protocol.MAX_MESSAGE))
    assert msg.header.status == 0 and msg.body.handle > 0
    peer.close()


# --- ring indices ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rings() -> Iterator[Any]:
    """A looped-back RC pair on an in-process device, with shared-memory rings."""
    from softverbs.engine.rings import SharedRegion, shared_cq, shared_work_ring

    env = os.environ.get("SOFTVERBS_SERVICE")
    os.environ["SOFTVERBS_SERVICE"] = "0"
    try:
        from softverbs.verbs import provider as prov

        original_work, original_cq = prov.EmbeddedProvider.work_ring, prov.EmbeddedProvider.cq_ring

        def work_ring(self: Any, size: int, send: bool, max_sge: int, max_inline: int,
                      qp_type: int) -> Any:  # fmt: skip
            from softverbs.device.core import ALLOWED_OPCODES
            from softverbs.engine.rings import WR_DRIVER1, recv_slot_size, send_slot_size

            slot = send_slot_size(max_sge, max_inline) if send else recv_slot_size(max_sge)
            region = SharedRegion(64 + size * slot)
            return shared_work_ring(region, size, slot, send,
                                    ALLOWED_OPCODES[qp_type] | {WR_DRIVER1})  # fmt: skip

        def cq_ring(self: Any, capacity: int) -> Any:
            return shared_cq(SharedRegion(64 + capacity * 128), capacity)

        prov.EmbeddedProvider.work_ring = work_ring  # type: ignore[method-assign]
        prov.EmbeddedProvider.cq_ring = cq_ring  # type: ignore[method-assign]
        import sys

        sys.path.insert(0, str(Path(__file__).parents[1] / "scenarios"))
        from scenario_kit import make_pair

        from softverbs import Context

        ctx = Context(name="sv0")
        pair = make_pair(ctx, 2)
        yield pair
        ctx.close()
    finally:
        prov.EmbeddedProvider.work_ring = original_work  # type: ignore[method-assign]
        prov.EmbeddedProvider.cq_ring = original_cq  # type: ignore[method-assign]
        if env is None:
            os.environ.pop("SOFTVERBS_SERVICE", None)
        else:
            os.environ["SOFTVERBS_SERVICE"] = env


_word = st.one_of(st.integers(0, 70), st.sampled_from([1 << 63, (1 << 64) - 1, 1 << 32]),
                  st.integers(0, (1 << 64) - 1))  # fmt: skip


@settings(max_examples=RING_EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(sq_pi=_word, sq_db=_word, rq_pi=_word, rq_db=_word, cq_ci=_word, cq_arm=_word)
def test_lying_ring_indices_never_break_the_engine(rings: Any, sq_pi: int, sq_db: int,
                                                   rq_pi: int, rq_db: int, cq_ci: int,
                                                   cq_arm: int) -> None:  # fmt: skip
    from softverbs.device.records import DB_RQ, DB_SQ

    a = rings.a
    qp = a.qp
    sq, rq, cq = qp.sq, qp.rq, a.scq.ring
    saved = (int(sq.hdr[0]), int(sq.hdr[1]), int(rq.hdr[0]), int(rq.hdr[1]), int(cq.hdr[1]))
    sq.hdr[0], sq.hdr[1], rq.hdr[0], rq.hdr[1] = sq_pi, sq_db, rq_pi, rq_db
    cq.hdr[1], cq.hdr[2] = cq_ci, cq_arm
    provider = qp.context.provider
    eng = qp.engine
    before = (eng.sq.db, eng.rq.db)
    provider.doorbell(qp.dev_handle, DB_SQ)
    provider.doorbell(qp.dev_handle, DB_RQ)
    # A fetch never moves the device more than one ring ahead, nor back: a
    # doorbell fetches once, and a QP its garbage sent to ERR once more (its
    # flush takes everything posted).
    assert 0 <= eng.sq.db - before[0] <= 2 * sq.size
    assert 0 <= eng.rq.db - before[1] <= 2 * rq.size
    # Put the honest words back (the QP may be in ERR now: that is its owner's business).
    sq.hdr[0], sq.hdr[1], rq.hdr[0], rq.hdr[1], cq.hdr[1] = saved
