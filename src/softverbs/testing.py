"""Testing RDMA code on softverbs: devices, connected pairs, waits, fault scripts, checks.

In the style of ``trio.testing``: small helpers a test suite puts around ordinary
pyverbs code, so that the same test runs on every kind of softverbs device.

::

    from softverbs import testing
    from softverbs.enums import IBV_QPT_RC

    def test_my_protocol():
        with testing.world("sim", faults="seed=7;drop=0.05") as w:
            pair = testing.connected_pair(w, IBV_QPT_RC)
            ...                                   # post, as the program does
            wcs = testing.wait_completions(w, pair.b.cq, 1)

* :func:`world` -- the devices a test runs on: ``"sim"`` (a :class:`Simulation` on a
  virtual clock, reproducible from its seed), ``"inproc"`` (devices of this process),
  ``"udp"`` (RoCEv2 over UDP on private loopback addresses) or ``"host"`` (a private
  softverbsd, started for the world and stopped with it, or one given by its socket).
* :func:`connected_pair` -- two endpoints (context, PD, CQ, MR, QP) whose QPs are
  connected: RC, UC, UD (with an AH to the peer) or XRC (a send QP to the peer's
  receive QP and SRQ).
* :func:`wait_completions`, :func:`wait_until` -- bounded waits. On a simulation they
  run on its virtual clock (an empty poll moves time to the next timer) and never sleep;
  elsewhere they poll, yielding the CPU, until a wall-clock bound.
* :class:`FaultScript` -- deterministic, scripted faults ("drop the 3rd SEND, delay every
  ACK by 1 ms") on the packets of an in-process device, with a log of what was done;
  :func:`set_faults` applies seeded ``SOFTVERBS_FAULTS`` rules on any kind of device.
* :func:`check_device` -- a conformance helper: the queue behaviours of the seeds, run
  against a world's devices, each reported as a :class:`CheckResult`.

Failures raise ``AssertionError`` with a message naming what was awaited and what was
seen, so the helpers work under pytest, unittest or a plain script.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_1024,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_XRCD,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    IBV_SRQ_INIT_ATTR_CQ,
    IBV_SRQ_INIT_ATTR_PD,
    IBV_SRQ_INIT_ATTR_TYPE,
    IBV_SRQ_INIT_ATTR_XRCD,
    IBV_SRQT_XRC,
    IBV_WC_SUCCESS,
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
    ibv_qp_type,
)
from softverbs.fabric.faults import packet_kinds
from softverbs.verbs import registry
from softverbs.verbs import world as worlds
from softverbs.wire.packet import Packet

Kind = Literal["sim", "inproc", "udp", "host"]
#: every kind of device a world can be made of
KINDS: tuple[Kind, ...] = ("sim", "inproc", "udp", "host")
#: the access every endpoint's MR and QP grant
ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
          | IBV_ACCESS_REMOTE_ATOMIC)  # fmt: skip
#: the Q_Key of UD and XRC pairs
QKEY = 0x11111111


# --- worlds ---------------------------------------------------------------------------------


@dataclass
class World:
    """The devices of one test: :func:`world` makes it, and makes it current."""

    kind: Kind
    #: the device each side of a pair opens (the same device on a served world)
    devices: tuple[str, str]
    sim: Any = None  #: the Simulation, for kind "sim"
    socket: str = ""  #: the service's socket, for kind "host"
    contexts: list[Any] = field(default_factory=list)

    @property
    def virtual(self) -> bool:
        """Whether time is the simulation's (waits never sleep)."""
        return self.sim is not None

    def now(self) -> float:
        """Seconds: the simulation's virtual clock, or the monotonic clock."""
        return float(self.sim.now) if self.sim is not None else time.monotonic()

    def context(self, side: int = 0, opener: Callable[[str], Any] | None = None) -> Any:
        """A new context on side ``side``'s device, closed with the world; ``opener``
        (given the device name) opens another kind of context, e.g. an mlx5dv one."""
        from softverbs.verbs.device import Context

        ctx = opener(self.devices[side]) if opener is not None else Context(name=self.devices[side])
        self.contexts.append(ctx)
        return ctx


@contextlib.contextmanager
def world(kind: Kind = "sim", *, seed: int = 0, faults: str | None = None, mtu: int = 4096,
          socket: str | None = None) -> Iterator[World]:  # fmt: skip
    """Devices of ``kind`` for the duration of the ``with`` block (module docstring).

    ``faults`` are ``SOFTVERBS_FAULTS`` rules for every packet of the world (``seed``
    seeds them unless they name their own); ``mtu`` is a simulated device's MTU;
    ``socket`` names a running softverbsd for kind ``"host"`` instead of starting one."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of device {kind!r}; choose one of {', '.join(KINDS)}")
    if faults is not None and "seed=" not in faults:
        faults = f"seed={seed};{faults}"
    with contextlib.ExitStack() as stack:
        w = stack.enter_context(_make_world(kind, faults, mtu, socket))
        try:
            yield w
        finally:
            for ctx in reversed(w.contexts):
                with contextlib.suppress(Exception):
                    ctx.close()


def simulated(sim: Any, devices: tuple[str, str] = ("a", "b")) -> World:
    """A world on a :class:`~softverbs.sim.Simulation` the caller opened (for the
    topologies, congestion control and timers :func:`world` does not set): pairs on
    its ``devices``, waits on its clock. The simulation closes the contexts."""
    return World("sim", devices, sim=sim)


@contextlib.contextmanager
def _make_world(kind: Kind, faults: str | None, mtu: int, socket: str | None
                ) -> Iterator[World]:  # fmt: skip
    from softverbs.fabric.faults import parse_faults

    if kind == "sim":
        from softverbs.sim import Simulation

        with Simulation(("a", "b"), faults=faults, mtu=mtu) as sim:
            yield World(kind, ("a", "b"), sim=sim)
        return
    if kind == "host":
        with _served_registry(socket) as (path, reg):
            worlds.push(reg)
            try:
                w = World(kind, ("sv0", "sv0"), socket=path)
                if faults is not None:
                    set_faults(w.context(0), faults)
                yield w
            finally:
                worlds.pop(reg)
                reg.shutdown()
        return
    specs = [_spec(kind, name, i) for i, name in enumerate(("sv0", "sv1"))]
    reg = registry.Registry(specs)
    worlds.push(reg)
    try:
        w = World(kind, ("sv0", "sv1"))
        if faults is not None:
            for i in (0, 1):
                w.context(i).runtime.faults = parse_faults(faults)
        yield w
    finally:
        worlds.pop(reg)
        reg.shutdown()


def _spec(kind: Kind, name: str, i: int) -> registry.DeviceSpec:
    if kind == "inproc":
        return registry.DeviceSpec(name, "inproc", addrs=(f"127.0.0.{i + 1}",),
                                   mac=bytes([2, 0, 0, 0, 0, i + 1]))  # fmt: skip
    # a loopback address of this world's own, so that parallel worlds do not meet
    base = (os.getpid() * 2 + i) % (254 * 250)
    addr = f"127.{101 + base // 254 % 150}.{base % 254 + 1}.{i + 1}"
    return registry.DeviceSpec(name, "udp", addrs=(addr,), mtu=4096,
                               mac=bytes([2, 0, 0, 0, 1, i + 1]))  # fmt: skip


@contextlib.contextmanager
def _served_registry(socket: str | None) -> Iterator[tuple[str, Any]]:
    from softverbs.verbs.served import ServiceRegistry

    if socket is not None:
        yield socket, ServiceRegistry(socket)
        return
    d = tempfile.mkdtemp(prefix="svtest", dir="/tmp")  # a Unix socket path is short
    path = os.path.join(d, "softverbsd.sock")
    try:
        yield path, ServiceRegistry(path)  # the first request starts the service
    finally:
        subprocess.run([sys.executable, "-m", "softverbs", "service", "stop", "--socket", path],
                       capture_output=True, timeout=60, check=False)  # fmt: skip
        shutil.rmtree(d, ignore_errors=True)


def set_faults(ctx: Any, faults: str) -> None:
    """Seeded ``SOFTVERBS_FAULTS`` rules on the packets of this process's QPs on
    ``ctx``'s device, on any kind of device (on the host device the service applies
    them); ``""`` removes them."""
    from softverbs.device import ops, records
    from softverbs.verbs.provider import Attach

    ctx.provider.call(ops.FAULTS, records.Ctx(ctx.handle, 0), Attach(text=faults))


# --- pairs ----------------------------------------------------------------------------------


@dataclass
class Endpoint:
    """One side of a pair: its context, PD, CQ (sends and receives), MR and QP."""

    ctx: Any
    pd: Any
    cq: Any
    mr: Any
    qp: Any
    #: UD: the AH to the peer and the peer's QPN; XRC: the peer's SRQ number
    ah: Any = None
    remote_qpn: int = 0
    remote_srqn: int = 0
    extras: list[Any] = field(default_factory=list)  #: XRC domain, SRQ, receive QP

    def sge(self, offset: int = 0, length: int | None = None) -> Any:
        """An SGE of this endpoint's MR."""
        from softverbs.verbs.wr import SGE

        return SGE(self.mr.buf + offset, self.mr.length - offset if length is None else length,
                   self.mr.lkey)  # fmt: skip

    def close(self) -> None:
        for obj in (self.qp, *reversed(self.extras), self.ah, self.mr, self.cq, self.pd):
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()


@dataclass
class Pair:
    """Two endpoints whose QPs are connected to each other."""

    a: Endpoint
    b: Endpoint
    qp_type: int

    def close(self) -> None:
        self.a.close()
        self.b.close()


def connected_pair(w: World, qp_type: int = IBV_QPT_RC, *, depth: int = 64,
                   mr_size: int = 1 << 16, path_mtu: int = IBV_MTU_1024,
                   **attrs: int) -> Pair:  # fmt: skip
    """Two endpoints on the world's two devices, their QPs connected and in RTS.

    ``depth`` sizes the queues (the CQ holds ``4 * depth``); ``attrs`` are further
    ``QPAttr`` fields for the move to RTR/RTS (``timeout``, ``retry_cnt``, ...). For
    XRC, ``a.qp`` is an XRC send QP and ``b`` holds the XRC domain, SRQ and receive
    QP: send with ``wr.set_qp_type_xrc(pair.a.remote_srqn)``."""
    if qp_type not in (IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND):
        raise ValueError(f"connected_pair makes RC, UC, UD and XRC (IBV_QPT_XRC_SEND) pairs, "
                         f"not {_type_name(qp_type)}")  # fmt: skip
    a = endpoint(w.context(0), qp_type, depth, mr_size)
    b = endpoint(w.context(1), IBV_QPT_XRC_RECV if qp_type == IBV_QPT_XRC_SEND else qp_type,
                  depth, mr_size)  # fmt: skip
    if qp_type == IBV_QPT_UD:
        from softverbs.verbs.addr import AH

        for me, peer in ((a, b), (b, a)):
            me.ah = AH(me.pd, attr=_route(me.ctx, peer.ctx))
            me.remote_qpn = peer.qp.qp_num
    else:
        for me, peer in ((a, b), (b, a)):
            connect(me, peer, path_mtu, **attrs)
        if qp_type == IBV_QPT_XRC_SEND:
            a.remote_srqn = b.extras[1].get_srq_num()
    return Pair(a, b, qp_type)


def _type_name(qp_type: int) -> str:
    try:
        return ibv_qp_type(qp_type).name
    except ValueError:
        return str(qp_type)


def endpoint(ctx: Any, qp_type: int = IBV_QPT_RC, depth: int = 64, mr_size: int = 1 << 16
             ) -> Endpoint:  # fmt: skip
    """An endpoint on ``ctx``: a PD, a CQ of ``4 * depth``, an MR of ``mr_size`` and a QP
    of ``qp_type`` in INIT (RC, UC, XRC) or RTS (UD); for IBV_QPT_XRC_RECV also an XRC
    domain and SRQ (in ``extras``)."""
    from softverbs.verbs.cq import CQ
    from softverbs.verbs.mr import MR
    from softverbs.verbs.pd import PD
    from softverbs.verbs.qp import QP, QPAttr, QPCap, QPInitAttr

    pd = PD(ctx)
    cq = CQ(ctx, 4 * depth)
    mr = MR(pd, mr_size, ACCESS)
    attr = QPAttr()
    attr.qp_access_flags = ACCESS
    attr.qkey = QKEY
    extras: list[Any] = []
    if qp_type == IBV_QPT_XRC_RECV:
        from softverbs.verbs.qp import QPInitAttrEx
        from softverbs.verbs.srq import SRQ, SrqInitAttrEx
        from softverbs.verbs.xrcd import XRCD, XRCDInitAttr

        xrcd = XRCD(ctx, XRCDInitAttr(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
                                      os.O_CREAT, -1))  # fd -1: a domain of this process
        srq_attr = SrqInitAttrEx(max_wr=depth, max_sge=2)
        srq_attr.srq_type = IBV_SRQT_XRC
        srq_attr.pd, srq_attr.xrcd, srq_attr.cq = pd, xrcd, cq
        srq_attr.comp_mask = (IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD
                              | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_XRCD)  # fmt: skip
        srq = SRQ(ctx, srq_attr)
        qp = QP(ctx, QPInitAttrEx(qp_type=qp_type, comp_mask=IBV_QP_INIT_ATTR_XRCD, xrcd=xrcd),
                attr)  # fmt: skip
        extras = [xrcd, srq]
    elif qp_type == IBV_QPT_XRC_SEND:
        from softverbs.verbs.qp import QPInitAttrEx

        init_ex = QPInitAttrEx(qp_type=qp_type, scq=cq, rcq=cq, pd=pd,
                               comp_mask=IBV_QP_INIT_ATTR_PD, sq_sig_all=1,
                               cap=QPCap(max_send_wr=depth, max_recv_wr=0, max_send_sge=2,
                                         max_recv_sge=0))  # fmt: skip
        qp = QP(ctx, init_ex, attr)
    else:
        init = QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, sq_sig_all=1,
                          cap=QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=2,
                                    max_recv_sge=2))  # fmt: skip
        qp = QP(pd, init, attr)
    return Endpoint(ctx, pd, cq, mr, qp, extras=extras)


def _gid_index(ctx: Any) -> int:
    from softverbs.verbs.addr import default_gid_index

    return int(default_gid_index(ctx))


def route(ctx: Any, gid_index: int | None = None, sgid_index: int | None = None) -> Any:
    """The AH attribute of a global path to ``ctx``'s port 1, at its GID ``gid_index`` (by
    default its first IPv4 RoCEv2 GID), from source GID ``sgid_index`` (default the same
    index: the two ends of a test share their GID table layout)."""
    from softverbs.verbs.addr import AHAttr, GlobalRoute

    index = _gid_index(ctx) if gid_index is None else gid_index
    source = index if sgid_index is None else sgid_index
    return AHAttr(is_global=1, port_num=1,
                  gr=GlobalRoute(dgid=ctx.query_gid(1, index), sgid_index=source))  # fmt: skip


def _route(me: Any, peer: Any) -> Any:
    """The path from ``me`` to ``peer``, each at its own default GID."""
    return route(peer, _gid_index(peer), _gid_index(me))


def connect_qp(qp: Any, dest_qpn: int, ah_attr: Any, path_mtu: int = IBV_MTU_1024,
               **attrs: int) -> None:  # fmt: skip
    """Move ``qp`` to RTS towards QP ``dest_qpn`` over ``ah_attr``, with the tests'
    attributes: every access right, 4 RDMA reads/atomics each way, ``timeout`` 14,
    ``retry_cnt`` and ``rnr_retry`` 7, ``min_rnr_timer`` 1; ``attrs``: other QPAttr
    fields or values (``qkey``, ``sq_psn``, ...).  The one implementation of the test
    suite's "connect this QP"; the kits' ``connect`` helpers differ only in their
    defaults."""
    from softverbs.verbs.qp import QPAttr

    attr = QPAttr()
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num = dest_qpn
    attr.path_mtu = path_mtu
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 4
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 1
    for name, value in attrs.items():
        setattr(attr, name, value)
    attr.ah_attr = ah_attr
    qp.to_rts(attr)


def connect(me: Endpoint, peer: Endpoint, path_mtu: int = IBV_MTU_1024, **attrs: int) -> None:
    """Move ``me``'s QP to RTS towards ``peer``'s (``attrs``: further QPAttr fields)."""
    connect_qp(me.qp, peer.qp.qp_num, _route(me.ctx, peer.ctx), path_mtu, **attrs)


# --- waits ----------------------------------------------------------------------------------


def wait_until(w: World, cond: Callable[[], bool], *, timeout: float = 5.0,
               what: str = "the condition") -> None:  # fmt: skip
    """Until ``cond()`` holds: ``timeout`` virtual seconds on a simulation (time moves
    to each next timer; nothing sleeps), else wall-clock seconds of running the devices."""
    if w.sim is not None:
        if not w.sim.runtime.wait_for(cond, timeout):
            raise AssertionError(f"timed out after {timeout:g} virtual s waiting for {what}")
        return
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        for ctx in w.contexts:
            progress = getattr(ctx.runtime, "progress", None)
            if progress is not None and not ctx.closed:
                with ctx.runtime.lock:
                    progress()
        os.sched_yield()


def wait_completions(w: World, cq: Any, n: int, *, timeout: float = 5.0,
                     status: int | None = IBV_WC_SUCCESS, what: str = "") -> list[Any]:  # fmt: skip
    """Exactly ``n`` completions from ``cq``, within ``timeout`` (as :func:`wait_until`);
    each must have ``status`` unless it is None."""
    got: list[Any] = []
    end = w.now() + timeout
    while len(got) < n:
        k, wcs = cq.poll(n - len(got))  # an empty poll moves a simulation's time on
        got.extend(wcs)
        if k == 0:
            idle = w.sim is not None and w.sim.runtime.next_deadline() is None
            if w.now() > end or idle:
                why = "the simulation is idle (nothing in flight, no timer)" if idle else (
                    f"after {timeout:g} {_unit(w)}")
                raise AssertionError(f"{what or 'CQ'}: {len(got)} of {n} completion(s) {why}: "
                                     f"{_describe(got)}")  # fmt: skip
            if w.sim is None:
                os.sched_yield()
    bad = [wc for wc in got if status is not None and wc.status != status]
    if bad:
        raise AssertionError(f"{what or 'CQ'}: completions with another status than "
                             f"{_status(status or 0)}: {_describe(bad)}")  # fmt: skip
    return got


def _unit(w: World) -> str:
    return "virtual s" if w.virtual else "s"


def _status(status: int) -> str:
    from softverbs.verbs.cq import wc_status_str

    return str(wc_status_str(status))


def _describe(wcs: Sequence[Any]) -> str:
    if not wcs:
        return "none"
    return "; ".join(f"wr_id {wc.wr_id} {_status(wc.status)}"
                     + (f" ({wc.reason})" if getattr(wc, "reason", "") else "")
                     for wc in wcs)  # fmt: skip


# --- fault scripts --------------------------------------------------------------------------

Action = Literal["drop", "delay", "duplicate", "corrupt"]


@dataclass
class Step:
    """Do ``action`` to the ``nth`` packet (1-based) matching ``kinds`` and ``dqpn``, and
    to the ``count - 1`` matching packets after it."""

    action: Action
    kinds: frozenset[str] = frozenset()  #: fault kind names (softverbs.fabric.faults); empty: any
    nth: int = 1
    count: int = 1
    seconds: float = 0.0  #: for "delay"
    dqpn: int | None = None
    seen: int = 0  #: matching packets so far

    def matches(self, pkt: Packet) -> bool:
        if self.dqpn is not None and pkt.dqpn != self.dqpn:
            return False
        return not self.kinds or bool(self.kinds & packet_kinds(pkt))


class FaultScript:
    """Scripted faults on the packets of an in-process device, in the order written:
    ``FaultScript().drop("send", nth=3).delay("ack", seconds=1e-3, count=10)``.

    Attach it with :meth:`attach` (or as a fabric's ``faults``). Each step counts the
    packets that match it, so a script acts on exactly the packets it names, whatever
    the timing; :attr:`log` records (virtual) time, action, opcode and PSN of each act."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.log: list[tuple[float, str, int, int]] = []

    def _add(self, action: Action, kinds: str | Sequence[str], **kw: Any) -> FaultScript:
        from softverbs.fabric.faults import KIND_NAMES

        names = frozenset([kinds] if isinstance(kinds, str) else kinds) - {"any"}
        unknown = names - KIND_NAMES
        if unknown:
            raise ValueError(f"unknown packet kinds {sorted(unknown)}; known: any, "
                             f"{', '.join(sorted(KIND_NAMES))}")  # fmt: skip
        step = Step(action, names, **kw)
        if step.nth < 1 or step.count < 1:
            raise ValueError(f"nth and count start at 1, not {step.nth} and {step.count}")
        self.steps.append(step)
        return self

    def drop(self, kinds: str | Sequence[str] = "any", **kw: Any) -> FaultScript:
        return self._add("drop", kinds, **kw)

    def delay(self, kinds: str | Sequence[str] = "any", *, seconds: float, **kw: Any
              ) -> FaultScript:  # fmt: skip
        return self._add("delay", kinds, seconds=seconds, **kw)

    def duplicate(self, kinds: str | Sequence[str] = "any", **kw: Any) -> FaultScript:
        return self._add("duplicate", kinds, **kw)

    def corrupt(self, kinds: str | Sequence[str] = "any", **kw: Any) -> FaultScript:
        return self._add("corrupt", kinds, **kw)

    def attach(self, ctx: Any) -> FaultScript:
        """Act on every packet of ``ctx``'s fabric (an in-process, simulated or UDP device)."""
        from softverbs.fabric.runtime import Runtime

        runtime = ctx.runtime
        if not isinstance(runtime, Runtime):
            raise ValueError("a FaultScript acts where the device runs: on an in-process, "
                             "simulated or UDP device; on the host device use set_faults()")
        runtime.faults = self
        return self

    @property
    def done(self) -> bool:
        """Whether every step has acted on all its packets."""
        return all(s.seen >= s.nth + s.count - 1 for s in self.steps)

    def process(self, pkt: Packet, now: float) -> list[tuple[float, Packet]]:
        for step in self.steps:
            if not step.matches(pkt):
                continue
            step.seen += 1
            if not step.nth <= step.seen < step.nth + step.count:
                continue
            self.log.append((now, step.action, pkt.opcode, pkt.psn))
            copy = pkt.copy()
            copy.payload = bytes(pkt.payload)  # no alias of application memory
            if step.action == "drop":
                return []
            if step.action == "delay":
                return [(now + step.seconds, copy)]
            if step.action == "duplicate":
                return [(now, pkt), (now, copy)]
            copy.corrupt_bit = len(self.log)  # "corrupt": the receiver's ICRC check fails
            return [(now, copy)]
        return [(now, pkt)]


# --- a conformance helper -------------------------------------------------------------------


#: the queue depth of check_device's pairs
CHECK_DEPTH = 8


@dataclass
class CheckResult:
    """One behaviour checked against a device."""

    name: str
    ok: bool
    detail: str


def check_device(w: World) -> list[CheckResult]:
    """Run the queue behaviours of the seeds against ``w``'s devices (each on a fresh RC
    pair) and say, for each, whether the device shows it: the unsignaled-completion trap,
    completion order, flush on ERR in posting order, RNR retries exhausted, and
    remote-access errors."""
    results = []
    for name, check in _CHECKS:
        pair = connected_pair(w, IBV_QPT_RC, depth=CHECK_DEPTH, rnr_retry=1, min_rnr_timer=1,
                              timeout=12, retry_cnt=1)  # fmt: skip
        try:
            check(w, pair)
            results.append(CheckResult(name, True, "as a device must"))
        except Exception as exc:  # a report of the device, not a crash of the helper
            results.append(CheckResult(name, False, f"{type(exc).__name__}: {exc}"))
        finally:
            pair.close()
    return results


def _send(pair: Pair, wr_id: int, signaled: bool = True, length: int = 8) -> Any:
    from softverbs.enums import IBV_SEND_SIGNALED, IBV_WR_SEND
    from softverbs.verbs.wr import SendWR

    return SendWR(wr_id=wr_id, opcode=IBV_WR_SEND, num_sge=1, sg=[pair.a.sge(0, length)],
                  send_flags=IBV_SEND_SIGNALED if signaled else 0)  # fmt: skip


def _recv(ep: Endpoint, wr_id: int, offset: int = 1024) -> Any:
    from softverbs.verbs.wr import RecvWR

    return RecvWR(wr_id=wr_id, num_sge=1, sg=[ep.sge(offset, 64)])


def _check_unsignaled_trap(w: World, pair: Pair) -> None:
    """A send queue of unsignaled WRs fills up and stays full until a completion is polled."""
    import errno

    from softverbs.errors import PyverbsRDMAError

    depth, posted = CHECK_DEPTH, 0
    for i in range(depth):
        pair.b.qp.post_recv(_recv(pair.b, i))
    try:
        for i in range(depth + 1):
            pair.a.qp.post_send(_send(pair, i, signaled=False))
            posted += 1
    except PyverbsRDMAError as exc:
        assert exc.error_code == errno.ENOMEM, f"a full send queue gave {exc}"
    assert posted == depth, f"{posted} unsignaled WRs were accepted on a queue of {depth}"
    wait_completions(w, pair.b.cq, depth, what="the receiver")


def _check_order(w: World, pair: Pair) -> None:
    """Completions come in posting order, each with its wr_id."""
    for i in range(4):
        pair.b.qp.post_recv(_recv(pair.b, 100 + i))
    for i in range(4):
        pair.a.qp.post_send(_send(pair, i))
    sent = wait_completions(w, pair.a.cq, 4, what="the sender")
    assert [wc.wr_id for wc in sent] == [0, 1, 2, 3], _describe(sent)
    got = wait_completions(w, pair.b.cq, 4, what="the receiver")
    assert [wc.wr_id for wc in got] == [100, 101, 102, 103], _describe(got)


def _check_flush(w: World, pair: Pair) -> None:
    """Moving a QP to ERR flushes its posted receives, in posting order, WR_FLUSH_ERR."""
    from softverbs.enums import IBV_QP_STATE, IBV_QPS_ERR, IBV_WC_WR_FLUSH_ERR
    from softverbs.verbs.qp import QPAttr

    for i in range(3):
        pair.b.qp.post_recv(_recv(pair.b, 200 + i))
    attr = QPAttr()
    attr.qp_state = IBV_QPS_ERR
    pair.b.qp.modify(attr, IBV_QP_STATE)
    got = wait_completions(w, pair.b.cq, 3, status=IBV_WC_WR_FLUSH_ERR, what="the flush")
    assert [wc.wr_id for wc in got] == [200, 201, 202], _describe(got)


def _check_rnr(w: World, pair: Pair) -> None:
    """A SEND with no receive posted is retried, then fails RNR_RETRY_EXC_ERR."""
    from softverbs.enums import IBV_WC_RNR_RETRY_EXC_ERR

    pair.a.qp.post_send(_send(pair, 7))
    wait_completions(w, pair.a.cq, 1, status=IBV_WC_RNR_RETRY_EXC_ERR, timeout=30,
                     what="the RNR-retried SEND")  # fmt: skip


def _check_remote_access(w: World, pair: Pair) -> None:
    """An RDMA WRITE with a wrong rkey fails REM_ACCESS_ERR."""
    from softverbs.enums import IBV_WC_REM_ACCESS_ERR, IBV_WR_RDMA_WRITE
    from softverbs.verbs.wr import SendWR

    wr = SendWR(wr_id=9, opcode=IBV_WR_RDMA_WRITE, num_sge=1, sg=[pair.a.sge(0, 8)])
    wr.set_wr_rdma(pair.b.mr.rkey ^ 0xFF, pair.b.mr.buf)
    pair.a.qp.post_send(wr)
    wait_completions(w, pair.a.cq, 1, status=IBV_WC_REM_ACCESS_ERR, what="the bad WRITE")


_CHECKS: list[tuple[str, Callable[[World, Pair], None]]] = [
    ("unsignaled-trap", _check_unsignaled_trap),
    ("completion-order", _check_order),
    ("flush-in-order", _check_flush),
    ("rnr-retry-exceeded", _check_rnr),
    ("remote-access-error", _check_remote_access),
]
