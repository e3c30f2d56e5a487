"""The application side of the device service.

With ``SOFTVERBS_SERVICE`` set, device names resolve to devices served by
``softverbsd`` (started on demand).  A :class:`ServiceProvider` plays the
provider role of :mod:`softverbs.verbs.provider`: the verbs objects are the
same as in embedded mode, but what they are handed back is

* shared-memory rings (:mod:`softverbs.service.shm`) for send, receive and
  shared receive queues and CQs -- posting writes WQEs into them and polling
  reads CQEs from them without a system call;
* :class:`RemoteQP`, :class:`RemoteKey`, :class:`RemoteDomain` proxies whose
  operations are requests to the service;
* memory regions allocated in memfds the service maps
  (:meth:`ServiceProvider.alloc_memory`).  Memory the service cannot map --
  an arbitrary buffer or address of this process -- cannot be registered
  with a served device: EOPNOTSUPP says so.

A doorbell is a one-way message.  Async and completion events arrive as
messages, drained whenever the application calls into softverbs and waited
for by the blocking calls.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from softverbs.engine.memory import MemKind
from softverbs.engine.queues import Route
from softverbs.enums import IBV_QPS_RESET
from softverbs.errors import PyverbsRDMAError, eopnotsupp
from softverbs.fabric.runtime import Clock, MonotonicClock
from softverbs.service import protocol
from softverbs.service.shm import (
    WQ_RQ,
    WQ_SQ,
    WQ_SRQ,
    SharedRegion,
    ShmCompletionQueue,
    ShmSharedRQ,
    ShmWorkQueue,
    _Ring,
    recv_slot_size,
    send_slot_size,
)
from softverbs.verbs.memory import Memory, address_of
from softverbs.verbs.registry import DeviceSpec, SoftDevice

START_TIMEOUT = 10.0


class Connection:
    """One socket to the service, shared by every served device of this process."""

    def __init__(self, path: str, spawn: bool = True) -> None:
        self.path = path
        self.sock = self._connect(path, spawn)
        self.lock = threading.RLock()
        self._next_id = 1
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        hello = self.call("hello", version=protocol.PROTOCOL_VERSION)
        self.devices: list[dict[str, Any]] = hello["devices"]
        self.service_pid: int = hello["pid"]

    @staticmethod
    def _connect(path: str, spawn: bool = True) -> socket.socket:
        """Connect, starting the service on demand (unless ``spawn`` is False)."""
        deadline = time.monotonic() + START_TIMEOUT
        started = False
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.connect(path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if not spawn:
                    raise PyverbsRDMAError(f"no softverbs device service is listening on {path}",
                                           errno.ECONNREFUSED) from None  # fmt: skip
                if not started:
                    _spawn_service(path)
                    started = True
                if time.monotonic() > deadline:
                    raise PyverbsRDMAError(
                        f"cannot reach the softverbs device service at {path}; start it "
                        "with 'softverbs service start'",
                        errno.ECONNREFUSED,
                    ) from None
                time.sleep(0.05)

    def call(self, op: str, fds: list[int] | None = None, **kw: Any) -> dict[str, Any]:
        """A request and its reply; errors become PyverbsRDMAError with the errno."""
        with self.lock:
            rid = self._next_id
            self._next_id += 1
            kw.update(op=op, id=rid)
            try:
                protocol.send(self.sock, kw, fds)
                while True:
                    msg, got = protocol.recv(self.sock)
                    for fd in got:
                        os.close(fd)
                    if msg.get("id") == rid:
                        break
                    self.dispatch(msg)
            except (OSError, EOFError) as exc:
                raise PyverbsRDMAError(f"lost the softverbs device service: {exc}",
                                       errno.ECONNRESET) from None  # fmt: skip
        if "errno" in msg:
            raise PyverbsRDMAError(str(msg.get("error", op)), int(msg["errno"]))
        return msg

    def post(self, op: str, **kw: Any) -> None:
        """A one-way message (a doorbell)."""
        kw.update(op=op)
        with self.lock:
            try:
                protocol.send(self.sock, kw)
            except OSError as exc:
                raise PyverbsRDMAError(f"lost the softverbs device service: {exc}",
                                       errno.ECONNRESET) from None  # fmt: skip

    def dispatch(self, msg: dict[str, Any]) -> None:
        for key, handler in self.handlers.items():
            if key in msg:
                handler(msg)
                return

    def drain(self) -> bool:
        """Handle every message already waiting; True if there was one."""
        got = False
        with self.lock:
            while True:
                try:
                    msg, fds = protocol.recv_nowait(self.sock)
                except BlockingIOError:
                    return got
                except (OSError, EOFError):
                    return got
                for fd in fds:
                    os.close(fd)
                got = True
                self.dispatch(msg)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def abandon(self) -> None:
        """In a forked child: let go of the parent's socket without a word.

        The child closes only its copy of the descriptor (the parent's stays
        connected); any later use of this connection fails as a lost service.
        """
        self.lock = threading.RLock()
        with contextlib.suppress(OSError):
            os.close(self.sock.detach())


def _spawn_service(path: str) -> None:
    """Start ``softverbsd`` in the background (on-demand start)."""
    protocol.ensure_socket_dir(path)
    subprocess.Popen(
        [sys.executable, "-m", "softverbs.service.server", "--socket", path],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )  # fmt: skip


class ClientRuntime:
    """The runtime of served devices: a lock, and waiting for service messages."""

    virtual = False

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.clock: Clock = MonotonicClock()
        self.faults = None
        self.generation = 0

    def progress(self) -> bool:
        with self.lock:
            got = self.conn.drain()
            if got:
                self.cond.notify_all()
            return got

    def idle_step(self) -> bool:
        return False

    def next_deadline(self) -> float | None:
        return None

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.conn.sock, selectors.EVENT_READ)
        try:
            while True:
                with self.lock:
                    self.progress()
                    if ready():
                        return True
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                sel.select(left if left is None else min(left, 1.0))
        finally:
            sel.close()

    def add_tap(self, *args: Any) -> None:
        raise eopnotsupp("packet capture of a served device is done by the service")


class RemoteKey:
    """An MR or MW held by the service; ``key`` is its current lkey/rkey."""

    def __init__(self, conn: Connection, number: int, key: int, kind: str) -> None:
        self.conn = conn
        self.number = number
        self.kind = kind
        self._key = key

    @property
    def key(self) -> int:
        if self.kind == "mw":  # a bind in the service changes a window's key
            self._key = int(self.conn.call("query_key", obj=self.number, kind="mw")["key"])
        return self._key


class RemoteDomain:
    """An XRC domain held by the service."""

    def __init__(self, number: int) -> None:
        self.number = number


class RemoteQP:
    """A QP whose engine runs in the service (the engine interface verbs uses)."""

    def __init__(self, conn: Connection, number: int, qpn: int, qp_type: int,
                 sq: ShmWorkQueue | None, rq: ShmWorkQueue | None, state: int) -> None:  # fmt: skip
        self.conn = conn
        self.number = number
        self.qpn = qpn
        self.qp_type = qp_type
        self.sq = sq
        self.rq = rq
        self._state = state
        self.last_error = ""
        self._pending: dict[str, Any] = {}

    @property
    def state(self) -> int:
        """The QP's state as the device last published it in the send ring
        (it moves QPs to ERR by itself); a QP without one asks."""
        if self.sq is not None:
            published = self.sq.published_state()
            if published is not None:
                return published
            return self._state
        reply = self.conn.call("query_qp", qp=self.number)
        self._state = int(reply["state"])
        return self._state

    @state.setter
    def state(self, value: int) -> None:
        self._state = value

    def set_attrs(self, values: dict[str, Any]) -> None:
        self._pending.update(values)

    def set_state(self, new: int, now: float) -> None:
        attrs = {k: _encode(v) for k, v in self._pending.items()}
        self._pending.clear()
        reply = self.conn.call("modify_qp", qp=self.number, attrs=attrs, state=new)
        self.state = int(reply["state"])
        if new == IBV_QPS_RESET:
            for ring in (self.sq, self.rq):
                if ring is not None:
                    ring.ci = 0

    def doorbell(self, now: float) -> None:
        self.conn.post("db_sq", qp=self.number)

    def rq_doorbell(self, now: float) -> None:
        self.conn.post("db_rq", qp=self.number)

    def sq_draining(self) -> bool:
        reply = self.conn.call("query_qp", qp=self.number)
        self._state = int(reply["state"])
        self.last_error = str(reply["last_error"])
        return bool(reply["draining"])


def _encode(value: Any) -> Any:
    if isinstance(value, Route):
        return {"dgid": value.dgid.hex(), "sgid": value.sgid.hex(),
                "sgid_index": value.sgid_index, "hop_limit": value.hop_limit,
                "tclass": value.tclass, "flow_label": value.flow_label,
                "port": value.port}  # fmt: skip
    return value


class _Event:
    """What the verbs event sink expects: the object and why.

    An event of a device-owned XRC receive QP that this process holds by
    registration (not through a QP object) has no owner here; it carries the
    QP number instead (``qpn``, ``qp_num``).
    """

    def __init__(self, owner: Any, reason: str, qpn: int = 0) -> None:
        self.owner = owner
        self.last_error = reason
        self.qpn = self.qp_num = qpn


class ServiceProvider:
    """A provider whose device runs in ``softverbsd``."""

    def __init__(self, conn: Connection, runtime: ClientRuntime, dev: str,
                 gids: list[bytes]) -> None:  # fmt: skip
        self.conn = conn
        self.runtime = runtime
        self.dev = dev
        self.gids = gids
        self.process = object()
        self._pds: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._owners: dict[tuple[str, int], Any] = {}
        self._cqs: dict[int, ShmCompletionQueue] = {}
        self._rings: dict[tuple[int, int], Any] = {}
        self._sink: Callable[[int, Any], None] | None = None
        conn.handlers.setdefault("event", self._on_event)
        conn.handlers.setdefault("cq_event", self._on_cq_event)
        _PROVIDERS.add(self)

    # --- events ------------------------------------------------------------------
    def set_event_sink(self, sink: Callable[[int, Any], None]) -> None:
        self._sink = sink

    @staticmethod
    def _on_event(msg: dict[str, Any]) -> None:
        if msg.get("kind") == "xrc_qp":
            for prov in list(_PROVIDERS):
                if prov.dev == msg.get("dev") and prov._sink is not None:
                    event = _Event(None, str(msg.get("reason", "")), int(msg.get("qpn", 0)))
                    prov._sink(int(msg["event"]), event)
                    return
            return
        for prov in list(_PROVIDERS):
            owner = prov._owners.get((msg.get("kind", ""), msg.get("obj", -1)))
            if owner is not None and prov._sink is not None:
                prov._sink(int(msg["event"]), _Event(owner, str(msg.get("reason", ""))))
                return

    @staticmethod
    def _on_cq_event(msg: dict[str, Any]) -> None:
        for prov in list(_PROVIDERS):
            ring = prov._cqs.get(msg["cq_event"])
            if ring is not None and ring.notify is not None:
                ring.notify()
                return

    # --- protection domains --------------------------------------------------------
    def alloc_pd(self, pd: Any) -> None:
        self._pds[pd] = int(self.conn.call("alloc_pd", dev=self.dev)["obj"])

    def dealloc_pd(self, pd: Any) -> None:
        number = self._pds.pop(pd, None)
        if number is not None:
            self.conn.call("destroy", obj=number, kind="pd")

    def _pd(self, pd: Any) -> int | None:
        return None if pd is None else self._pds[pd]

    # --- memory ---------------------------------------------------------------------
    def alloc_memory(self, length: int) -> Memory:
        """Zeroed memory in a memfd the service maps too."""
        region = SharedRegion(length, name="softverbs-mr")
        view = region.view[:length]
        return Memory(view, address_of(view), region)

    def reg_mr(self, pd: Any, mem: Memory, access: int, owner: Any) -> RemoteKey:
        region = mem.keepalive
        if not isinstance(region, SharedRegion):
            raise eopnotsupp(
                "a device served by softverbsd can register only memory it can map: use "
                "MR(pd, length, access), not a buffer or an address of this process"
            )
        reply = self.conn.call("reg_mr", fds=[region.fd], pd=self._pd(pd), length=len(mem.view),
                               addr=mem.addr, access=access)  # fmt: skip
        return RemoteKey(self.conn, int(reply["obj"]), int(reply["key"]), "mr")

    def update_mr(self, key: Any, mem: Memory | None, access: int | None, pd: Any) -> None:
        if mem is not None:
            raise eopnotsupp("rereg with a new translation is not supported on a served device")
        self.conn.call("update_mr", mr=key.number, access=access, pd=self._pd(pd))

    def dereg_mr(self, key: Any) -> None:
        self.conn.call("destroy", obj=key.number, kind="mr")

    def alloc_mw(self, pd: Any, kind: MemKind, owner: Any) -> RemoteKey:
        reply = self.conn.call("alloc_mw", pd=self._pd(pd), kind=int(kind))
        return RemoteKey(self.conn, int(reply["obj"]), int(reply["key"]), "mw")

    def dealloc_mw(self, key: Any) -> None:
        self.conn.call("destroy", obj=key.number, kind="mw")

    def reg_mr_implicit(self, *args: Any) -> Any:
        raise eopnotsupp("implicit (on-demand paging) MRs are not supported on a device "
                         "served by softverbsd")  # fmt: skip

    def dm_pool(self) -> Any:
        raise eopnotsupp("device memory (ibv_alloc_dm) is not supported on a device served "
                         "by softverbsd")  # fmt: skip

    # --- CQs and SRQs ------------------------------------------------------------------
    def _wq_of(self, kind: int, number: int) -> Any:
        return self._rings.get((kind, number))

    def create_cq(self, capacity: int, owner: Any) -> ShmCompletionQueue:
        region = SharedRegion(_Ring.region_size(capacity, 128), name="softverbs-cq")
        ring = ShmCompletionQueue(region, capacity, self._wq_of)
        reply = self.conn.call("create_cq", fds=[region.fd], dev=self.dev, capacity=capacity)
        ring.number = int(reply["obj"])  # type: ignore[attr-defined]
        ring.owner = owner
        self._cqs[ring.number] = ring  # type: ignore[attr-defined]
        self._owners[("cq", ring.number)] = owner  # type: ignore[attr-defined]
        return ring

    def destroy_cq(self, ring: Any) -> None:
        self._cqs.pop(ring.number, None)
        self.conn.call("destroy", obj=ring.number, kind="cq")
        ring.region.close()

    def create_srq(self, max_wr: int, max_sge: int, limit: int, pd: Any, xrcd: Any,
                   cq: Any, owner: Any) -> ShmSharedRQ:  # fmt: skip
        slot = recv_slot_size(max_sge)
        region = SharedRegion(_Ring.region_size(max_wr, slot), name="softverbs-srq")
        ring = ShmSharedRQ(region, max_wr, slot, max_sge)
        reply = self.conn.call(
            "create_srq", fds=[region.fd], pd=self._pd(pd), max_wr=max_wr, max_sge=max_sge,
            limit=limit, xrcd=xrcd.number if xrcd is not None else None,
            cq=cq.number if cq is not None else None,
        )  # fmt: skip
        ring.number = int(reply["obj"])  # type: ignore[attr-defined]
        ring.srqn = int(reply["srqn"])
        ring.owner = owner
        number = ring.number  # type: ignore[attr-defined]
        ring.on_modify = lambda limit: self._modify_srq(number, limit)
        self._rings[(WQ_SRQ, ring.number)] = ring  # type: ignore[attr-defined]
        self._owners[("srq", ring.number)] = owner  # type: ignore[attr-defined]
        return ring

    def _modify_srq(self, number: int, limit: int) -> None:
        self.conn.call("modify_srq", srq=number, limit=limit)

    def destroy_srq(self, ring: Any) -> None:
        self.conn.call("destroy", obj=ring.number, kind="srq")
        ring.region.close()

    # --- QPs ------------------------------------------------------------------------------
    def create_qp(self, qp_type: int, pd: Any, send_cq: Any, recv_cq: Any, srq: Any, xrcd: Any,
                  sq_size: int | None, rq_size: int | None, sq_sig_all: bool, pmtu: int,
                  owner: Any, rings: Any = None,
                  caps: tuple[int, int, int] = (1, 0, 1)) -> RemoteQP:  # fmt: skip
        max_send_sge, max_inline, max_recv_sge = caps
        fds: list[int] = []
        specs: dict[str, Any] = {}
        sq = rq = None
        if sq_size is not None:
            slot = send_slot_size(max_send_sge, max_inline)
            region = SharedRegion(_Ring.region_size(sq_size, slot), name="softverbs-sq")
            sq = ShmWorkQueue(region, sq_size, slot, True, handles=_number_of)
            fds.append(region.fd)
            specs["sq"] = {"size": sq_size, "slot": slot}
        if rq_size is not None:
            slot = recv_slot_size(max_recv_sge)
            region = SharedRegion(_Ring.region_size(rq_size, slot), name="softverbs-rq")
            rq = ShmWorkQueue(region, rq_size, slot, False)
            fds.append(region.fd)
            specs["rq"] = {"size": rq_size, "slot": slot}
        reply = self.conn.call(
            "create_qp", fds=fds, dev=self.dev, qp_type=qp_type, pd=self._pd(pd),
            scq=getattr(send_cq, "number", None), rcq=getattr(recv_cq, "number", None),
            srq=getattr(srq, "number", None), xrcd=getattr(xrcd, "number", None),
            sq_sig_all=sq_sig_all, pmtu=pmtu, **specs,
        )  # fmt: skip
        number = int(reply["obj"])
        qp = RemoteQP(self.conn, number, int(reply["qpn"]), qp_type, sq, rq, IBV_QPS_RESET)
        if sq is not None:
            self._rings[(WQ_SQ, number)] = sq
        if rq is not None:
            self._rings[(WQ_RQ, number)] = rq
        self._owners[("qp", number)] = owner
        return qp

    def destroy_qp(self, eng: Any) -> None:
        self.conn.call("destroy", obj=eng.number, kind="qp")
        for ring in (eng.sq, eng.rq):
            if ring is not None:
                ring.region.close()

    # --- XRC ---------------------------------------------------------------------------------
    def open_xrcd(self, fd: int, oflags: int) -> RemoteDomain:
        reply = self.conn.call("open_xrcd", fds=[fd] if fd != -1 else None, dev=self.dev,
                               oflags=oflags)  # fmt: skip
        return RemoteDomain(int(reply["obj"]))

    def close_xrcd(self, domain: Any) -> None:
        self.conn.call("destroy", obj=domain.number, kind="xrcd")

    def xrc_hold(self, eng: Any, holder: object) -> None:
        """The service already holds the QP for the handle that created or opened it."""

    def xrc_release(self, eng: Any, holder: object) -> bool:
        self.destroy_qp(eng)
        return False

    def xrc_rcv_qp_alloc(self, domain: Any, steps: list[tuple[int, dict[str, Any]]],
                         holder: object) -> int:  # fmt: skip
        encoded = [(s, {k: _encode(v) for k, v in a.items()}) for s, a in steps]
        return int(self.conn.call("xrc_alloc", xrcd=domain.number, steps=encoded)["qpn"])

    def xrc_register(self, domain: Any, qpn: int) -> None:
        self.conn.call("xrc_register", xrcd=domain.number, qpn=qpn)

    def xrc_unregister(self, domain: Any, qpn: int) -> None:
        self.conn.call("xrc_unregister", xrcd=domain.number, qpn=qpn)

    def open_xrc_qp(self, domain: Any, qpn: int, holder: object) -> RemoteQP:
        reply = self.conn.call("open_qp", xrcd=domain.number, qpn=qpn)
        from softverbs.enums import IBV_QPT_XRC_RECV

        return RemoteQP(self.conn, int(reply["obj"]), int(reply["qpn"]), IBV_QPT_XRC_RECV,
                        None, None, int(reply["state"]))  # fmt: skip

    # --- device ------------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        return dict(self.conn.call("counters", dev=self.dev)["counters"])


def _number_of(key: Any) -> int:
    return int(getattr(key, "number", 0))


_PROVIDERS: weakref.WeakSet[ServiceProvider] = weakref.WeakSet()


class ServiceRegistry:
    """Device names resolve to the service's devices (see the module docstring)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or protocol.default_socket_path()
        self._conn: Connection | None = None
        self._runtime: ClientRuntime | None = None
        self.devices: dict[str, SoftDevice] = {}
        self._lock = threading.Lock()
        _REGISTRIES.add(self)

    def connection(self) -> Connection:
        if self._conn is None:
            self._conn = Connection(self.path)
            self._runtime = ClientRuntime(self._conn)
        return self._conn

    def specs(self) -> list[DeviceSpec]:
        return [DeviceSpec(d["name"], "service") for d in self.connection().devices]

    def open(self, name: str) -> SoftDevice:
        with self._lock:
            dev = self.devices.get(name)
            if dev is not None:
                return dev
            conn = self.connection()
            assert self._runtime is not None
            info = conn.call("open_device", name=name)
            gids = [bytes.fromhex(g) for g in info["gids"]]
            provider = ServiceProvider(conn, self._runtime, name, gids)
            spec = DeviceSpec(name, "service")
            dev = SoftDevice(spec, None, self._runtime, int(info["index"]), int(info["mtu"]),
                             provider)  # fmt: skip
            self.devices[name] = dev
            return dev

    def release(self, dev: SoftDevice) -> None:
        pass

    def shutdown(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_REGISTRIES: weakref.WeakSet[ServiceRegistry] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Fork safety: a child must not talk on its parent's connection -- the
    service would mix their requests, and replies would go to whichever process
    reads first.  The child forgets the parent's connection, devices and
    providers; it connects on its own at first use."""
    for reg in list(_REGISTRIES):
        conn, reg._conn, reg._runtime = reg._conn, None, None
        reg.devices = {}
        reg._lock = threading.Lock()
        if conn is not None:
            conn.abandon()
    _PROVIDERS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
