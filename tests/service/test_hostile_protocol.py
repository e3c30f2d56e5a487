"""softverbsd against a client written from the documents alone (``rawclient``).

Each test drives the service through :mod:`rawclient` -- which imports no
softverbs protocol code -- with one kind of bad or extreme input that
docs/service-protocol.md and docs/rings.md say how the service answers,
and checks that answer, and that the service goes on serving (the
``service`` fixture fails a test whose service died or logged an internal
error).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import rawclient as rc
from svkit import ServiceProc, other_uid_can_run

import softverbs
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QP_STATE,
    IBV_QPS_ERR,
    IBV_QPT_RC,
    IBV_REREG_MR_CHANGE_ACCESS,
    IBV_REREG_MR_CHANGE_TRANSLATION,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_REM_OP_ERR,
    IBV_WC_WR_FLUSH_ERR,
    IBV_WR_SEND,
)


def _client(service: ServiceProc, **hello: object) -> rc.RawClient:
    c = rc.RawClient(service.path)
    c.hello(**hello)  # type: ignore[arg-type]
    return c


def _expect_eproto(c: rc.RawClient, op: int, body: bytes, **header: object) -> str:
    """Send one bad message: the reply is EPROTO (naming it) and the connection closes."""
    with pytest.raises(rc.Refused) as refused:
        c.call(op, body, **header)  # type: ignore[arg-type]
    assert refused.value.errno == errno.EPROTO, refused.value
    assert c.closed(), "the service kept a connection that sent a malformed message"
    return refused.value.message


# --- a doorbell in ERR flushes at most one ring's worth -------------------------------------


def test_doorbell_in_err_flushes_one_ring(service: ServiceProc) -> None:
    """rings.md: the device takes min(db, pi, seen + size) per doorbell, so a
    driver lying about ``pi``/``db`` on a 16-slot receive queue of a QP in ERR
    gets at most 16 flushed CQEs per doorbell -- never 32."""
    with _client(service) as c:
        ctx = c.open_device()
        pd = c.alloc_pd(ctx)
        cq, cring = c.create_cq(ctx, 256)
        rep, _sq, rq = c.create_qp(ctx, pd, cq, IBV_QPT_RC, max_send_wr=1, max_recv_wr=16)
        assert rq is not None and rq.size == 16
        assert c.modify_qp(rep["qp"], IBV_QP_STATE, qp_state=IBV_QPS_ERR) == IBV_QPS_ERR
        rq.set(rc.RQ_PI, 100)  # a lie: at most 16 can be outstanding
        rq.set(rc.RQ_DB, 100)
        counts, wr_ids = [], []
        for rnd in range(3):
            for i in range(16 * rnd, 16 * rnd + 16):  # what the device reads next
                rq.write(i, rc.RecvWQEHeader.pack(wr_id=i, num_sge=0))
            c.doorbell(rep["qp"], rc.DB_RQ)
            c.status()  # a round trip: the doorbell before it was served
            cqes = rc.poll_cq(cring)
            assert all(e["status"] == IBV_WC_WR_FLUSH_ERR for e in cqes), cqes
            counts.append(len(cqes))
            wr_ids += [e["wr_id"] for e in cqes]
        assert counts == [16, 16, 16], f"flushed per doorbell: {counts}"
        assert wr_ids == list(range(48)), "flushed out of order or twice"


# --- the protocol is as strict as its document -------------------------------------------


def test_body_longer_than_its_record_is_eproto(service: ServiceProc) -> None:
    c = _client(service)
    ctx = c.open_device()
    why = _expect_eproto(c, rc.ALLOC_PD, rc.Ctx.pack(ctx=ctx) + b"\0" * 8)
    assert "ALLOC_PD" in why and "8 bytes" in why, why


def test_hello_longer_than_its_record_is_eproto(service: ServiceProc) -> None:
    c = rc.RawClient(service.path)
    body = rc.Hello.pack(version=rc.PROTOCOL_VERSION, pid=os.getpid()) + b"junk"
    _expect_eproto(c, rc.HELLO, body)


@pytest.mark.parametrize("flags", [2, 4, 0x8000])
def test_unknown_header_flags_are_eproto(service: ServiceProc, flags: int) -> None:
    c = _client(service)
    why = _expect_eproto(c, rc.STATUS, b"", flags=flags)
    assert "flags" in why, why


def test_request_with_a_status_is_eproto(service: ServiceProc) -> None:
    c = _client(service)
    why = _expect_eproto(c, rc.STATUS, b"", status=errno.EIO)
    assert "status" in why, why


@pytest.mark.parametrize("flags", [8, 1 << 31])
def test_unknown_hello_flags_are_eproto(service: ServiceProc, flags: int) -> None:
    c = rc.RawClient(service.path)
    body = rc.Hello.pack(version=rc.PROTOCOL_VERSION, flags=flags, pid=os.getpid())
    why = _expect_eproto(c, rc.HELLO, body)
    assert "HELLO flags" in why, why


def test_failed_hello_leaves_the_connection_open(service: ServiceProc) -> None:
    """A HELLO with bad fields (HELLO_JOIN with a token nobody has) is an errno
    reply, not a protocol error: the connection stays and may HELLO again."""
    c = rc.RawClient(service.path)
    with pytest.raises(rc.Refused) as refused:
        c.hello(flags=rc.HELLO_JOIN, token=12345)
    assert refused.value.errno == errno.EPERM
    assert c.hello()["version"] == rc.PROTOCOL_VERSION
    c.close()


# --- replies of any size --------------------------------------------------------------------

MANY = 100_000


def _hold_many_pds(c: rc.RawClient, ctx: int, n: int) -> None:
    """``n`` PDs, requested in windows (the service queues at most so many unread replies)."""
    window = 1000
    for start in range(0, n, window):
        count = min(window, n - start)
        for _ in range(count):
            c.send(rc.ALLOC_PD, rc.Ctx.pack(ctx=ctx))
        for _ in range(count):
            r = c.recv()
            assert not r.status, r.message


def test_status_with_100000_objects(service: ServiceProc) -> None:
    """STATUS with 100,000 objects: the JSON (megabytes) is larger than a message,
    so the reply carries it in a memfd (FLAG_TAIL_FD) -- and `softverbs service
    status`, `softverbs res` and `softverbs stat qp` read it."""
    holder = _client(service)
    ctx = holder.open_device()
    _hold_many_pds(holder, ctx, MANY)
    with _client(service) as c:
        seq = c.send(rc.STATUS)
        r = c.recv()
        assert r.seq == seq and not r.status, r.message
        assert r.flags == rc.FLAG_REPLY | rc.FLAG_TAIL_FD, f"flags {r.flags:#x}"
        assert len(r.fds) == 1 and r.payload == b"", "the body is Empty; the tail is the memfd"
        size = os.fstat(r.fds[0]).st_size
        assert size > rc.MAX_MESSAGE
        doc = json.loads(os.pread(r.fds[0], size, 0))
        os.close(r.fds[0])
        assert doc["objects"]["pd"] == MANY, doc["objects"]
        assert doc["clients"] == 1
    env = {**os.environ, "SOFTVERBS_SERVICE": service.path}
    out = _cli(env, "service", "status")
    assert out.returncode == 0, out.stderr
    assert f"pd {MANY}" in out.stdout, out.stdout
    out = _cli(env, "res", "pd", "-j")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == MANY, "softverbs res pd lists every PD"
    out = _cli(env, "stat", "qp", "-j")
    assert out.returncode == 0, out.stderr
    holder.close()


def _cli(env: dict[str, str], *args: str, prefix: tuple[str, ...] = ()) -> Any:
    return subprocess.run([*prefix, sys.executable, "-m", "softverbs", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


# --- another uid is told why, before the close --------------------------------------------

_AS_OTHER_UID = r"""
import json, os, socket, struct, sys
sys.path.insert(0, sys.argv[2])
import rawclient as rc
c = rc.RawClient(sys.argv[1])
out = {"uid": os.getuid()}
try:
    c.send(rc.HELLO, rc.Hello.pack(version=rc.PROTOCOL_VERSION, pid=os.getpid()))
except OSError as exc:  # the service may have shut the connection already
    out["send"] = exc.errno
try:
    r = c.recv()
    out["reply"] = {"op": r.op, "flags": r.flags, "seq": r.seq, "status": r.status,
                    "message": r.message}
    out["then"] = "closed" if c.closed() else "open"
except rc.Closed as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def _as_nobody(service: ServiceProc) -> tuple[str, ...]:
    """setpriv to uid nobody; the service's socket (owner-only) opened to it, as a
    permission mistake or an ACL would."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed (util-linux, scripts/apt-packages.txt)")
    if os.getuid() != 0:
        pytest.skip("changing uid needs root")
    os.chmod(os.path.dirname(service.path), 0o755)
    os.chmod(service.path, 0o666)
    return ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")


def test_other_uid_reads_eperm_before_the_close(service: ServiceProc) -> None:
    """A client of another uid whose HELLO is already queued reads the EPERM reply
    (seq 0: unsolicited), then an orderly end of file -- not ECONNRESET."""
    prefix = _as_nobody(service)
    kits = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kits")
    other_uid_can_run(prefix, f"import sys; sys.path.insert(0, {kits!r}); import rawclient")
    for _ in range(5):  # the HELLO races the service's accept: try both orders
        r = subprocess.run([*prefix, sys.executable, "-c", _AS_OTHER_UID, service.path, kits],
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["uid"] == 65534
        assert "error" not in out, f"the refused client read {out['error']}, not the reason"
        reply = out["reply"]
        assert (reply["flags"], reply["seq"], reply["status"]) == (
            rc.FLAG_REPLY, 0, errno.EPERM), reply  # fmt: skip
        assert "serves only its own user" in reply["message"], reply
        assert out["then"] == "closed"
    assert service.stats()["stats"]["clients_refused"] == 5


def test_cli_of_other_uid_prints_the_reason(service: ServiceProc) -> None:
    """`softverbs service status` and `softverbs res` run as another user say
    that the running service refused them -- never "not running", never
    "Connection reset by peer"."""
    prefix = _as_nobody(service)
    # this checkout on the path: an editable install's finder need not be
    # usable by another uid (it was not in CI)
    src = os.path.dirname(os.path.dirname(os.path.abspath(softverbs.__file__)))
    env = {**os.environ, "SOFTVERBS_SERVICE": service.path, "HOME": "/tmp", "PYTHONPATH": src}
    other_uid_can_run(prefix, "import softverbs.cli", env)
    for args in (("service", "status"), ("res",)):
        out = _cli(env, *args, prefix=prefix)
        assert out.returncode != 0, out.stdout
        assert "serves only its own user, not uid 65534" in out.stderr, out.stderr
        assert "EPERM" in out.stderr, out.stderr
        assert "not running" not in out.stderr and "reset" not in out.stderr, out.stderr


# --- memory keys carry an unpredictable key byte ------------------------------------------


def test_memory_keys_carry_a_random_key_byte(service: ServiceProc) -> None:
    """key = index << 8 | byte, the byte drawn at random: 64 regions get many
    different bytes in no arithmetic progression (they were multiples of 0x3B)."""
    with _client(service) as c:
        pd = c.alloc_pd(c.open_device())
        keys = [c.reg_mr(pd, 4096, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE)
                for _ in range(64)]  # fmt: skip
        assert all(k["lkey"] == k["rkey"] for k in keys)
        indexes = [k["lkey"] >> 8 for k in keys]
        assert len(set(indexes)) == 64, "each region has its own index"
        key_bytes = [k["lkey"] & 0xFF for k in keys]
        steps = {(b - a) & 0xFF for a, b in itertools.pairwise(key_bytes)}
        assert len(steps) > 8, f"key bytes step predictably: {key_bytes}"
        # 64 draws of 256 values: about 56 distinct; fewer than 32 has odds below 1e-12
        assert len(set(key_bytes)) >= 32, key_bytes


def test_rereg_of_the_translation_changes_the_key_byte(service: ServiceProc) -> None:
    """A re-registration that puts new memory behind the region gives new keys with
    the same index (the old rkey no longer matches); one that changes only the
    access keeps them, as mlx5 and rxe do and rdma-core's test_mr_rereg_access
    expects."""
    with _client(service) as c:
        pd = c.alloc_pd(c.open_device())
        mr = c.reg_mr(pd, 4096, IBV_ACCESS_LOCAL_WRITE)
        keys = c.rereg_mr(mr["mr"], IBV_REREG_MR_CHANGE_ACCESS,
                          access=IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)  # fmt: skip
        assert keys["lkey"] == mr["lkey"], "an access change keeps the keys"
        seen = [mr["lkey"]]
        for _ in range(8):
            fd = rc._memfd(8192, "rereg")  # sealed, as the service requires
            try:
                keys = c.rereg_mr(mr["mr"], IBV_REREG_MR_CHANGE_TRANSLATION, addr=0x20000,
                                  length=8192, memfd=fd)  # fmt: skip
            finally:
                os.close(fd)
            assert keys["lkey"] == keys["rkey"]
            assert keys["lkey"] >> 8 == mr["lkey"] >> 8, "the index stays"
            assert keys["lkey"] != seen[-1], f"rereg kept key {keys['lkey']:#x}"
            seen.append(keys["lkey"])


# --- a malformed receive WQE ---------------------------------------------------------------


def test_receive_wqe_overflowing_its_slot_fails_loc_qp_op_err(service: ServiceProc) -> None:
    """rings.md: a slot that does not hold a WQE the driver could have written (here:
    a receive WQE whose SGEs overflow its 32-byte slot) runs as a WQE that fails
    IBV_WC_LOC_QP_OP_ERR -- a malformed WQE, the QP's own error (IBA's Local QP
    Operation Error), not a protection error -- and the QP goes to ERR."""
    with _client(service) as c:
        ctx = c.open_device()
        pd = c.alloc_pd(ctx)
        cq, cring = c.create_cq(ctx, 64)
        a, sq, _ = c.create_qp(ctx, pd, cq, IBV_QPT_RC, max_send_wr=4, max_recv_wr=1)
        b, _, rq = c.create_qp(ctx, pd, cq, IBV_QPT_RC, max_send_wr=1, max_recv_wr=4)
        assert sq is not None and rq is not None and rq.slot == 32
        gid = c.query_gid(ctx, 1)
        c.connect_rc(a["qp"], b["qpn"], gid)
        c.connect_rc(b["qp"], a["qpn"], gid)
        rq.write(0, rc.RecvWQEHeader.pack(wr_id=0xBAD, num_sge=5))  # 16 + 80 > 32 bytes
        rq.set(rc.RQ_PI, 1)
        rq.set(rc.RQ_DB, 1)
        c.doorbell(b["qp"], rc.DB_RQ)
        sq.write(0, rc.SendWQEHeader.pack(wr_id=0x5E9D, opcode=IBV_WR_SEND,
                                          flags=rc.F_SIGNALED))  # fmt: skip
        sq.set(rc.SQ_PI, 1)
        sq.set(rc.SQ_DB, 1)
        c.doorbell(a["qp"], rc.DB_SQ)
        cqes = {e["wr_id"]: e for e in rc.wait_cq(c, cring, 2)}
        assert 0xBAD in cqes, cqes
        assert cqes[0xBAD]["status"] == IBV_WC_LOC_QP_OP_ERR, cqes[0xBAD]
        assert cqes[0x5E9D]["status"] == IBV_WC_REM_OP_ERR, cqes[0x5E9D]


# --- the documents are enough ------------------------------------------------------------


def _doc_constants(rel: str) -> dict[str, int]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, rel)) as f:
        rows = re.findall(r"^\| `([A-Z0-9_]+)` \| (\d+) \|", f.read(), re.M)
    return {name: int(value) for name, value in rows}


def test_rawclient_constants_are_the_documents() -> None:
    """rawclient was written from the two documents: every constant it uses is in
    their tables, with the same value (so the tables are complete enough for it)."""
    doc = _doc_constants("docs/service-protocol.md")
    rings_doc = _doc_constants("docs/rings.md")
    names = ["PROTOCOL_VERSION", "MAX_MESSAGE", "MAX_FDS", "FLAG_REPLY", "FLAG_TAIL_FD",
             "HELLO_MEMORY", "HELLO_JOIN", "DESTROY_CASCADE", "REG_MR_HAS_FD", "DB_SQ", "DB_RQ",
             "KIND_CTX", "KIND_PD", "KIND_MR", "KIND_MW", "KIND_AH", "KIND_CHANNEL", "KIND_CQ",
             "KIND_SRQ", "KIND_QP"]  # fmt: skip
    for name in names:
        assert doc.get(name) == getattr(rc, name), name
    for name in (
        "F_SIGNALED",
        "F_FENCE",
        "F_SOLICITED",
        "F_INLINE",
        "CQE_SIZE",
        "SQ_PI",
        "SQ_DB",
        "SQ_STATE",
        "CQ_PI",
        "CQ_CI",
        "CQ_ARM",
        "CQ_FIRED",
        "CQ_ERROR",
    ):
        assert rings_doc.get(name) == getattr(rc, name), name
    assert rings_doc["HEADER_SIZE"] == rc.RING_HEADER
