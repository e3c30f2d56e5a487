"""Bad input never takes softverbsd down, and never leaks.

Each case is followed by the same check: the service is alive, answers a
new client, and -- once the offender is gone -- holds no object, no memory
key and no file descriptor more than before.  Cases:

* QP numbers that are stale, of another domain, not XRC receive QPs, or
  that never existed: EINVAL for register, unregister and open;
* a process that registers twice holds one reference;
* socket peers that are not softverbs clients: garbage, a truncated or
  lying header, a request before ``HELLO``, a wrong protocol version, an
  unknown operation, a reply sent as a request, too many file descriptors --
  each gets EPROTO and is disconnected; the service serves the others on;
* the device is the authority: a raw client's RESET->RTS or ERR->SQD is
  refused (EINVAL) whatever it believes; another process's handle is refused
  (EPERM);
* a client that disconnects in the middle of a call;
* file descriptors that are not what the request announced;
* malformed fields, and a process that scribbles on its own rings.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from svkit import (
    Raw,
    RcPeer,
    Scribbler,
    ServiceProc,
    Worker,
    XrcReceiver,
    XrcSender,
    other_uid_can_run,
)

from softverbs.device import ops, protocol, records
from softverbs.engine.rings import CQE_SIZE, HEADER_SIZE, recv_slot_size, send_slot_size
from softverbs.enums import (
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,
    IBV_QP_STATE,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPT_RC,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_SUCCESS,
)


def _serving(service: ServiceProc, baseline_fds: int | None = None) -> dict[str, Any]:
    """The service is up, has no client left, and holds nothing."""
    st = service.wait_stats(lambda s: s["clients"] == 0, "all clients gone")
    assert service.alive()
    assert st["objects"] == {} and st["engine_qps"] == 0 and st["keys"] == 0, st
    if baseline_fds is not None:
        # The service closes a connection when it reads its end: soon, not at once.
        deadline = time.monotonic() + 5
        while service.fd_count() > baseline_fds and time.monotonic() < deadline:
            time.sleep(0.02)
        assert service.fd_count() <= baseline_fds, "the service leaked file descriptors"
    return st


def test_bad_qp_numbers(service: ServiceProc, spawn: Callable[..., Worker],
                        xrcd_file: str) -> None:  # fmt: skip
    sender = spawn(XrcSender)
    r1 = spawn(XrcReceiver, xrcd_file)
    other = spawn(XrcReceiver, xrcd_file + ".other")  # another XRC domain
    qpn = r1.call("alloc", send_qpn=sender.info["qpn"])["qpn"]
    foreign = other.call("alloc", send_qpn=sender.info["qpn"])["qpn"]
    cases = {
        "another domain's QP": foreign,
        "an XRC send QP": sender.info["qpn"],
        "a number never allocated": 0x812345,
        "QP number 0": 0,
    }
    for what in ("register", "unregister", "open"):
        for name, number in cases.items():
            assert r1.call("try", what=what, qpn=number) == errno.EINVAL, (what, name)
    # A stale number: destroyed by its last unregister.
    other.call("unregister")
    for what in ("register", "unregister", "open"):
        assert other.call("try", what=what, qpn=foreign) == errno.EINVAL, what
    # The good one is unharmed.
    assert service.stats()["xrc_holders"] == {f"{qpn:#x}": 1}
    for w in (sender, r1, other):
        w.finish()
    _serving(service)


def test_register_twice_is_one_reference(service: ServiceProc, spawn: Callable[..., Worker],
                                         xrcd_file: str) -> None:  # fmt: skip
    sender = spawn(XrcSender)
    r1 = spawn(XrcReceiver, xrcd_file)
    r2 = spawn(XrcReceiver, xrcd_file)
    qpn = r1.call("alloc", send_qpn=sender.info["qpn"])["qpn"]
    for _ in range(3):
        r2.call("register", qpn=qpn)
    assert r1.call("try", what="register", qpn=qpn) == 0  # the allocator too
    assert service.stats()["xrc_holders"] == {f"{qpn:#x}": 2}
    r2.call("unregister")  # once is enough to let go
    assert service.stats()["xrc_holders"] == {f"{qpn:#x}": 1}
    r1.call("unregister")
    assert service.stats()["xrc_qps"] == 0
    for w in (sender, r1, r2):
        w.finish()
    _serving(service)


def _expect_kicked(raw: Raw) -> protocol.Message:
    """The service answers with EPROTO, then closes the connection."""
    msg = raw.recv()
    assert msg.header.status == errno.EPROTO, msg
    assert "not a softverbs client" in msg.error, msg.error
    with pytest.raises(EOFError):
        protocol.recv(raw.sock)
    raw.close()
    return msg


@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.0\r\n\r\n",
        b"\xff\xfe\x00garbage",
        b"\x00" * 3,  # shorter than a header
        protocol.Header(999, ops.HELLO.code, 0, 1, 0).pack(),  # the length lies
        protocol.Header(16, 0xBEEF, 0, 1, 0).pack(),  # no such operation
        protocol.encode(ops.HELLO, 1, records.Hello(0, 2, 0, 0, 0))[:-4],  # truncated body
    ],
    ids=["http", "binary", "short", "length-lies", "unknown-op", "truncated"],
)
def test_not_a_client_gets_an_error(service: ServiceProc, payload: bytes) -> None:
    fds = service.fd_count()
    raw = Raw(service.path, hello=False)
    raw.send(payload)
    _expect_kicked(raw)
    _serving(service, fds)


def test_protocol_violations(service: ServiceProc, spawn: Callable[..., Worker]) -> None:
    fds = service.fd_count()
    for data in (
        protocol.encode(ops.ALLOC_PD, 1, records.Ctx(1, 0)),  # before HELLO
        # a version it does not speak
        protocol.encode(ops.HELLO, 1, records.Hello(0, 999, 0, 0, 0)),
        protocol.encode(ops.HELLO, 1, records.Hello(0, 2, 0, 0, 0), reply=True),  # a reply
    ):
        raw = Raw(service.path, hello=False)
        raw.send(data)
        _expect_kicked(raw)
    raw = Raw(service.path)
    raw.send(protocol.encode(ops.HELLO, 2, records.Hello(0, 2, 0, 0, 0)))  # HELLO twice
    _expect_kicked(raw)
    # Too many file descriptors for one message.
    raw = Raw(service.path)
    pipes = [os.pipe() for _ in range(protocol.MAX_FDS + 2)]
    raw.send(protocol.encode(ops.STATUS, 3, records.Empty()), [r for r, _ in pipes])
    _expect_kicked(raw)
    for r, w in pipes:
        os.close(r)
        os.close(w)
    # Meanwhile a real client is served throughout.
    peer = spawn(RcPeer, True)
    peer.call("recv", n=1, qp2=True)
    peer.call("send", data=b"still serving")
    assert [w[0] for w in peer.call("poll", n=2)] == [IBV_WC_SUCCESS] * 2
    peer.finish()
    _serving(service, fds)


def test_disconnect_mid_call(service: ServiceProc) -> None:
    fds = service.fd_count()
    # A client fires requests -- some carrying memory -- and hangs up
    # without reading a single reply.
    for _ in range(5):
        raw = Raw(service.path)
        mem = _memfd(8192)
        raw.send(protocol.encode(ops.ALLOC_PD, 10, records.Ctx(1, 0)))
        raw.send(protocol.encode(ops.REG_MR, 11, records.RegMR(0, 8192, 0, 0, 2, 1,
                                                             records.REG_MR_HAS_FD, 0)), [mem])
        raw.send(protocol.encode(ops.STATUS, 12, records.Empty()))
        os.close(mem)
        raw.close()
    # A client sends half a conversation and is shut down for writing.
    raw = Raw(service.path)
    ctx = raw.open_device()
    raw.send(protocol.encode(ops.ALLOC_PD, 10, records.Ctx(ctx, 0)))
    raw.sock.shutdown(socket.SHUT_WR)
    msg = raw.recv()  # it still gets its answer
    assert msg.header.status == 0 and msg.body.handle > 0, msg
    raw.close()
    _serving(service, fds)


def test_a_process_killed_in_a_blocking_call(service: ServiceProc,
                                             spawn: Callable[..., Worker]) -> None:  # fmt: skip
    peer = spawn(RcPeer, True, True)
    peer.call("arm")
    peer.send("cq_event")  # blocks on its channel's socket...
    peer.kill()  # ...and dies there
    _serving(service)


# --- the device is the authority -----------------------------------------------------


def _memfd(size: int) -> int:
    """A memfd sealed as the service requires (docs/rings.md)."""
    fd = os.memfd_create("ring", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def _raw_qp(raw: Raw, ctx: int) -> tuple[int, int]:
    """An RC QP built by hand: (its handle, its PD's)."""
    pd = raw.call(ops.ALLOC_PD, records.Ctx(ctx, 0)).body.handle
    fd = _memfd(HEADER_SIZE + 16 * CQE_SIZE)
    cq = raw.call(ops.CREATE_CQ, records.CreateCQ(ctx, 16, 0, 0), [fd]).body.cq
    os.close(fd)
    sq_slot, rq_slot = send_slot_size(1, 0), recv_slot_size(1)
    sq, rq = _memfd(HEADER_SIZE + 4 * sq_slot), _memfd(HEADER_SIZE + 4 * rq_slot)
    body = records.CreateQP(0, records.QPCaps(4, 4, 1, 1, 0, 0), ctx, pd, IBV_QPT_RC, cq, cq, 0,
                            0, 1, 0, sq_slot, rq_slot, 0)  # fmt: skip
    reply = raw.call(ops.CREATE_QP, body, [sq, rq])
    os.close(sq)
    os.close(rq)
    assert reply.header.status == 0, reply.error
    return int(reply.body.qp), int(pd)


def _modify(raw: Raw, qp: int, state: int, mask: int) -> protocol.Message:
    attrs = records.QPAttrs.unpack(bytes(records.QPAttrs.size()))
    attrs.qp_state = state
    attrs.port_num = 1
    attrs.ah.port_num = 1
    return raw.call(ops.MODIFY_QP, records.ModifyQP(attrs, qp, mask))


def test_the_state_table_is_judged_by_the_device(service: ServiceProc) -> None:
    """A client that is not ours cannot skip states: the device judges every
    modify against its own state table and the QP's own state."""
    raw = Raw(service.path)
    qp, _ = _raw_qp(raw, raw.open_device())
    reply = _modify(raw, qp, IBV_QPS_RTS, IBV_QP_STATE)  # RESET -> RTS
    assert reply.header.status == errno.EINVAL, reply
    assert "RESET -> IBV_QPS_RTS is not a legal transition" in reply.error, reply.error
    init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
    assert _modify(raw, qp, IBV_QPS_INIT, init).body.state == IBV_QPS_INIT
    assert _modify(raw, qp, IBV_QPS_ERR, IBV_QP_STATE).body.state == IBV_QPS_ERR
    reply = _modify(raw, qp, IBV_QPS_SQD, IBV_QP_STATE)  # ERR -> SQD
    assert reply.header.status == errno.EINVAL, reply
    assert "IBV_QPS_ERR -> IBV_QPS_SQD is not a legal transition" in reply.error, reply.error
    state = raw.call(ops.QUERY_QP, records.Handle(qp, 0)).body.state
    assert state == IBV_QPS_ERR, "a refused modify changes nothing"
    raw.close()
    _serving(service)


def test_another_process_handle_is_refused(service: ServiceProc,
                                           spawn: Callable[..., Worker]) -> None:  # fmt: skip
    """Handles are unique on the device: naming another process's QP, PD or MR
    is EPERM, and the owner's objects are untouched."""
    a = spawn(RcPeer, True)
    a.call("recv", n=1, qp2=True)
    victim = a.info["qp_handle"]
    raw = Raw(service.path)
    raw.open_device()
    for reply in (
        _modify(raw, victim, IBV_QPS_ERR, IBV_QP_STATE),
        raw.call(ops.QUERY_QP, records.Handle(victim, 0)),
        raw.call(ops.DESTROY, records.Destroy(records.KIND_QP, victim, 0, 0)),
    ):
        assert reply.header.status == errno.EPERM, reply
        assert "belongs to another process" in reply.error
    raw.close()
    a.call("send", data=b"unharmed")
    assert [w[0] for w in a.call("poll", n=2)] == [IBV_WC_SUCCESS] * 2
    a.finish()
    _serving(service)


def test_another_users_connection_is_refused(service: ServiceProc) -> None:
    """Only the service's own user (and root) may connect: SO_PEERCRED."""
    code = (
        "import socket, sys\n"
        "from softverbs.device import protocol\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        f"s.connect({service.path!r})\n"
        "data, fds = protocol.recv(s)\n"
        "print(protocol.decode(data).header.status)\n"
    )
    import shutil
    import subprocess
    import sys

    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to run a client as another user) and setpriv")
    os.chmod(os.path.dirname(service.path), 0o755)
    os.chmod(service.path, 0o777)  # let the socket be reached: the check is the service's
    src = os.path.dirname(os.path.dirname(os.path.abspath(protocol.__file__)))
    prefix = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(src)}
    other_uid_can_run(prefix, "import softverbs.device.protocol", env)
    r = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=30, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) == errno.EPERM, r.stdout
    assert service.stats()["stats"]["clients_refused"] == 1


# --- descriptors and fields ------------------------------------------------------------


def _fd_cases(ctx: int, pd: int) -> list[tuple[str, Any, Any, Callable[[], list[int]]]]:
    def memfd(size: int) -> Callable[[], list[int]]:
        return lambda: [_memfd(size)]

    def pipe() -> list[int]:
        r, w = os.pipe()
        os.close(w)
        return [r]

    def sock() -> list[int]:
        a, b = socket.socketpair()
        b.close()
        return [a.detach()]

    def readonly_file() -> list[int]:
        return [os.open("/proc/self/cmdline", os.O_RDONLY)]

    def devnull() -> list[int]:
        return [os.open("/dev/null", os.O_RDWR)]

    mr = records.RegMR(0, 8192, 0, 0, pd, 1, records.REG_MR_HAS_FD, 0)
    cq = records.CreateCQ(ctx, 16, 0, 0)
    sq_slot, rq_slot = send_slot_size(1, 0), recv_slot_size(1)
    qp = records.CreateQP(0, records.QPCaps(4, 4, 1, 1, 0, 0), ctx, pd, IBV_QPT_RC, 0, 0, 0, 0, 1,
                          0, sq_slot, rq_slot, 0)  # fmt: skip
    return [
        ("reg_mr without memory", ops.REG_MR, mr, lambda: []),
        ("reg_mr with two fds", ops.REG_MR, mr, lambda: memfd(8192)() + memfd(8192)()),
        ("reg_mr with a pipe", ops.REG_MR, mr, pipe),
        ("reg_mr with a socket", ops.REG_MR, mr, sock),
        ("reg_mr with a read-only file", ops.REG_MR, mr, readonly_file),
        ("reg_mr with /dev/null", ops.REG_MR, mr, devnull),
        ("reg_mr with too little memory", ops.REG_MR, mr, memfd(100)),
        ("create_cq with a pipe", ops.CREATE_CQ, cq, pipe),
        ("create_cq with too little memory", ops.CREATE_CQ, cq, memfd(64)),
        ("create_cq without a ring", ops.CREATE_CQ, cq, lambda: []),
        ("create_qp with one fd for two rings", ops.CREATE_QP, qp, memfd(1 << 16)),
        ("create_qp with three fds", ops.CREATE_QP, qp, lambda: memfd(1 << 16)()
         + memfd(1 << 16)() + memfd(1 << 16)()),
        ("open_device with a pipe for events", ops.OPEN_DEVICE, records.OpenDevice("sv0"), pipe),
        ("open_device with a stream socket", ops.OPEN_DEVICE, records.OpenDevice("sv0"), sock),
    ]


def test_fds_not_as_announced(service: ServiceProc) -> None:
    raw = Raw(service.path)
    ctx = raw.open_device()
    pd = raw.call(ops.ALLOC_PD, records.Ctx(ctx, 0)).body.handle
    fds = service.fd_count()
    for name, op, body, make in _fd_cases(ctx, pd):
        mine = make()
        reply = raw.call(op, body, mine)
        for fd in mine:
            os.close(fd)
        assert reply.header.status == errno.EINVAL, (name, reply)
        assert service.fd_count() <= fds, f"{name}: the service kept a descriptor"
    st = service.stats()
    assert st["objects"] == {"ctx": 1, "pd": 1} and st["keys"] == 0, st
    raw.close()
    _serving(service)


def _fields(ctx: int) -> list[tuple[Any, Any]]:
    qpattrs = records.QPAttrs.unpack(bytes(records.QPAttrs.size()))
    return [
        (ops.ALLOC_PD, records.Ctx(ctx + 1000, 0)),  # no such context
        (ops.OPEN_DEVICE, records.OpenDevice("no-such-device")),
        (ops.DESTROY, records.Destroy(77, 1, 0, 0)),  # no such kind
        (ops.DESTROY, records.Destroy(records.KIND_PD, 0xFFFFFFFF, 0, 0)),
        (ops.QUERY_PORT, records.QueryPort(ctx, 2)),
        (ops.QUERY_GID, records.QueryGid(ctx, 1, 99, 0)),
        (ops.CREATE_QP, records.CreateQP(0, records.QPCaps(4, 4, 1, 1, 0, 0), ctx, 0, 77, 0, 0, 0,
                                         0, 1, 0, 0, 0, 0)),
        (ops.MODIFY_QP, records.ModifyQP(qpattrs, 0xDEAD, IBV_QP_STATE)),
        (ops.XRC_RCV_QP_REGISTER, records.XrcQpn(0xDEAD, 5)),
        (ops.OPEN_XRCD, records.OpenXRCD(ctx, 0, 0, 0)),  # no file, no O_CREAT
        (ops.COUNTERS, records.Ctx(0, 0)),
    ]


def test_malformed_fields(service: ServiceProc) -> None:
    raw = Raw(service.path)
    ctx = raw.open_device()
    for op, body in _fields(ctx):
        reply = raw.call(op, body, [])
        assert reply.header.status in (errno.EINVAL, errno.ENODEV, errno.EPERM,
                                       errno.EOPNOTSUPP, errno.ENODATA), (op.name, reply)
        assert reply.error, op.name
    assert raw.call(ops.ALLOC_PD, records.Ctx(ctx, 0)).header.status == 0, "still connected"
    raw.close()
    _serving(service)


@pytest.mark.parametrize("how", ["opcode", "sges", "doorbell"])
def test_scribbled_ring_hurts_only_its_owner(service: ServiceProc, spawn: Callable[..., Worker],
                                            how: str) -> None:  # fmt: skip
    bystander = spawn(RcPeer, True)
    w = spawn(Scribbler, True)
    w.call("recv", n=4, qp2=True)
    status, state = w.call("scribble", how=how)
    if how == "doorbell":  # clamped to one ring's worth: the real WQE runs
        assert status == IBV_WC_SUCCESS
    else:
        assert (status, state) == (IBV_WC_LOC_QP_OP_ERR, IBV_QPS_ERR)
    bystander.call("recv", n=1, qp2=True)
    bystander.call("send", data=b"unaffected")
    assert [x[0] for x in bystander.call("poll", n=2)] == [IBV_WC_SUCCESS] * 2
    w.kill()
    bystander.finish()
    _serving(service)
