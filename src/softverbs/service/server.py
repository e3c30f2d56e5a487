"""``softverbsd``: the device service, an owner that outlives processes.

The service holds the devices' engines -- the same
:class:`~softverbs.verbs.provider.EmbeddedProvider` and
:class:`~softverbs.engine.qp.QPEngine` an application uses when it embeds a
device -- and applications attach to it over a Unix socket
(:mod:`softverbs.service.protocol`).  Their queues are rings in shared
memory (:mod:`softverbs.service.shm`), their memory regions are memfds the
service maps too, and a doorbell is a socket message.

Each connected process is a :class:`Client` with a table of the objects it
created, by number; it can name only its own objects.  When its socket
closes -- exit, crash, SIGKILL -- the service destroys everything in its
table in reverse order of creation and drops its registrations with XRC
receive QPs: no heartbeat is needed (seed 002, note 2).  XRC receive QPs
are the device's: they live until their last holder lets go.

Only processes of the service's own user may connect (``SO_PEERCRED``).
The first message must be ``hello``; a peer that sends something that is
not a softverbs message gets an error and is disconnected.  A request that
fails gets an error reply and the client stays connected; the service
itself never stops for a bad peer: an unexpected exception in a request or
in the engine is logged, answered with EIO where there is someone to
answer, and the loop goes on.

One service per socket path: the pidfile next to the socket
(``<socket>.pid``) holds the service's pid and an exclusive ``flock``
for as long as the service lives, so a second service -- started by hand
or on demand by two clients at once -- refuses to start instead of
stealing the socket.

The loop is single-threaded.  Replies and events are sent without
blocking; what a slow client has not read yet waits in a per-client queue
(bounded: a client that never reads is disconnected).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from softverbs.engine.memory import MemKey, MemKind
from softverbs.engine.qp import QPEngine
from softverbs.engine.queues import Route
from softverbs.enums import IBV_QPS_ERR, IBV_QPT_XRC_RECV, IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR
from softverbs.errors import PyverbsError, PyverbsRDMAError, einval
from softverbs.service import protocol
from softverbs.service.shm import (
    WQ_NONE,
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
from softverbs.verbs.memory import Memory
from softverbs.verbs.registry import Registry, SoftDevice

log = logging.getLogger("softverbsd")

#: a protocol message (see :mod:`softverbs.service.protocol`)
Msg = dict[str, Any]

#: messages a client may leave unread before it is disconnected
MAX_BACKLOG = 4096
#: messages read from one client before the loop serves the others
READ_BATCH = 64
#: the largest ring slot a client may ask for (a send WQE with 32 SGEs and
#: 1 KiB of inline data fits easily)
MAX_SLOT = 1 << 16


class ServiceRunning(Exception):
    """Another softverbsd already serves this socket path."""

    def __init__(self, path: str, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"already running on {path} ({who})")
        self.pid = pid


def read_pid(pidfile: str) -> int | None:
    """The pid a pidfile names, or None."""
    try:
        with open(pidfile) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def claim_pidfile(pidfile: str, socket_path: str) -> int:
    """Lock ``pidfile`` for this process and write our pid; its fd.

    ServiceRunning if another live service holds it.  The lock goes with the
    process, so a service that was SIGKILLed leaves nothing that blocks the
    next one.
    """
    while True:
        fd = os.open(pidfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ServiceRunning(socket_path, read_pid(pidfile)) from None
        # A service that was stopping may have unlinked the file we opened.
        try:
            same = os.stat(pidfile).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd


class Obj:
    """One object a client created, by the number the client knows it by."""

    __slots__ = ("client", "dev", "kind", "number", "obj", "regions")

    def __repr__(self) -> str:
        return f"<{self.kind} {self.number} of pid {self.client.pid}>"

    def __init__(self, client: Client, number: int, kind: str, dev: SoftDevice, obj: Any,
                 regions: list[SharedRegion]) -> None:  # fmt: skip
        self.client = client
        self.number = number
        self.kind = kind
        self.dev = dev
        self.obj = obj
        self.regions = regions


class Client:
    """A connected process."""

    def __init__(self, sock: socket.socket, pid: int, uid: int,
                 want_write: Callable[[Client], None] | None = None) -> None:  # fmt: skip
        self.sock = sock
        self.pid = pid
        self.uid = uid
        self.objects: dict[int, Obj] = {}
        self.next = 1
        self.alive = True
        self.greeted = False
        self.kicked = False  #: disconnect once the error reply is out
        self.outq: deque[bytes] = deque()
        self._want_write = want_write
        self._send_lock = threading.Lock()

    def add(self, kind: str, dev: SoftDevice, obj: Any, regions: list[SharedRegion]) -> Obj:
        rec = Obj(self, self.next, kind, dev, obj, regions)
        self.objects[self.next] = rec
        self.next += 1
        return rec

    def get(self, number: Any, kind: str) -> Obj:
        rec = self.objects.get(number) if type(number) is int else None
        if rec is None or rec.kind != kind:
            raise einval(f"this process has no {kind} number {number!r}")
        return rec

    def send(self, msg: dict[str, Any]) -> None:
        """Send without blocking; what does not fit waits in :attr:`outq`."""
        if not self.alive:
            return
        data = protocol.encode(msg)
        with self._send_lock:
            if not self.outq:
                try:
                    self.sock.send(data)
                    return
                except BlockingIOError:
                    pass
                except OSError:
                    self.alive = False
                    return
            if len(self.outq) >= MAX_BACKLOG:
                log.warning("pid %d left %d messages unread: disconnecting it", self.pid,
                            len(self.outq))  # fmt: skip
                self.alive = False
                return
            self.outq.append(data)
        if self._want_write is not None:
            self._want_write(self)

    def flush(self) -> bool:
        """Send what waits; True when nothing is left."""
        with self._send_lock:
            while self.outq:
                try:
                    self.sock.send(self.outq[0])
                except BlockingIOError:
                    return False
                except OSError:
                    self.alive = False
                    self.outq.clear()
                    return True
                self.outq.popleft()
            return True

    def __repr__(self) -> str:
        return f"<Client pid={self.pid} objects={len(self.objects)}>"


class ServedQPEngine(QPEngine):
    """The engine of a QP served to an application: the same engine, which
    also publishes its state in the send ring's header, where the
    application's ``qp_state`` reads it (the device moves QPs to ERR by
    itself; the application must see that without a round trip)."""

    @property
    def state(self) -> int:
        return self._state

    @state.setter
    def state(self, value: int) -> None:
        self._state = value
        sq = self.__dict__.get("sq")
        if isinstance(sq, ShmWorkQueue):
            sq.publish_state(value)

    def push_cqe(self, cq: Any, cqe: Any) -> None:
        # An error completion of a reliable QP is followed by its move to ERR
        # (SEMANTICS 4); publish ERR first, so that an application that polls
        # the error CQE -- concurrently, in its own process -- then reads ERR.
        if self.reliable and cqe.status not in (IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR):
            sq = self.__dict__.get("sq")
            if isinstance(sq, ShmWorkQueue):
                sq.publish_state(IBV_QPS_ERR)
        super().push_cqe(cq, cqe)


def _route(d: Any) -> Route:
    if not isinstance(d, dict):
        raise einval("a route must be a JSON object")
    dgid, sgid = bytes.fromhex(d["dgid"]), bytes.fromhex(d["sgid"])
    if len(dgid) != 16 or len(sgid) != 16:
        raise einval("a route's GIDs must be 16 bytes")
    sgid_index, hop, tclass = _int(d, "sgid_index", 0, 255), _int(d, "hop_limit", 0, 255), \
        _int(d, "tclass", 0, 255)  # fmt: skip
    return Route(dgid, sgid, sgid_index, hop, tclass, _int(d, "flow_label", 0, 0xFFFFF),
                 _int(d, "port", 1, 1))  # fmt: skip


def decode_attrs(attrs: Any) -> dict[str, Any]:
    """Engine attribute values from their JSON form (routes are dicts).

    Only the names the verbs layer sends are accepted: a request must not be
    able to set arbitrary attributes of an engine object.
    """
    if not isinstance(attrs, dict):
        raise einval("QP attributes must be a JSON object")
    bad = set(attrs) - _QP_ATTRS
    if bad:
        raise einval(f"unknown QP attributes {sorted(bad)}")
    out = dict(attrs)
    for name, value in out.items():
        if name == "route":
            out[name] = _route(value)
        elif name == "en_sqd_async_notify":
            out[name] = bool(value)
        elif type(value) is not int or not 0 <= value <= 0xFFFFFFFF:
            raise einval(f"QP attribute {name}={value!r} is not a 32-bit unsigned integer")
    return out


#: the engine attributes modify_qp may set (see softverbs.verbs.qp.engine_values)
_QP_ATTRS = frozenset({
    "pkey_index", "pkey", "qkey", "access", "route", "pmtu", "dest_qpn", "rq_psn", "sq_psn",
    "timeout", "retry_cnt", "rnr_retry", "min_rnr_timer", "max_rd_atomic",
    "max_dest_rd_atomic", "en_sqd_async_notify",
})  # fmt: skip


def _int(msg: Msg, key: str, lo: int, hi: int) -> int:
    """``msg[key]``, an integer in [lo, hi], or EINVAL naming it."""
    value = msg.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise einval(f"{key}={value!r} is out of range {lo}..{hi}")
    return value


class Service:
    """The device service (see the module docstring)."""

    def __init__(self, path: str, registry: Registry | None = None,
                 pidfile: str | None = None) -> None:  # fmt: skip
        self.path = path
        self.pidfile = pidfile if pidfile is not None else path + ".pid"
        self.registry = registry or Registry()
        self.clients: dict[socket.socket, Client] = {}
        self.devices: dict[str, SoftDevice] = {}
        self.sel = selectors.DefaultSelector()
        self.stats: Counter[str] = Counter()
        self._stop = threading.Event()
        self._writers: set[Client] = set()
        self._writers_lock = threading.Lock()
        protocol.ensure_socket_dir(path, "--socket")
        self._pid_fd = claim_pidfile(self.pidfile, path)
        try:
            # We hold the lock: a socket file left here is a dead service's.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.listener.bind(path)
        except BaseException:
            self._release_pidfile()
            raise
        os.chmod(path, 0o600)
        self.listener.listen(128)
        self.listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    def _release_pidfile(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pidfile)
        with contextlib.suppress(OSError):
            os.close(self._pid_fd)

    # --- devices ---------------------------------------------------------------
    def device(self, name: Any) -> SoftDevice:
        if not isinstance(name, str):
            raise einval("a device name must be a string")
        dev = self.devices.get(name)
        if dev is None:
            dev = self.registry.open(name)
            dev.provider.set_event_sink(
                lambda event_type, element: self._event_sink(name, event_type, element)
            )
            self.devices[name] = dev
        return dev

    def _event_sink(self, dev: str, event_type: int, element: Any) -> None:
        owner = getattr(element, "owner", None)
        reason = getattr(element, "last_error", "") or ""
        if isinstance(owner, Obj):
            owner.client.send({"event": event_type, "kind": owner.kind, "obj": owner.number,
                               "reason": reason})  # fmt: skip
            return
        if isinstance(element, QPEngine):
            # A device-owned XRC receive QP: tell every process holding it,
            # once -- by its handle if it opened one, else by QP number.
            refs = element.hca.xrc_refs.get(element.qpn, set())  # type: ignore[attr-defined]
            told: set[Client] = set()
            for holder in sorted(refs, key=lambda h: not isinstance(h, Obj)):
                if isinstance(holder, Obj) and holder.client not in told:
                    told.add(holder.client)
                    holder.client.send({"event": event_type, "kind": "qp",
                                        "obj": holder.number, "reason": reason})  # fmt: skip
                elif isinstance(holder, Client) and holder not in told:
                    told.add(holder)
                    holder.send({"event": event_type, "kind": "xrc_qp", "dev": dev,
                                 "qpn": element.qpn, "reason": reason})  # fmt: skip

    # --- the loop ------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                self._turn()
        finally:
            self._shutdown()

    def _turn(self) -> None:
        """One pass of the loop: wait, serve what is ready, run the engines."""
        timeout = 1.0
        for dev in list(self.devices.values()):
            with dev.runtime.lock:
                nxt = dev.runtime.next_deadline()
                if nxt is not None:
                    timeout = min(timeout, max(0.0, nxt - dev.runtime.clock.now()))
        self._register_writers()
        for key, mask in self.sel.select(timeout):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            else:
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if mask & selectors.EVENT_WRITE:
                    self._write(sock)
                if mask & selectors.EVENT_READ:
                    self._read(sock)
        for dev in list(self.devices.values()):
            with dev.runtime.lock:
                try:
                    dev.runtime.progress()
                except Exception:  # the engine must not take the service down
                    self.stats["engine_errors"] += 1
                    log.exception("engine progress on %s", dev.name)
        for client in [c for c in self.clients.values() if not c.alive]:
            self.drop(client)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _want_write(self, client: Client) -> None:
        with self._writers_lock:
            self._writers.add(client)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _register_writers(self) -> None:
        with self._writers_lock:
            writers, self._writers = self._writers, set()
        for client in writers:
            if client.alive and self.clients.get(client.sock) is client:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self.sel.modify(client.sock, selectors.EVENT_READ | selectors.EVENT_WRITE,
                                    "client")  # fmt: skip

    def _write(self, sock: socket.socket) -> None:
        client = self.clients.get(sock)
        if client is None:
            return
        if client.flush() and client.alive:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.sel.modify(sock, selectors.EVENT_READ, "client")

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:  # nothing waiting, or out of file descriptors
            return
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid() and uid != 0:
            with contextlib.suppress(OSError):
                protocol.send(sock, {"id": 0, "errno": errno.EPERM,
                                     "error": "softverbsd serves only its own user"})  # fmt: skip
            sock.close()
            self.stats["clients_refused"] += 1
            return
        sock.setblocking(False)
        client = Client(sock, pid, uid, self._want_write)
        self.clients[sock] = client
        self.sel.register(sock, selectors.EVENT_READ, "client")
        self.stats["clients_connected"] += 1

    def _read(self, sock: socket.socket) -> None:
        client = self.clients.get(sock)
        if client is None:
            return
        for _ in range(READ_BATCH):
            try:
                msg, fds = protocol.recv(sock)
            except BlockingIOError:
                return
            except (EOFError, OSError):
                self.drop(client)
                return
            except protocol.ProtocolError as exc:
                self.stats["protocol_errors"] += 1
                client.send({"id": 0, "errno": errno.EPROTO,
                             "error": f"not a softverbs client: {exc}"})  # fmt: skip
                client.flush()
                self.drop(client)
                return
            self.handle(client, msg, fds)
            if not client.alive:
                client.flush()  # the error that explains the disconnect, if it fits
                self.drop(client)
                return

    # --- requests ----------------------------------------------------------------
    def handle(self, client: Client, msg: Msg, fds: list[int]) -> None:
        """Serve one request; every failure becomes an error reply."""
        op = msg.get("op")
        rid = msg.get("id", 0)
        reply = self._dispatch(client, op, msg, fds)
        if reply is not None:
            reply["id"] = rid
            client.send(reply)
        if client.kicked:
            client.alive = False

    def _dispatch(self, client: Client, op: Any, msg: Msg, fds: list[int]) -> Msg | None:
        """The reply to one request (None for a doorbell).  File descriptors
        the handler did not take are closed before the reply goes out."""
        handler: Callable[[Client, dict[str, Any], list[int]], dict[str, Any] | None] | None
        handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        try:
            if handler is None:
                raise protocol.ProtocolError(f"unknown request {op!r}")
            if not client.greeted and op != "hello":
                raise protocol.ProtocolError(f"{op!r} before 'hello'")
            result = handler(client, msg, fds)
            fds = []  # the handler took ownership
            return result  # type: ignore[no-any-return]
        except PyverbsRDMAError as exc:
            code = exc.error_code if exc.error_code > 0 else errno.EINVAL
            return {"errno": code, "error": _bare(str(exc))}
        except PyverbsError as exc:
            return {"errno": errno.EINVAL, "error": _bare(str(exc))}
        except protocol.ProtocolError as exc:
            self.stats["protocol_errors"] += 1
            client.kicked = True  # after this reply
            return {"errno": errno.EPROTO, "error": f"not a softverbs client: {exc}"}
        except (KeyError, TypeError, ValueError, OverflowError, IndexError) as exc:
            return {"errno": errno.EINVAL, "error": f"bad {op} request: {exc!r}"}
        except OSError as exc:
            return {"errno": exc.errno or errno.EIO, "error": f"{op}: {exc}"}
        except Exception as exc:  # a bug: log it, answer, keep serving
            self.stats["internal_errors"] += 1
            log.exception("request %r of pid %d", op, client.pid)
            return {"errno": errno.EIO,
                    "error": f"internal error in softverbsd serving {op}: {exc!r}"}  # fmt: skip
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def op_hello(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        if msg.get("version") != protocol.PROTOCOL_VERSION:
            raise protocol.ProtocolError(
                f"protocol version {msg.get('version')!r}; this service speaks "
                f"{protocol.PROTOCOL_VERSION}"
            )
        client.greeted = True
        specs = self.registry.specs()
        return {"devices": [{"name": s.name, "guid": s.guid} for s in specs],
                "pid": os.getpid()}  # fmt: skip

    def op_open_device(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["name"])
        return {"gids": [g.hex() for g in dev.provider.gids], "mtu": dev.mtu,
                "guid": dev.guid, "index": dev.index}  # fmt: skip

    def op_cm(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        """An RDMA CM command for the devices' CM agent (:mod:`softverbs.cm.service`)."""
        from softverbs.cm import service as cm

        return cm.handle(self, client, msg)

    def op_counters(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        return {"counters": self.device(msg["dev"]).provider.counters()}

    def op_stats(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        """Live objects, for tests and ``softverbs service status``.

        The asking connection is left out: ``clients`` counts the others.
        """
        live: Counter[str] = Counter()
        procs = []
        for c in self.clients.values():
            if c is client:
                continue
            mine = Counter(rec.kind for rec in c.objects.values())
            live.update(mine)
            procs.append({"pid": c.pid, "objects": dict(mine)})
        hcas = [d.hca for d in self.devices.values() if d.hca is not None]
        xrc = {f"{qpn:#x}": len(refs) for h in hcas for qpn, refs in h.xrc_refs.items()}
        qps = sum(len(h.qps) for h in hcas)
        keys = sum(len(h.keys) for h in hcas)
        srqs = sum(len(h.srqs) for h in hcas)
        xrcds = sum(len(h.xrcds) for h in hcas)
        return {"clients": len(procs), "processes": procs, "objects": dict(live),
                "xrc_qps": len(xrc), "xrc_holders": xrc, "engine_qps": qps, "keys": keys,
                "xrc_srqs": srqs, "xrcds": xrcds, "devices": sorted(self.devices),
                "pid": os.getpid(), "stats": dict(self.stats)}  # fmt: skip

    # protection domains: a token the engine compares by identity
    def op_alloc_pd(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["dev"])
        return {"obj": client.add("pd", dev, object(), []).number}

    # memory
    @staticmethod
    def _region(fds: list[int], size: int) -> SharedRegion:
        """The one shared-memory fd a request announced, mapped (``size`` bytes)."""
        if len(fds) != 1:
            raise einval(f"expected one shared-memory file descriptor, got {len(fds)}")
        return _map(fds.pop(), size)

    def op_reg_mr(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        pd = client.get(msg["pd"], "pd")
        length = _int(msg, "length", 0, 1 << 40)
        addr = _int(msg, "addr", 0, (1 << 64) - 1)
        access = _int(msg, "access", 0, 0xFFFFFFFF)
        region = self._region(fds, length)
        mem = Memory(region.view[:length], addr, region)
        try:
            key = pd.dev.provider.reg_mr(pd.obj, mem, access, None)
        except Exception:
            region.close()
            raise
        rec = client.add("mr", pd.dev, key, [region])
        key.owner = rec
        return {"obj": rec.number, "key": key.key}

    def op_update_mr(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        mr = client.get(msg["mr"], "mr")
        pd = client.get(msg["pd"], "pd").obj if msg.get("pd") is not None else None
        access = _int(msg, "access", 0, 0xFFFFFFFF) if msg.get("access") is not None else None
        mr.dev.provider.update_mr(mr.obj, None, access, pd)
        return {}

    def op_alloc_mw(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        pd = client.get(msg["pd"], "pd")
        kind = MemKind(msg["kind"])
        if kind == MemKind.MR:
            raise einval("alloc_mw: kind must be a memory window type")
        key = pd.dev.provider.alloc_mw(pd.obj, kind, None)
        rec = client.add("mw", pd.dev, key, [])
        key.owner = rec
        return {"obj": rec.number, "key": key.key}

    def op_query_key(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        kind = msg.get("kind", "mw")
        if kind not in ("mr", "mw"):
            raise einval(f"query_key: kind {kind!r} has no key")
        rec = client.get(msg["obj"], kind)
        return {"key": rec.obj.key}

    # completion queues and SRQs
    def op_create_cq(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        from softverbs.verbs.device import LIMITS

        dev = self.device(msg["dev"])
        size = _int(msg, "capacity", 1, LIMITS["max_cqe"])
        region = self._region(fds, _Ring.region_size(size, 128))
        ring = ShmCompletionQueue(region, size, device=True)
        rec = client.add("cq", dev, ring, [region])
        ring.owner = rec
        ring.wq_ids = self._wq_ids
        ring.notify = lambda: client.send({"cq_event": rec.number})
        return {"obj": rec.number}

    def op_create_srq(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        from softverbs.verbs.device import LIMITS

        pd = client.get(msg["pd"], "pd")
        max_wr = _int(msg, "max_wr", 1, LIMITS["max_srq_wr"])
        max_sge = _int(msg, "max_sge", 0, LIMITS["max_srq_sge"])
        limit = _int(msg, "limit", 0, max_wr)
        xrcd = client.get(msg["xrcd"], "xrcd") if msg.get("xrcd") else None
        cq = client.get(msg["cq"], "cq") if msg.get("cq") else None
        for parent in (xrcd, cq):
            if parent is not None and parent.dev is not pd.dev:
                raise einval(f"the SRQ's {parent.kind} is on another device than its PD")
        slot = recv_slot_size(max_sge)
        region = self._region(fds, _Ring.region_size(max_wr, slot))
        ring = ShmSharedRQ(region, max_wr, slot, max_sge, device=True)
        rec = client.add("srq", pd.dev, ring, [region])
        ring.tag = (WQ_SRQ, rec.number)
        pd.dev.provider.create_srq(max_wr, max_sge, limit, pd.obj,
                                   xrcd.obj if xrcd else None, cq.obj if cq else None,
                                   rec, ring)  # fmt: skip
        return {"obj": rec.number, "srqn": ring.srqn}

    def op_modify_srq(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        srq = client.get(msg["srq"], "srq")
        limit = _int(msg, "limit", 0, srq.obj.max_wr)
        with srq.dev.runtime.lock:
            srq.obj.modify(None, limit)
        return {}

    # XRC domains
    def op_open_xrcd(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["dev"])
        oflags = _int(msg, "oflags", 0, 0xFFFFFFFF)
        if len(fds) > 1:
            raise einval(f"open_xrcd takes at most one file descriptor, got {len(fds)}")
        fd = fds.pop() if fds else -1
        try:
            domain = dev.provider.open_xrcd(fd, oflags)
        finally:
            if fd != -1:
                os.close(fd)
        return {"obj": client.add("xrcd", dev, domain, []).number}

    # queue pairs
    def op_create_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        from softverbs.verbs.device import LIMITS

        dev = self.device(msg["dev"])
        qp_type = _int(msg, "qp_type", 0, 0xFF)
        pmtu = _int(msg, "pmtu", 256, 4096)
        parents = {}
        for name, kind in (("pd", "pd"), ("scq", "cq"), ("rcq", "cq"), ("srq", "srq"),
                           ("xrcd", "xrcd")):  # fmt: skip
            rec = client.get(msg[name], kind) if msg.get(name) else None
            if rec is not None and rec.dev is not dev:
                raise einval(f"the QP's {name} is on another device")
            parents[name] = rec.obj if rec is not None else None
        specs = [(name, send, msg.get(name)) for name, send in (("sq", True), ("rq", False))]
        wanted = sum(1 for _, _, spec in specs if spec is not None)
        if len(fds) != wanted:
            raise einval(f"create_qp announced {wanted} rings but passed {len(fds)} "
                         "file descriptors")  # fmt: skip
        regions: list[SharedRegion] = []
        rings: list[ShmWorkQueue | None] = []
        try:
            for name, send, spec in specs:
                if spec is None:
                    rings.append(None)
                    continue
                if not isinstance(spec, dict):
                    raise einval(f"bad {name} description {spec!r}")
                size = _int(spec, "size", 1, LIMITS["max_qp_wr"])
                least = send_slot_size(1, 0) if send else recv_slot_size(1)
                slot = _int(spec, "slot", least, MAX_SLOT)
                region = _map(fds.pop(0), _Ring.region_size(size, slot))
                regions.append(region)
                rings.append(ShmWorkQueue(region, size, slot, send, device=True,
                                          resolve=lambda n: self._key_of(client, n)))  # fmt: skip
            rec = client.add("qp", dev, None, regions)
            try:
                eng = dev.provider.create_qp(qp_type, parents["pd"], parents["scq"],
                                             parents["rcq"], parents["srq"], parents["xrcd"],
                                             None, None, bool(msg["sq_sig_all"]), pmtu, rec,
                                             (rings[0], rings[1]),
                                             engine_cls=ServedQPEngine)  # fmt: skip
            except Exception:
                del client.objects[rec.number]
                raise
        except Exception:
            for r in regions:
                r.close()
            raise
        rec.obj = eng
        if eng.qp_type == IBV_QPT_XRC_RECV:  # the device owns it; this handle holds it
            dev.provider.xrc_hold(eng, rec)
        for ring, wq_kind in ((rings[0], WQ_SQ), (rings[1], WQ_RQ)):
            if ring is not None:
                ring.tag = (wq_kind, rec.number)
        return {"obj": rec.number, "qpn": eng.qpn}

    def op_modify_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        from softverbs.enums import ibv_qp_state

        rec = client.get(msg["qp"], "qp")
        eng: QPEngine = rec.obj
        attrs = decode_attrs(msg["attrs"])
        state = msg.get("state")
        if state is not None and (type(state) is not int
                                  or state not in ibv_qp_state._value2member_map_):  # fmt: skip
            raise einval(f"qp_state {state!r} is not a QP state")
        rt = rec.dev.runtime
        with rt.lock:
            eng.set_attrs(attrs)
            if state is not None:
                eng.set_state(state, rt.clock.now())
            rt.progress()
            return {"state": eng.state}

    def op_query_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        rec = client.get(msg["qp"], "qp")
        with rec.dev.runtime.lock:
            return {"state": rec.obj.state, "draining": rec.obj.sq_draining(),
                    "last_error": rec.obj.last_error}  # fmt: skip

    def op_db_sq(self, client: Client, msg: Msg, fds: list[int]) -> None:
        self._doorbell(client.get(msg["qp"], "qp"), send=True)
        return None

    def op_db_rq(self, client: Client, msg: Msg, fds: list[int]) -> None:
        self._doorbell(client.get(msg["qp"], "qp"), send=False)
        return None

    def _doorbell(self, rec: Obj, send: bool) -> None:
        eng: QPEngine = rec.obj
        ring = eng.sq if send else eng.rq
        if not isinstance(ring, ShmWorkQueue):
            return  # this QP has no such queue (an opened XRC receive QP)
        rt = rec.dev.runtime
        with rt.lock:
            ring.latch()
            if send:
                eng.doorbell(rt.clock.now())
            else:
                eng.rq_doorbell(rt.clock.now())
            rt.progress()

    # XRC receive QPs owned by the device
    def op_xrc_alloc(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        from softverbs.enums import IBV_QPS_INIT, IBV_QPS_RTR

        xrcd = client.get(msg["xrcd"], "xrcd")
        steps = msg["steps"]
        if not isinstance(steps, list) or [s[0] for s in steps] != [IBV_QPS_INIT, IBV_QPS_RTR]:
            raise einval("xrc_rcv_qp_alloc: the steps must be RESET->INIT and INIT->RTR")
        decoded = [(s, decode_attrs(a)) for s, a in steps]
        return {"qpn": xrcd.dev.provider.xrc_rcv_qp_alloc(xrcd.obj, decoded, client)}

    def op_xrc_register(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        xrcd = client.get(msg["xrcd"], "xrcd")
        qpn = _int(msg, "qpn", 0, 0xFFFFFF)
        xrcd.dev.provider.xrc_hold(xrcd.dev.provider.xrc_lookup(xrcd.obj, qpn), client)
        return {}

    def op_xrc_unregister(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        xrcd = client.get(msg["xrcd"], "xrcd")
        qpn = _int(msg, "qpn", 0, 0xFFFFFF)
        prov = xrcd.dev.provider
        prov.xrc_release(prov.xrc_lookup(xrcd.obj, qpn), client)
        return {}

    def op_open_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        xrcd = client.get(msg["xrcd"], "xrcd")
        qpn = _int(msg, "qpn", 0, 0xFFFFFF)
        prov = xrcd.dev.provider
        eng = prov.xrc_lookup(xrcd.obj, qpn)
        rec = client.add("qp", xrcd.dev, eng, [])
        prov.xrc_hold(eng, rec)
        return {"obj": rec.number, "qpn": eng.qpn, "state": eng.state}

    # destruction
    def op_destroy(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        kind = msg["kind"]
        if kind not in _TEARDOWN:
            raise einval(f"destroy: unknown kind {kind!r}")
        rec = client.get(msg["obj"], kind)
        self._destroy(rec)
        return {}

    def _destroy(self, rec: Obj) -> None:
        prov = rec.dev.provider
        obj = rec.obj
        try:
            if rec.kind == "qp" and obj is not None:
                if obj.qp_type == IBV_QPT_XRC_RECV and obj.qpn in obj.hca.xrc_refs:
                    prov.xrc_release(obj, rec)
                else:
                    prov.destroy_qp(obj)
            elif rec.kind == "srq":
                prov.destroy_srq(obj)
            elif rec.kind == "cq":
                prov.destroy_cq(obj)
            elif rec.kind == "mr":
                prov.dereg_mr(obj)
            elif rec.kind == "mw":
                prov.dealloc_mw(obj)
            elif rec.kind == "xrcd":
                prov.close_xrcd(obj)
        finally:
            rec.client.objects.pop(rec.number, None)
        # Break the object <-> record cycle (owner, notify) now: until the
        # garbage collector found it, a region's mapping -- and the fd mmap
        # keeps -- would outlive the process that shared it.
        if getattr(obj, "owner", None) is rec:
            obj.owner = None
        if isinstance(obj, ShmCompletionQueue):
            obj.notify = None
        rec.obj = None
        for region in rec.regions:
            region.close()

    def drop(self, client: Client) -> None:
        """The process is gone: release everything it held."""
        if self.clients.pop(client.sock, None) is None:
            return
        with contextlib.suppress(Exception):
            self.sel.unregister(client.sock)
        client.alive = False
        client.outq.clear()
        with contextlib.suppress(OSError):
            client.sock.close()
        try:  # its RDMA CM IDs first: their peers get a DREQ or REJ
            from softverbs.cm import service as cm

            cm.drop(self, client)
        except Exception:
            log.exception("dropping the CM IDs of pid %d", client.pid)
        order = sorted(client.objects.values(), key=lambda r: (_TEARDOWN[r.kind], -r.number))
        for rec in order:
            try:
                with rec.dev.runtime.lock:
                    self._destroy(rec)
            except Exception:
                log.exception("cleanup of %s %s of pid %d", rec.kind, rec.number, client.pid)
                client.objects.pop(rec.number, None)
                for region in rec.regions:
                    region.close()
        for dev in self.devices.values():
            try:
                dev.provider.xrc_release_all(client)
            except Exception:
                log.exception("releasing the XRC registrations of pid %d", client.pid)
        self.stats["clients_dropped"] += 1

    def _shutdown(self) -> None:
        for client in list(self.clients.values()):
            self.drop(client)
        with contextlib.suppress(Exception):
            self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.registry.shutdown()
        self._release_pidfile()

    # --- helpers ----------------------------------------------------------------
    def _key_of(self, client: Client, number: int) -> MemKey | None:
        rec = client.objects.get(number)
        if rec is None or rec.kind not in ("mr", "mw"):
            return None
        key: MemKey = rec.obj
        return key

    @staticmethod
    def _wq_ids(wq: Any) -> tuple[int, int]:
        """Which of the client's rings a CQE frees a slot of (tagged at creation)."""
        tag: tuple[int, int] = getattr(wq, "tag", (WQ_NONE, 0))
        return tag


def _map(fd: int, size: int) -> SharedRegion:
    """Map a client's shared-memory fd; EINVAL if it is not one (a pipe, a
    socket, a file too small)."""
    try:
        return SharedRegion(size, fd=fd)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise einval(f"the file descriptor passed is not {size} bytes of shared memory "
                     f"({exc})") from None  # fmt: skip


#: Teardown order when a process dies: users before what they use.
_TEARDOWN = {"qp": 0, "mw": 1, "srq": 2, "mr": 3, "cq": 4, "xrcd": 5, "pd": 6}


def _bare(message: str) -> str:
    """An error message without pyverbs' '. Errno: N, text' suffix."""
    return message.split(". Errno:")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="softverbsd", description="the softverbs device service")
    parser.add_argument("--socket", default=protocol.default_socket_path())
    parser.add_argument("--pidfile", help="default: the socket path + '.pid'")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s softverbsd[%(process)d] %(levelname)s %(message)s")
    try:
        service = Service(args.socket, pidfile=args.pidfile)
    except ServiceRunning as exc:
        print(f"softverbsd: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"softverbsd: cannot listen on {args.socket}: {exc}", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: service.stop())
    print(f"softverbsd: serving on {args.socket} (pid {os.getpid()})", flush=True)
    service.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
