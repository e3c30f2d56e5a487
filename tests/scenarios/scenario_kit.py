"""Shared helpers and fixtures of the scenario tests (imported by name:
conftest modules must not be imported, their names collide across directories).

Shared setup for the scenario tests: written the way a pyverbs program is.

Every scenario opens ``Context(name='sv0')``, makes a PD, CQs, QPs and MRs
with the pyverbs constructors, connects QPs with ``to_rts`` and an
``AHAttr(is_global=1, gr=GlobalRoute(dgid=ctx.query_gid(1, 1), sgid_index=1))``,
and polls CQs.  Nothing here waits without a bound: :func:`poll_n` and
:func:`expect_event` fail with a message naming what they were waiting for
and what they saw instead.
"""

from __future__ import annotations

import errno
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from softverbs import (
    AH,
    CQ,
    MR,
    PD,
    QP,
    SGE,
    SRQ,
    WC,
    AHAttr,
    AsyncEvent,
    Context,
    PyverbsRDMAError,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    counters,
    testing,
    wc_status_str,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_1024,
    IBV_QP_STATE,
    IBV_QPT_UD,
    IBV_SEND_SIGNALED,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
    ibv_event_type,
)

ALL_ACCESS = (
    IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
)
MR_ACCESS = ALL_ACCESS | IBV_ACCESS_MW_BIND
QKEY = 0x11111111
MR_SIZE = 1 << 16
#: Byte offset in each MR where tests put receive buffers (sends use 0..).
RECV_OFF = MR_SIZE // 2


#: The three kinds of device every scenario runs on.
DEVICE_KINDS = ("inproc", "udp", "host")


@pytest.fixture(params=DEVICE_KINDS)
def ctx(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Context]:
    """``Context(name='sv0')`` on an in-process device, a UDP link on loopback,
    or the host device served by softverbsd (:func:`softverbs.testing.world`)."""
    kind = request.param
    socket = request.getfixturevalue("host_service") if kind == "host" else None
    monkeypatch.setenv("SOFTVERBS_SERVICE", socket or "0")
    global _world
    with testing.world(kind, socket=socket) as w:
        _world = w
        c = w.context(0)
        c.kind = kind  # type: ignore[attr-defined]
        yield c
        if kind != "host":
            c.runtime.faults = None  # type: ignore[attr-defined]
    _world = None


#: the world of the running scenario (the ``ctx`` fixture's); the waits below use it
_world: testing.World | None = None


def _current() -> testing.World:
    assert _world is not None, "a scenario helper waited outside the ctx fixture"
    return _world


def inproc_only(ctx: Context,
                why: str = "a Python packet filter runs where the device runs") -> None:
    """Skip unless the device runs in this process (``why``: what needs it)."""
    if getattr(ctx, "kind", "inproc") != "inproc":
        pytest.skip(f"in-process device only: {why}")


@pytest.fixture
def pd(ctx: Context) -> PD:
    return PD(ctx)


# --- building blocks -------------------------------------------------------------------
def gid_index(ctx: Context) -> int:
    """The device's IPv4 RoCEv2 GID: index 1 on an in-process or host device (0
    is the link-local one), 0 on a UDP link bound to one address."""
    from softverbs.verbs.addr import default_gid_index

    return default_gid_index(ctx)


def route(ctx: Context) -> AHAttr:
    """The AH attribute of a path to this device itself (RoCE: always global)."""
    ah: AHAttr = testing.route(ctx, gid_index(ctx))
    return ah


def make_qp(
    pd: PD,
    qp_type: int,
    scq: CQ,
    rcq: CQ | None = None,
    *,
    max_send_wr: int = 16,
    max_recv_wr: int = 16,
    max_send_sge: int = 4,
    max_recv_sge: int = 4,
    max_inline_data: int = 64,
    sq_sig_all: int = 1,
    srq: SRQ | None = None,
    access: int = ALL_ACCESS,
    to_init: bool = True,
) -> QP:
    """A QP; with ``to_init`` the constructor moves RC/UC to INIT and UD to RTS."""
    cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=max_send_sge,
                max_recv_sge=max_recv_sge, max_inline_data=max_inline_data)  # fmt: skip
    init = QPInitAttr(qp_type=qp_type, scq=scq, rcq=rcq if rcq is not None else scq, srq=srq,
                      cap=cap, sq_sig_all=sq_sig_all)  # fmt: skip
    if not to_init:
        return QP(pd, init)
    attr = QPAttr()
    attr.qp_access_flags = access
    attr.qkey = QKEY
    return QP(pd, init, attr)


def connect(
    qp: QP,
    remote_qpn: int,
    *,
    timeout: int = 14,
    retry_cnt: int = 7,
    rnr_retry: int = 7,
    min_rnr_timer: int = 1,
    sq_psn: int = 0,
    rq_psn: int = 0,
    path_mtu: int = IBV_MTU_1024,
    max_rd_atomic: int = 4,
) -> None:
    """Move a QP to RTS towards ``remote_qpn`` on this device (UD: just RTS)."""
    testing.connect_qp(qp, remote_qpn, route(qp.context), path_mtu, qp_access_flags=ALL_ACCESS,
                       qkey=QKEY, max_dest_rd_atomic=max_rd_atomic, max_rd_atomic=max_rd_atomic,
                       min_rnr_timer=min_rnr_timer, timeout=timeout, retry_cnt=retry_cnt,
                       rnr_retry=rnr_retry, sq_psn=sq_psn, rq_psn=rq_psn)  # fmt: skip


def modify_state(qp: QP, state: int, **extra: Any) -> None:
    attr = QPAttr()
    attr.qp_state = state
    mask = IBV_QP_STATE
    for name, (bit, value) in extra.items():
        setattr(attr, name, value)
        mask |= bit
    qp.modify(attr, mask)


def reset_and_reconnect(a: QP, b: QP, **kw: Any) -> None:
    """Both QPs: RESET -> INIT -> RTR -> RTS again, connected to each other."""
    from softverbs.enums import IBV_QPS_RESET

    for qp in (a, b):
        modify_state(qp, IBV_QPS_RESET)
    for qp in (a, b):
        attr = QPAttr()
        attr.qp_access_flags = ALL_ACCESS
        attr.qkey = QKEY
        qp.to_init(attr)
    connect(a, b.qp_num, **kw)
    connect(b, a.qp_num, **kw)


@dataclass
class Side:
    """One end: its QP, send and receive CQs, and a registered buffer."""

    qp: QP
    scq: CQ
    rcq: CQ
    mr: MR

    def sge(self, offset: int, length: int) -> SGE:
        return SGE(self.mr.buf + offset, length, self.mr.lkey)

    def write(self, data: bytes, offset: int = 0) -> None:
        self.mr.write(data, len(data), offset)

    def read(self, length: int, offset: int = 0) -> bytes:
        return self.mr.read(length, offset)


@dataclass
class Pair:
    """Two QPs on sv0 connected to each other (``a`` usually sends to ``b``)."""

    ctx: Context
    pd: PD
    a: Side
    b: Side
    qp_type: int
    extras: list[Any] = field(default_factory=list)

    def ah(self) -> AH:
        ah = AH(self.pd, attr=route(self.ctx))
        self.extras.append(ah)
        return ah


def make_pair(
    ctx: Context,
    qp_type: int,
    *,
    cqe: int = 256,
    shared_cq: bool = False,
    connected: bool = True,
    conn: dict[str, Any] | None = None,
    conn_b: dict[str, Any] | None = None,
    mr_size: int = MR_SIZE,
    **qp_kw: Any,
) -> Pair:
    """Two QPs of ``qp_type``, each with its own send and receive CQ.

    ``shared_cq``: each QP uses one CQ for sends and receives.  ``conn``
    (``connect`` keywords) applies to both sides unless ``conn_b`` is given.
    """
    pd = PD(ctx)
    sides = []
    for _ in range(2):
        scq = CQ(ctx, cqe)
        rcq = scq if shared_cq else CQ(ctx, cqe)
        qp = make_qp(pd, qp_type, scq, rcq, **qp_kw)
        mr = MR(pd, mr_size, MR_ACCESS)
        sides.append(Side(qp, scq, rcq, mr))
    a, b = sides
    if connected and qp_type != IBV_QPT_UD:
        connect(a.qp, b.qp.qp_num, **(conn or {}))
        connect(b.qp, a.qp.qp_num, **(conn_b if conn_b is not None else conn or {}))
    return Pair(ctx, pd, a, b, qp_type)


# --- work requests ---------------------------------------------------------------------
def send_wr(
    wr_id: int,
    side: Side,
    length: int,
    offset: int = 0,
    opcode: int = IBV_WR_SEND,
    flags: int = IBV_SEND_SIGNALED,
    **kw: Any,
) -> SendWR:
    """A one-SGE send WR from ``side``'s MR at ``offset``."""
    wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[side.sge(offset, length)],
                send_flags=flags, **kw)  # fmt: skip
    return wr


def write_wr(wr_id: int, src: Side, dst: Side, length: int, src_off: int = 0,
             dst_off: int = 0, flags: int = IBV_SEND_SIGNALED,
             opcode: int = IBV_WR_RDMA_WRITE) -> SendWR:  # fmt: skip
    wr = send_wr(wr_id, src, length, src_off, opcode=opcode, flags=flags)
    wr.set_wr_rdma(dst.mr.rkey, dst.mr.buf + dst_off)
    return wr


def recv_wr(wr_id: int, side: Side, length: int, offset: int = RECV_OFF) -> RecvWR:
    return RecvWR(wr_id=wr_id, num_sge=1, sg=[side.sge(offset, length)])


def chain(*wrs: Any) -> Any:
    """Link WRs through ``next_wr``; returns the first."""
    for w, nxt in itertools.pairwise(wrs):
        w.next_wr = nxt
    return wrs[0]


# --- completions -----------------------------------------------------------------------
def _fmt(wcs: list[WC]) -> str:
    return (
        "["
        + ", ".join(
            f"(wr_id={w.wr_id}, {wc_status_str(w.status)}, opcode={w.opcode}, "
            f"byte_len={w.byte_len}, qp={w.qp_num:#x})"
            for w in wcs
        )
        + "]"
    )


def poll_n(cq: CQ, n: int, timeout: float = 3.0, what: str = "") -> list[WC]:
    """Poll exactly ``n`` completions, of any status, failing clearly after ``timeout``
    seconds (:func:`softverbs.testing.wait_completions`)."""
    wcs: list[WC] = testing.wait_completions(_current(), cq, n, timeout=timeout, status=None,
                                             what=what)  # fmt: skip
    return wcs


def poll_exact(cq: CQ, n: int, timeout: float = 3.0, what: str = "") -> list[WC]:
    """Poll ``n`` completions and check that no further one is waiting."""
    wcs = poll_n(cq, n, timeout, what)
    assert_cq_empty(cq, what)
    return wcs


def assert_cq_empty(cq: CQ, what: str = "", settle: float = 0.0) -> None:
    if settle:
        time.sleep(settle)
    k, wcs = cq.poll(16)
    assert k == 0, f"{what or 'CQ'}: expected no completion, got {_fmt(wcs)}"


def check_wc(wc: WC, wr_id: int, status: int, opcode: int | None = None,
             byte_len: int | None = None, qp: QP | None = None) -> None:  # fmt: skip
    desc = _fmt([wc])
    assert wc.wr_id == wr_id, f"wr_id: {desc}, want {wr_id}"
    assert wc.status == status, f"status: {desc}, want {wc_status_str(status)} ({wc.reason!r})"
    if opcode is not None:
        assert wc.opcode == opcode, f"opcode: {desc}, want {opcode}"
    if byte_len is not None:
        assert wc.byte_len == byte_len, f"byte_len: {desc}, want {byte_len}"
    if qp is not None:
        assert wc.qp_num == qp.qp_num, f"qp_num: {desc}, want {qp.qp_num:#x}"


def wait_until(cond: Callable[[], bool], ctx: Context, timeout: float = 3.0,
               what: str = "condition") -> None:  # fmt: skip
    """Drive the devices until ``cond()``; fail after ``timeout``
    (:func:`softverbs.testing.wait_until`)."""
    def locked() -> bool:  # the device's own thread (UDP) changes what cond reads
        with ctx.lock:
            return cond()

    testing.wait_until(_current(), locked, timeout=timeout, what=what)


# --- async events ----------------------------------------------------------------------
def _ev_name(t: int) -> str:
    try:
        return ibv_event_type(t).name
    except ValueError:
        return str(t)


def expect_event(ctx: Context, event_type: int, element: Any = None,
                 timeout: float = 2.0) -> AsyncEvent:  # fmt: skip
    """The next async event must be ``event_type`` (about ``element``)."""
    try:
        ev = ctx.get_async_event(timeout=timeout)
    except PyverbsRDMAError as e:
        pytest.fail(f"expected async event {_ev_name(event_type)}, none came: {e}")
    assert ev.event_type == event_type, (
        f"expected {_ev_name(event_type)}, got {_ev_name(ev.event_type)} ({ev.reason!r})"
    )
    if element is not None:
        assert ev.element is element, (
            f"{_ev_name(event_type)} is about {ev.element!r}, expected {element!r}"
        )
    ev.ack()
    return ev


def assert_no_event(ctx: Context, timeout: float = 0.01) -> None:
    with pytest.raises(PyverbsRDMAError) as ei:
        ev = ctx.get_async_event(timeout=timeout)
        pytest.fail(f"unexpected async event {_ev_name(ev.event_type)} ({ev.reason!r})")
    assert ei.value.error_code == errno.EAGAIN


def drain_events(ctx: Context) -> list[AsyncEvent]:
    out = []
    while True:
        try:
            out.append(ctx.get_async_event(timeout=0))
        except PyverbsRDMAError:
            return out


# --- errors ----------------------------------------------------------------------------
@contextmanager
def raises_errno(code: int, *fragments: str) -> Iterator[Any]:
    """Expect PyverbsRDMAError with ``error_code == code`` and text fragments."""
    with pytest.raises(PyverbsRDMAError) as ei:
        yield ei
    assert ei.value.error_code == code, (
        f"errno {ei.value.error_code}, want {errno.errorcode[code]}: {ei.value}"
    )
    for frag in fragments:
        assert frag in str(ei.value), f"{frag!r} not in error message: {ei.value}"


def stats(ctx: Context) -> Counter[str]:
    """The device counters; a counter that never moved reads 0."""
    return Counter(counters(ctx))


# --- fault injection (the runtime's packet filter hook) --------------------------------
class DropFilter:
    """Drops every packet for which ``pred(pkt)`` is true; counts them."""

    def __init__(self, pred: Callable[[Any], bool]) -> None:
        self.pred = pred
        self.dropped = 0

    def process(self, pkt: Any, now: float) -> list[tuple[float, Any]]:
        if self.pred(pkt):
            self.dropped += 1
            return []
        return [(now, pkt)]
