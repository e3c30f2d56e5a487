"""Memory a client hands the service can neither fault it nor point it elsewhere.

Every client here is :mod:`rawclient`, written from docs/service-protocol.md
and docs/rings.md alone, acting as a hostile program would:

* **Truncation.**  A memfd the service maps -- a CQ ring, a send queue ring, a
  memory region -- is truncated after the service checked its size, then the
  service is made to touch it (a doorbell, a flush into the CQ, a peer's RDMA
  WRITE, the cleanup at disconnect).  An unsealed memfd is refused (EINVAL,
  the message says which seal is missing); a sealed one cannot be truncated
  (the kernel says EPERM), so the service never meets a SIGBUS and keeps
  serving everyone.
* **HELLO_MEMORY.**  Only the connecting process's own ``/proc/<pid>/mem``
  is taken: an empty regular file, an empty memfd, another process's
  ``mem``, the service's own ``mem`` and a HELLO whose pid is not the
  ``SO_PEERCRED`` pid are each refused with EINVAL, and the connection stays
  for a correct HELLO.
* **munmap.**  A region registered by address, unmapped -- and maybe
  replaced by another mapping at the same address -- is never written
  through its old rkey: the peer's WRITE fails ``IBV_WC_REM_ACCESS_ERR``,
  the new mapping is untouched, and ``mr_unmapped`` counts it.
* **A bystander.**  A client that truncates every memfd it ever passed does
  not stop two other processes' ping-pong on the same service.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import rawclient as rc
from svkit import RcPeer, ServiceProc, Worker

from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_1024,
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_AV,
    IBV_QP_DEST_QPN,
    IBV_QP_MAX_DEST_RD_ATOMIC,
    IBV_QP_MIN_RNR_TIMER,
    IBV_QP_PATH_MTU,
    IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,
    IBV_QP_RQ_PSN,
    IBV_QP_STATE,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPT_RC,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_SUCCESS,
)

#: docs/service-protocol.md: QUERY_GID (6), QueryGid -> QueryGidReply
QUERY_GID = 6
QueryGid = rc.Rec("QueryGid", rc._u32("ctx", "port", "index", "reserved"))
QueryGidReply = rc.Rec("QueryGidReply", [("gid", "16s"), *rc._u32("gid_type", "ifindex")])
#: the address the raw client registers its memfd region at (any iova will do)
MR_ADDR = 0x10000
MR_LEN = 8192


def _truncate(fd: int) -> int:
    """Try to cut ``fd`` to nothing: 0, or the errno the kernel answered."""
    try:
        os.ftruncate(fd, 0)
    except OSError as exc:
        return exc.errno or -1
    return 0


def _refused(call: Callable[[], Any]) -> rc.Refused | None:
    try:
        call()
    except rc.Refused as exc:
        return exc
    return None


class Hostile:
    """A raw client with a context, a PD, a CQ and an RC QP with both rings."""

    def __init__(self, path: str, seal: bool = True, memory: bool = False,
                 bell: int | None = None) -> None:  # fmt: skip
        self.raw = rc.RawClient(path)
        # memory: regions by address, through /proc/self/mem; bell: a doorbell eventfd
        self.hello = self.raw.hello(memory=memory, bell=bell)
        self.ctx = self.raw.open_device()
        self.pd = self.raw.alloc_pd(self.ctx)
        self.cq_ring = rc.Ring(16, rc.CQE_SIZE, seal=seal)
        self.raw.keep.append(self.cq_ring)
        r = self.raw.call(rc.CREATE_CQ, rc.CreateCQ.pack(ctx=self.ctx, cqe=16), [self.cq_ring.fd])
        self.cq = int(r.body(rc.CreateCQReply)["cq"])
        self.sq = rc.Ring(4, rc.send_slot_size(1, 0), seal=seal)
        self.rq = rc.Ring(4, rc.recv_slot_size(1), seal=seal)
        self.raw.keep += [self.sq, self.rq]
        caps = {"max_send_wr": 4, "max_recv_wr": 4, "max_send_sge": 1, "max_recv_sge": 1}
        body = rc.CreateQP.pack(caps=caps, ctx=self.ctx, pd=self.pd, qp_type=IBV_QPT_RC,
                                send_cq=self.cq, recv_cq=self.cq, sq_slot=self.sq.slot,
                                rq_slot=self.rq.slot)  # fmt: skip
        reply = self.raw.call(rc.CREATE_QP, body, [self.sq.fd, self.rq.fd]).body(rc.CreateQPReply)
        self.qp, self.qpn = int(reply["qp"]), int(reply["qpn"])

    def gid(self) -> bytes:
        r = self.raw.call(QUERY_GID, QueryGid.pack(ctx=self.ctx, port=1, index=1))
        return bytes(r.body(QueryGidReply)["gid"])

    def to_rtr(self, dest_qpn: int) -> None:
        """RESET -> INIT -> RTR towards ``dest_qpn``: a responder for a peer's WRITEs."""
        self.raw.modify_qp(self.qp, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                           | IBV_QP_ACCESS_FLAGS, qp_state=IBV_QPS_INIT, port_num=1,
                           qp_access_flags=IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
        ah = {"dgid": self.gid(), "is_global": 1, "port_num": 1, "sgid_index": 1,
              "hop_limit": 64}  # fmt: skip
        self.raw.modify_qp(self.qp, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                           | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                           qp_state=IBV_QPS_RTR, ah=ah, path_mtu=IBV_MTU_1024,
                           dest_qp_num=dest_qpn, max_dest_rd_atomic=1, min_rnr_timer=1)

    def reg_mr(self, fd: int) -> rc.Reply:
        body = rc.RegMR.pack(addr=MR_ADDR, length=MR_LEN, iova=MR_ADDR, pd=self.pd,
                             access=IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                             flags=rc.REG_MR_HAS_FD)  # fmt: skip
        return self.raw.call(rc.REG_MR, body, [fd])

    def load(self) -> None:
        """A receive WQE (no SGE) and a send queue's indices, written before any
        ring is cut (this process must not touch a cut ring either)."""
        self.rq.write(0, rc.RecvWQEHeader.pack(wr_id=7, num_sge=0))
        self.rq.set(rc.RQ_PI, 1)
        self.rq.set(rc.RQ_DB, 1)
        self.sq.set(rc.SQ_PI, 1)
        self.sq.set(rc.SQ_DB, 1)

    def touch(self) -> None:
        """Make the device use every ring: both doorbells (it reads the SQ and RQ
        rings), then ERR (it flushes the posted receive into the CQ ring)."""
        self.raw.doorbell(self.qp, rc.DB_RQ)
        self.raw.doorbell(self.qp, rc.DB_SQ)
        self.raw.modify_qp(self.qp, IBV_QP_STATE, qp_state=IBV_QPS_ERR)

    def close(self) -> None:
        self.raw.close()


@pytest.fixture
def peer(spawn: Callable[..., Worker]) -> Worker:
    return spawn(RcPeer)


def _serves(service: ServiceProc) -> None:
    """softverbsd is alive and a new client gets an answer."""
    assert service.alive(), "softverbsd died: a client's memory faulted it"
    with rc.RawClient(service.path) as raw:
        raw.hello()
        assert raw.alloc_pd(raw.open_device()) > 0


# --- truncation ---------------------------------------------------------------------------


def _unsealed_memfd(nbytes: int) -> int:
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    return fd


@pytest.mark.parametrize("ring", ["cq", "sq"])
def test_truncating_a_ring_cannot_fault_the_service(service: ServiceProc, ring: str) -> None:
    # The whole attack, as far as the service lets it go: an unsealed ring,
    # truncated once the service has mapped it, then touched by the device.
    refused = None
    try:
        h = Hostile(service.path, seal=False)
    except rc.Refused as exc:
        refused = exc
    else:
        h.load()
        assert _truncate(h.cq_ring.fd if ring == "cq" else h.sq.fd) == 0
        h.touch()
        h.close()  # the cleanup writes the CQ's error word
    _serves(service)
    assert refused is not None and refused.errno == errno.EINVAL, \
        "an unsealed ring was accepted"  # fmt: skip
    assert "F_SEAL_SHRINK" in refused.message, refused.message

    # Sealed as the doc says, the ring cannot be cut: the device goes on using it.
    h = Hostile(service.path)
    fd = h.cq_ring.fd if ring == "cq" else h.sq.fd
    h.load()
    assert _truncate(fd) == errno.EPERM
    h.touch()
    cqes = rc.poll_cq(h.cq_ring)
    assert 7 in [c["wr_id"] for c in cqes], cqes  # the flushed receive
    h.close()
    _serves(service)


def test_truncating_a_region_cannot_fault_the_service(service: ServiceProc, peer: Worker) -> None:
    h = Hostile(service.path)
    h.to_rtr(peer.info["qpn"])
    peer.call("connect", qpn=h.qpn)

    # An unsealed region, cut once registered, then written by the peer.
    loose = _unsealed_memfd(MR_LEN)
    refused = None
    try:
        keys = h.reg_mr(loose).body(rc.RegMRReply)
    except rc.Refused as exc:
        refused = exc
    else:
        assert _truncate(loose) == 0
        peer.call("write", rkey=keys["rkey"], addr=MR_ADDR, data=b"into a cut file")
        peer.call("poll", n=1)
    os.close(loose)
    _serves(service)
    assert refused is not None and refused.errno == errno.EINVAL, "an unsealed region was accepted"
    assert "F_SEAL_SHRINK" in refused.message, refused.message

    # Sealed, it cannot be cut, and the WRITE lands in it.
    sealed = rc._memfd(MR_LEN, "hostile-mr")
    keys = h.reg_mr(sealed).body(rc.RegMRReply)
    assert _truncate(sealed) == errno.EPERM
    peer.call("write", rkey=keys["rkey"], addr=MR_ADDR, data=b"still mapped")
    assert [w[0] for w in peer.call("poll", n=1)] == [IBV_WC_SUCCESS]
    assert os.pread(sealed, 12, 0) == b"still mapped"
    os.close(sealed)
    h.close()
    _serves(service)


def test_only_a_seal_against_shrinking_is_required(service: ServiceProc) -> None:
    """F_SEAL_SHRINK is what keeps the mapping whole; growth harms nothing."""
    with rc.RawClient(service.path) as raw:
        raw.hello()
        ctx = raw.open_device()
        fd = os.memfd_create("shrink-only", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, rc.RING_HEADER + 16 * rc.CQE_SIZE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        raw.call(rc.CREATE_CQ, rc.CreateCQ.pack(ctx=ctx, cqe=16), [fd])
        os.ftruncate(fd, 1 << 20)  # growing is allowed, and harmless
        os.close(fd)
    _serves(service)


@pytest.mark.parametrize("kind", ["regular file", "pipe", "/dev/null", "proc mem"])
def test_a_ring_that_is_not_a_memfd_is_refused(service: ServiceProc, kind: str) -> None:
    with rc.RawClient(service.path) as raw, tempfile.TemporaryFile() as f:
        raw.hello()
        ctx = raw.open_device()
        os.ftruncate(f.fileno(), rc.RING_HEADER + 16 * rc.CQE_SIZE)
        fds = {"regular file": lambda: os.dup(f.fileno()),
               "pipe": lambda: os.pipe()[0],
               "/dev/null": lambda: os.open("/dev/null", os.O_RDWR),
               "proc mem": lambda: os.open("/proc/self/mem", os.O_RDWR)}  # fmt: skip
        fd = fds[kind]()
        err = _refused(lambda: raw.call(rc.CREATE_CQ, rc.CreateCQ.pack(ctx=ctx, cqe=16), [fd]))
        os.close(fd)
        assert err is not None and err.errno == errno.EINVAL, kind
    _serves(service)


# --- HELLO_MEMORY -------------------------------------------------------------------------


@pytest.fixture
def stranger() -> Iterator[int]:
    """Another process of the same user."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _hello_with(raw: rc.RawClient, fd: int, pid: int | None = None) -> rc.Refused | None:
    body = rc.Hello.pack(version=rc.PROTOCOL_VERSION, flags=rc.HELLO_MEMORY,
                         pid=os.getpid() if pid is None else pid)  # fmt: skip
    try:
        return _refused(lambda: raw.call(rc.HELLO, body, [fd]))
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["empty regular file", "empty memfd", "another process's mem",
                                  "the service's mem", "a pid that is not the peer's"])
def test_hello_memory_takes_only_the_peers_own_mem(service: ServiceProc, stranger: int,
                                                    kind: str) -> None:  # fmt: skip
    with tempfile.TemporaryFile() as f, rc.RawClient(service.path) as raw:
        opened = {
            "empty regular file": lambda: os.dup(f.fileno()),
            "empty memfd": lambda: os.memfd_create("empty", os.MFD_CLOEXEC),
            "another process's mem": lambda: os.open(f"/proc/{stranger}/mem", os.O_RDWR),
            "the service's mem": lambda: os.open(f"/proc/{service.pid}/mem", os.O_RDWR),
            "a pid that is not the peer's": lambda: os.open("/proc/self/mem", os.O_RDWR),
        }
        pid = stranger if kind == "a pid that is not the peer's" else None
        err = _hello_with(raw, opened[kind](), pid)
        assert err is not None, f"HELLO_MEMORY accepted {kind}"
        assert err.errno == errno.EINVAL, err
        assert "HELLO" in err.message and ("mem" in err.message or "pid" in err.message), err
        # A failed HELLO leaves the connection open: the honest one is served.
        assert _hello_with(raw, os.open("/proc/self/mem", os.O_RDWR)) is None
        assert raw.alloc_pd(raw.open_device()) > 0
    _serves(service)


# --- a bystander ---------------------------------------------------------------------------


def test_a_truncating_client_cannot_stop_a_bystanders_ping_pong(
        service: ServiceProc, spawn: Callable[..., Worker]) -> None:  # fmt: skip
    a, b = spawn(RcPeer), spawn(RcPeer)
    a.call("connect", qpn=b.info["qpn"])
    b.call("connect", qpn=a.info["qpn"])

    def ping_pong(rounds: int) -> None:
        for i in range(rounds):
            src, dst = (a, b) if i % 2 == 0 else (b, a)
            dst.call("recv", n=1)
            src.call("send", data=b"ping %d" % i)
            assert [w[0] for w in src.call("poll", n=1)] == [IBV_WC_SUCCESS]
            assert [w[0] for w in dst.call("poll", n=1)] == [IBV_WC_SUCCESS]

    ping_pong(4)
    # Every memfd the attacker ever passed, sealed or not, is cut; then the
    # device is made to touch each one.
    for seal in (False, True):
        try:
            h = Hostile(service.path, seal=seal)
        except rc.Refused:
            continue
        fds = [h.cq_ring.fd, h.sq.fd, h.rq.fd]
        mr = rc._memfd(MR_LEN, "hostile-mr", seal=seal)
        if _refused(lambda: h.reg_mr(mr)) is None:  # noqa: B023 -- called at once
            fds.append(mr)
        h.load()
        for fd in fds:
            _truncate(fd)
        os.close(mr)
        ping_pong(2)
        h.touch()
        ping_pong(2)
        h.close()
    ping_pong(4)
    _serves(service)


# --- registered memory behaves as if pinned ------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FIXED = 0x10


def _map_at(addr: int, length: int, fd: int = -1) -> int:
    """mmap(2): anonymous private memory (fd -1) or ``fd`` shared, at ``addr`` if nonzero."""
    flags = (mmap.MAP_SHARED if fd >= 0 else mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) | \
        (MAP_FIXED if addr else 0)  # fmt: skip
    got = _libc.mmap(addr or None, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    assert got not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    return int(got)


@pytest.mark.parametrize("then", ["unmapped", "replaced by a memfd mapping"])
def test_a_write_never_reaches_what_is_mapped_after_munmap(service: ServiceProc, peer: Worker,
                                                           then: str) -> None:  # fmt: skip
    h = Hostile(service.path, memory=True)
    raw = h.raw
    h.to_rtr(peer.info["qpn"])
    peer.call("connect", qpn=h.qpn)

    addr = _map_at(0, MR_LEN)
    body = rc.RegMR.pack(addr=addr, length=MR_LEN, iova=addr, pd=h.pd,
                         access=IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)  # fmt: skip
    rkey = raw.call(rc.REG_MR, body).body(rc.RegMRReply)["rkey"]
    peer.call("write", rkey=rkey, addr=addr, data=b"registered")
    assert [w[0] for w in peer.call("poll", n=1)] == [IBV_WC_SUCCESS]
    assert ctypes.string_at(addr, 10) == b"registered"

    _libc.munmap(addr, MR_LEN)
    fresh = -1
    if then != "unmapped":
        fresh = rc._memfd(MR_LEN, "fresh")
        assert _map_at(addr, MR_LEN, fresh) == addr
    before = service.counters().get("mr_unmapped", 0)
    peer.call("write", rkey=rkey, addr=addr, data=b"stale rkey")
    assert [w[0] for w in peer.call("poll", n=1)] == [IBV_WC_REM_ACCESS_ERR]
    if fresh >= 0:
        assert os.pread(fresh, 10, 0) == bytes(10), "the write landed in the new mapping"
        _libc.munmap(addr, MR_LEN)
        os.close(fresh)
    assert service.counters().get("mr_unmapped", 0) > before
    raw.close()
    _serves(service)


_JOINER = """
import ctypes, errno, mmap, sys
import rawclient as rc
path, token, pd, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
area = mmap.mmap(-1, length)  # pages the first process never had
addr = ctypes.addressof(ctypes.c_char.from_buffer(area))
body = rc.RegMR.pack(addr=addr, length=length, iova=addr, pd=pd, access=1)

def reg(**hello):
    c = rc.RawClient(path)
    c.hello(**hello)
    try:
        c.call(rc.REG_MR, body)
        return 0
    except rc.Refused as exc:
        return exc.errno
    finally:
        c.close()

print(reg(flags=rc.HELLO_JOIN, token=token, memory=True),
      reg(flags=rc.HELLO_JOIN, token=token),
      reg(memory=True))
"""


def test_a_joining_process_registers_its_own_pages(service: ServiceProc) -> None:
    """A process that joins another's owner (HELLO_JOIN, as a forked child does)
    and passes its own memory registers its own pages on the owner's PD; without
    its memory the region would be the first process's (EFAULT: not mapped
    there); and a process that did not join gets EPERM for the owner's PD."""
    raw = rc.RawClient(service.path)
    token = raw.hello(memory=True)["token"]
    pd = raw.alloc_pd(raw.open_device())
    kits = os.path.join(os.path.dirname(__file__), "..", "kits")
    r = subprocess.run([sys.executable, "-c", _JOINER, service.path, str(token), str(pd),
                        str(MR_LEN)], env=dict(os.environ, PYTHONPATH=kits),
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", str(errno.EFAULT), str(errno.EPERM)], r.stdout
    raw.close()
