"""Bad input never takes softverbsd down, and never leaks.

Each case is followed by the same check: the service is alive, answers a
new client, and -- once the offender is gone -- holds no object, no memory
key and no file descriptor more than before.  Cases:

* QP numbers that are stale, of another domain, not XRC receive QPs, or
  that never existed: EINVAL for register, unregister and open;
* a process that registers twice holds one reference;
* socket peers that are not softverbs clients: garbage, JSON that is not an
  object, a request before ``hello``, a wrong protocol version, an unknown
  request, nesting deep enough to break a recursive parser, too many file
  descriptors -- each gets an error and is
  disconnected; the service serves the others on;
* a client that disconnects in the middle of a call;
* file descriptors that are not what the request announced;
* malformed fields, and a process that scribbles on its own rings.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from svkit import (
    RcPeer,
    Scribbler,
    ServiceProc,
    Worker,
    XrcReceiver,
    XrcSender,
    raw_call,
    raw_client,
)

from softverbs.enums import IBV_QPS_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_SUCCESS
from softverbs.service import protocol


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


def _expect_kicked(sock: socket.socket) -> dict[str, Any]:
    """The service answers with an error, then closes the connection."""
    msg, fds = protocol.recv(sock)
    assert not fds
    assert msg.get("errno") == errno.EPROTO, msg
    assert "not a softverbs client" in msg["error"], msg
    with pytest.raises(EOFError):
        protocol.recv(sock)
    sock.close()
    return msg


@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.0\r\n\r\n",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'"just a string"',
        b"[" * 100000 + b"]" * 100000,
    ],
    ids=["http", "binary", "json-array", "json-string", "deep-nesting"],
)
def test_not_a_client_gets_an_error(service: ServiceProc, payload: bytes) -> None:
    fds = service.fd_count()
    sock = raw_client(service.path, hello=False)
    sock.send(payload)
    _expect_kicked(sock)
    _serving(service, fds)


def test_protocol_violations(service: ServiceProc, spawn: Callable[..., Worker]) -> None:
    fds = service.fd_count()
    for request in (
        {"op": "alloc_pd", "id": 1, "dev": "sv0"},  # before hello
        {"op": "hello", "id": 1, "version": 999},  # a protocol it does not speak
        {"id": 1},  # no op
    ):
        sock = raw_client(service.path, hello=False)
        protocol.send(sock, request)
        _expect_kicked(sock)
    sock = raw_client(service.path)
    protocol.send(sock, {"op": "format_disk", "id": 2})  # an unknown request
    _expect_kicked(sock)
    # Too many file descriptors for one message.
    sock = raw_client(service.path)
    pipes = [os.pipe() for _ in range(protocol.MAX_FDS + 2)]
    socket.send_fds(sock, [b'{"op":"stats","id":3}'], [r for r, _ in pipes])
    _expect_kicked(sock)
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
        sock = raw_client(service.path)
        mem = os.memfd_create("mr")
        os.ftruncate(mem, 8192)
        protocol.send(sock, {"op": "alloc_pd", "id": 10, "dev": "sv0"})
        protocol.send(sock, {"op": "reg_mr", "id": 11, "pd": 1, "length": 8192, "addr": 4096,
                             "access": 1}, [mem])  # fmt: skip
        protocol.send(sock, {"op": "create_cq", "id": 12, "dev": "sv0", "capacity": 8})
        os.close(mem)
        sock.close()
    # A client sends half a conversation and is shut down for writing.
    sock = raw_client(service.path)
    protocol.send(sock, {"op": "alloc_pd", "id": 10, "dev": "sv0"})
    sock.shutdown(socket.SHUT_WR)
    msg, _ = protocol.recv(sock)  # it still gets its answer
    assert "obj" in msg, msg
    sock.close()
    _serving(service, fds)


def test_a_process_killed_in_a_blocking_call(service: ServiceProc,
                                             spawn: Callable[..., Worker]) -> None:  # fmt: skip
    peer = spawn(RcPeer, True, True)
    peer.call("arm")
    peer.send("cq_event")  # blocks in the service's socket...
    peer.kill()  # ...and dies there
    _serving(service)


def _fd_cases() -> list[tuple[str, dict[str, Any], Callable[[], list[int]]]]:
    def memfd(size: int) -> Callable[[], list[int]]:
        def make() -> list[int]:
            fd = os.memfd_create("x")
            os.ftruncate(fd, size)
            return [fd]

        return make

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

    mr = {"op": "reg_mr", "pd": 1, "length": 8192, "addr": 0, "access": 1}
    cq = {"op": "create_cq", "dev": "sv0", "capacity": 16}
    qp = {"op": "create_qp", "dev": "sv0", "qp_type": 2, "pd": 1, "scq": None, "rcq": None,
          "sq_sig_all": 1, "pmtu": 1024, "sq": {"size": 4, "slot": 256},
          "rq": {"size": 4, "slot": 64}}  # fmt: skip
    return [
        ("reg_mr without memory", mr, lambda: []),
        ("reg_mr with two fds", mr, lambda: memfd(8192)() + memfd(8192)()),
        ("reg_mr with a pipe", mr, pipe),
        ("reg_mr with a socket", mr, sock),
        ("reg_mr with a read-only file", mr, readonly_file),
        ("reg_mr with /dev/null", mr, devnull),
        ("reg_mr with too little memory", mr, memfd(100)),
        ("create_cq with a pipe", cq, pipe),
        ("create_cq with too little memory", cq, memfd(64)),
        ("create_qp with one fd for two rings", qp, memfd(1 << 16)),
        ("create_qp with three fds", qp, lambda: memfd(1 << 16)() + memfd(1 << 16)()
         + memfd(1 << 16)()),
    ]


def test_fds_not_as_announced(service: ServiceProc) -> None:
    sock = raw_client(service.path)
    assert "obj" in raw_call(sock, "alloc_pd", dev="sv0")
    fds = service.fd_count()
    for name, request, make in _fd_cases():
        req = dict(request)
        op = req.pop("op")
        mine = make()
        reply = raw_call(sock, op, mine, **req)
        for fd in mine:
            os.close(fd)
        assert reply.get("errno") == errno.EINVAL, (name, reply)
        assert service.fd_count() <= fds + 1, f"{name}: the service kept a descriptor"
    st = service.stats()
    assert st["objects"] == {"pd": 1} and st["keys"] == 0, st
    sock.close()
    _serving(service)


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("alloc_pd", {"dev": 7}),
        ("alloc_pd", {"dev": "no-such-device"}),
        ("destroy", {"obj": "1", "kind": "pd"}),
        ("destroy", {"obj": 1, "kind": "hca"}),
        ("destroy", {"obj": [1], "kind": "pd"}),
        ("create_cq", {"dev": "sv0", "capacity": -1}),
        ("create_cq", {"dev": "sv0", "capacity": 10**30}),
        ("create_cq", {"dev": "sv0", "capacity": 1.5}),
        ("create_qp", {"dev": "sv0", "qp_type": 2, "pd": 1, "sq_sig_all": 0, "pmtu": 1024,
                       "sq": {"size": 0, "slot": 256}}),
        ("create_qp", {"dev": "sv0", "qp_type": 2, "pd": 1, "sq_sig_all": 0, "pmtu": 1024,
                       "sq": {"size": 4, "slot": 1}}),
        ("create_qp", {"dev": "sv0", "qp_type": 77, "pd": 1, "sq_sig_all": 0, "pmtu": 1024}),
        ("modify_qp", {"qp": 1, "attrs": {"__class__": 1}}),
        ("modify_qp", {"qp": 1, "attrs": {"route": {"dgid": "zz"}}}),
        ("xrc_register", {"xrcd": 1, "qpn": -5}),
        ("open_xrcd", {"dev": "sv0", "oflags": "O_CREAT"}),
        ("counters", {}),
    ],
)
def test_malformed_fields(service: ServiceProc, op: str, fields: dict[str, Any]) -> None:
    sock = raw_client(service.path)
    raw_call(sock, "alloc_pd", dev="sv0")
    reply = raw_call(sock, op, **fields)
    assert reply.get("errno") in (errno.EINVAL, errno.ENODEV, errno.ENOENT), reply
    assert "obj" in raw_call(sock, "alloc_pd", dev="sv0"), "the client stays connected"
    sock.close()
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


def test_served_modify_accepts_every_attribute_the_verbs_layer_sends() -> None:
    """modify_qp takes only attribute names it knows (a request must not set
    arbitrary attributes of an engine object): they must cover everything
    ``engine_values`` can produce."""
    from softverbs import AHAttr, Context, GlobalRoute, QPAttr
    from softverbs.service.server import _QP_ATTRS
    from softverbs.verbs.qp import engine_values

    env = os.environ.pop("SOFTVERBS_SERVICE", None)
    try:
        ctx = Context(name="sv0")
        a = QPAttr()
        a.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=ctx.query_gid(1, 1), sgid_index=1))
        a.alt_ah_attr = a.ah_attr
        values = engine_values(ctx, a, (1 << 21) - 1)
        ctx.close()
    finally:
        if env is not None:
            os.environ["SOFTVERBS_SERVICE"] = env
    assert set(values) <= _QP_ATTRS, set(values) - _QP_ATTRS
