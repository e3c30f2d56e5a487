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
A peer that sends something that is not a softverbs message gets an error
and is disconnected; the service itself never stops for a bad peer.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from softverbs.engine.memory import MemKey, MemKind
from softverbs.engine.qp import QPEngine
from softverbs.engine.queues import Route
from softverbs.enums import IBV_QPT_XRC_RECV
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
)
from softverbs.verbs.memory import Memory
from softverbs.verbs.registry import Registry, SoftDevice

log = logging.getLogger("softverbsd")

#: a protocol message (see :mod:`softverbs.service.protocol`)
Msg = dict[str, Any]


class Obj:
    """One object a client created, by the number the client knows it by."""

    __slots__ = ("client", "dev", "kind", "number", "obj", "regions")

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

    def __init__(self, sock: socket.socket, pid: int, uid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.uid = uid
        self.objects: dict[int, Obj] = {}
        self.next = 1
        self.alive = True
        self._send_lock = threading.Lock()

    def add(self, kind: str, dev: SoftDevice, obj: Any, regions: list[SharedRegion]) -> Obj:
        rec = Obj(self, self.next, kind, dev, obj, regions)
        self.objects[self.next] = rec
        self.next += 1
        return rec

    def get(self, number: Any, kind: str) -> Obj:
        rec = self.objects.get(number) if isinstance(number, int) else None
        if rec is None or rec.kind != kind:
            raise einval(f"this process has no {kind} number {number!r}")
        return rec

    def send(self, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        if not self.alive:
            return
        with self._send_lock:
            try:
                protocol.send(self.sock, msg, fds)
            except OSError:
                self.alive = False

    def __repr__(self) -> str:
        return f"<Client pid={self.pid} objects={len(self.objects)}>"


def _route(d: dict[str, Any]) -> Route:
    return Route(bytes.fromhex(d["dgid"]), bytes.fromhex(d["sgid"]), d["sgid_index"],
                 d["hop_limit"], d["tclass"], d["flow_label"], d["port"])  # fmt: skip


def decode_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Engine attribute values from their JSON form (routes are dicts)."""
    out = dict(attrs)
    if "route" in out:
        out["route"] = _route(out["route"])
    return out


class Service:
    """The device service (see the module docstring)."""

    def __init__(self, path: str, registry: Registry | None = None) -> None:
        self.path = path
        self.registry = registry or Registry()
        self.clients: dict[socket.socket, Client] = {}
        self.devices: dict[str, SoftDevice] = {}
        self.sel = selectors.DefaultSelector()
        self.stats: Counter[str] = Counter()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    # --- devices ---------------------------------------------------------------
    def device(self, name: Any) -> SoftDevice:
        if not isinstance(name, str):
            raise einval("a device name must be a string")
        dev = self.devices.get(name)
        if dev is None:
            dev = self.registry.open(name)
            dev.provider.set_event_sink(self._event_sink)
            self.devices[name] = dev
        return dev

    def _event_sink(self, event_type: int, element: Any) -> None:
        owner = getattr(element, "owner", None)
        reason = getattr(element, "last_error", "") or ""
        if isinstance(owner, Obj):
            owner.client.send({"event": event_type, "kind": owner.kind, "obj": owner.number,
                               "reason": reason})  # fmt: skip
            return
        if isinstance(element, QPEngine):
            # A device-owned XRC receive QP: tell every process holding it.
            refs = element.hca.xrc_refs.get(element.qpn, set())  # type: ignore[attr-defined]
            for holder in list(refs):
                client = holder if isinstance(holder, Client) else getattr(holder, "client", None)
                if isinstance(client, Client):
                    client.send({"event": event_type, "kind": "xrc_qp", "qpn": element.qpn,
                                 "reason": reason})  # fmt: skip

    # --- the loop ------------------------------------------------------------------
    def serve_forever(self) -> None:
        while not self._stop.is_set():
            timeout = 1.0
            for dev in list(self.devices.values()):
                with dev.runtime.lock:
                    nxt = dev.runtime.next_deadline()
                    if nxt is not None:
                        timeout = min(timeout, max(0.0, nxt - dev.runtime.clock.now()))
            for key, _ in self.sel.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            for dev in list(self.devices.values()):
                with dev.runtime.lock:
                    dev.runtime.progress()
        self._shutdown()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid() and uid != 0:
            with contextlib.suppress(OSError):
                protocol.send(sock, {"id": 0, "errno": errno.EPERM,
                                     "error": "softverbsd serves only its own user"})  # fmt: skip
            sock.close()
            return
        sock.setblocking(False)
        client = Client(sock, pid, uid)
        self.clients[sock] = client
        self.sel.register(sock, selectors.EVENT_READ, "client")
        self.stats["clients_connected"] += 1

    def _read(self, sock: socket.socket) -> None:
        client = self.clients.get(sock)
        if client is None:
            return
        while True:
            try:
                msg, fds = protocol.recv(sock)
            except BlockingIOError:
                return
            except (EOFError, ConnectionError, OSError):
                self.drop(client)
                return
            except protocol.ProtocolError as exc:
                client.send({"id": 0, "errno": errno.EPROTO,
                             "error": f"not a softverbs client: {exc}"})  # fmt: skip
                self.drop(client)
                return
            self.handle(client, msg, fds)
            if not client.alive:
                self.drop(client)
                return

    # --- requests ----------------------------------------------------------------
    def handle(self, client: Client, msg: Msg, fds: list[int]) -> None:
        op = msg.get("op")
        rid = msg.get("id", 0)
        handler: Callable[[Client, dict[str, Any], list[int]], dict[str, Any] | None] | None
        handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        try:
            if handler is None:
                raise protocol.ProtocolError(f"unknown request {op!r}")
            result = handler(client, msg, fds)
            fds = []  # the handler took ownership
        except PyverbsRDMAError as exc:
            code = exc.error_code if exc.error_code > 0 else errno.EINVAL
            client.send({"id": rid, "errno": code, "error": _bare(str(exc))})
            return
        except PyverbsError as exc:
            client.send({"id": rid, "errno": errno.EINVAL, "error": _bare(str(exc))})
            return
        except protocol.ProtocolError as exc:
            client.send({"id": rid, "errno": errno.EPROTO, "error": str(exc)})
            client.alive = False
            return
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            client.send({"id": rid, "errno": errno.EINVAL, "error": f"bad {op} request: {exc!r}"})
            return
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if result is not None:
            result["id"] = rid
            client.send(result)

    def op_hello(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        if msg.get("version") != protocol.PROTOCOL_VERSION:
            raise protocol.ProtocolError(
                f"protocol version {msg.get('version')!r}; this service speaks "
                f"{protocol.PROTOCOL_VERSION}"
            )
        specs = self.registry.specs()
        return {"devices": [{"name": s.name, "guid": s.guid} for s in specs],
                "pid": os.getpid()}  # fmt: skip

    def op_open_device(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["name"])
        return {"gids": [g.hex() for g in dev.provider.gids], "mtu": dev.mtu,
                "guid": dev.guid, "index": dev.index}  # fmt: skip

    def op_counters(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        return {"counters": self.device(msg["dev"]).provider.counters()}

    def op_stats(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        """Live objects, for tests and ``softverbs service status``."""
        live: Counter[str] = Counter()
        for c in self.clients.values():
            for rec in c.objects.values():
                live[rec.kind] += 1
        hcas = [d.hca for d in self.devices.values() if d.hca is not None]
        xrc = sum(len(h.xrc_refs) for h in hcas)
        qps = sum(len(h.qps) for h in hcas)
        keys = sum(len(h.keys) for h in hcas)
        return {"clients": len(self.clients), "objects": dict(live), "xrc_qps": xrc,
                "engine_qps": qps, "keys": keys, "stats": dict(self.stats)}  # fmt: skip

    # protection domains: a token the engine compares by identity
    def op_alloc_pd(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["dev"])
        return {"obj": client.add("pd", dev, object(), []).number}

    # memory
    def _region(self, fds: list[int], size: int) -> SharedRegion:
        if len(fds) != 1:
            raise einval("expected one shared-memory file descriptor")
        if not isinstance(size, int) or size < 0:
            raise einval(f"bad size {size!r}")
        return SharedRegion(size, fd=fds.pop())

    def op_reg_mr(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        pd = client.get(msg["pd"], "pd")
        length = msg["length"]
        region = self._region(fds, length)
        mem = Memory(region.view[:length], msg["addr"], region)
        try:
            key = pd.dev.provider.reg_mr(pd.obj, mem, msg["access"], None)
        except Exception:
            region.close()
            raise
        rec = client.add("mr", pd.dev, key, [region])
        key.owner = rec
        return {"obj": rec.number, "key": key.key}

    def op_update_mr(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        mr = client.get(msg["mr"], "mr")
        pd = client.get(msg["pd"], "pd").obj if msg.get("pd") is not None else None
        mr.dev.provider.update_mr(mr.obj, None, msg.get("access"), pd)
        return {}

    def op_alloc_mw(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        pd = client.get(msg["pd"], "pd")
        key = pd.dev.provider.alloc_mw(pd.obj, MemKind(msg["kind"]), None)
        rec = client.add("mw", pd.dev, key, [])
        key.owner = rec
        return {"obj": rec.number, "key": key.key}

    def op_query_key(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        rec = client.get(msg["obj"], msg.get("kind", "mw"))
        return {"key": rec.obj.key}

    # completion queues and SRQs
    def op_create_cq(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["dev"])
        size = msg["capacity"]
        region = self._region(fds, _Ring.region_size(size, 128))
        ring = ShmCompletionQueue(region, size)
        rec = client.add("cq", dev, ring, [region])
        ring.owner = rec
        ring.wq_ids = self._wq_ids
        ring.notify = lambda: client.send({"cq_event": rec.number})
        return {"obj": rec.number}

    def op_create_srq(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        pd = client.get(msg["pd"], "pd")
        max_wr, max_sge = msg["max_wr"], msg["max_sge"]
        slot = recv_slot_size(max_sge)
        region = self._region(fds, _Ring.region_size(max_wr, slot))
        ring = ShmSharedRQ(region, max_wr, slot, max_sge)
        xrcd = client.get(msg["xrcd"], "xrcd").obj if msg.get("xrcd") else None
        cq = client.get(msg["cq"], "cq").obj if msg.get("cq") else None
        rec = client.add("srq", pd.dev, ring, [region])
        ring.tag = (WQ_SRQ, rec.number)
        pd.dev.provider.create_srq(max_wr, max_sge, msg["limit"], pd.obj, xrcd, cq, rec, ring)
        return {"obj": rec.number, "srqn": ring.srqn}

    def op_modify_srq(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        srq = client.get(msg["srq"], "srq")
        with srq.dev.runtime.lock:
            srq.obj.modify(None, msg["limit"])
        return {}

    # XRC domains
    def op_open_xrcd(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["dev"])
        fd = fds.pop() if fds else -1
        try:
            domain = dev.provider.open_xrcd(fd, msg["oflags"])
        finally:
            if fd != -1:
                os.close(fd)
        return {"obj": client.add("xrcd", dev, domain, []).number}

    # queue pairs
    def op_create_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        dev = self.device(msg["dev"])
        regions: list[SharedRegion] = []
        rings: list[ShmWorkQueue | None] = []
        for name, send in (("sq", True), ("rq", False)):
            spec = msg.get(name)
            if spec is None:
                rings.append(None)
                continue
            if not fds:
                raise einval(f"no shared memory for the {name}")
            size, slot = spec["size"], spec["slot"]
            region = SharedRegion(_Ring.region_size(size, slot), fd=fds.pop(0))
            regions.append(region)
            rings.append(ShmWorkQueue(region, size, slot, send,
                                      resolve=lambda n: self._key_of(client, n)))  # fmt: skip
        pd = client.get(msg["pd"], "pd").obj if msg.get("pd") else None
        scq = client.get(msg["scq"], "cq").obj if msg.get("scq") else None
        rcq = client.get(msg["rcq"], "cq").obj if msg.get("rcq") else None
        srq = client.get(msg["srq"], "srq").obj if msg.get("srq") else None
        xrcd = client.get(msg["xrcd"], "xrcd").obj if msg.get("xrcd") else None
        rec = client.add("qp", dev, None, regions)
        try:
            eng = dev.provider.create_qp(msg["qp_type"], pd, scq, rcq, srq, xrcd, None, None,
                                         bool(msg["sq_sig_all"]), msg["pmtu"], rec,
                                         (rings[0], rings[1]))  # fmt: skip
        except Exception:
            del client.objects[rec.number]
            for r in regions:
                r.close()
            raise
        rec.obj = eng
        if eng.qp_type == IBV_QPT_XRC_RECV:  # the device owns it; this handle holds it
            dev.provider.xrc_hold(eng, rec)
        for ring, kind in ((rings[0], WQ_SQ), (rings[1], WQ_RQ)):
            if ring is not None:
                ring.tag = (kind, rec.number)
        return {"obj": rec.number, "qpn": eng.qpn}

    def op_modify_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        rec = client.get(msg["qp"], "qp")
        eng: QPEngine = rec.obj
        rt = rec.dev.runtime
        with rt.lock:
            eng.set_attrs(decode_attrs(msg["attrs"]))
            if msg.get("state") is not None:
                eng.set_state(msg["state"], rt.clock.now())
            rt.progress()
            return {"state": eng.state}

    def op_query_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        rec = client.get(msg["qp"], "qp")
        with rec.dev.runtime.lock:
            return {"state": rec.obj.state, "draining": rec.obj.sq_draining(),
                    "last_error": rec.obj.last_error}  # fmt: skip

    def op_db_sq(self, client: Client, msg: Msg, fds: list[int]) -> None:
        rec = client.get(msg["qp"], "qp")
        rt = rec.dev.runtime
        with rt.lock:
            rec.obj.doorbell(rt.clock.now())
            rt.progress()
        return None

    def op_db_rq(self, client: Client, msg: Msg, fds: list[int]) -> None:
        rec = client.get(msg["qp"], "qp")
        rt = rec.dev.runtime
        with rt.lock:
            rec.obj.rq_doorbell(rt.clock.now())
            rt.progress()
        return None

    # XRC receive QPs owned by the device
    def op_xrc_alloc(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        xrcd = client.get(msg["xrcd"], "xrcd")
        steps = [(s, decode_attrs(a)) for s, a in msg["steps"]]
        return {"qpn": xrcd.dev.provider.xrc_rcv_qp_alloc(xrcd.obj, steps, client)}

    def op_xrc_register(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        xrcd = client.get(msg["xrcd"], "xrcd")
        xrcd.dev.provider.xrc_hold(xrcd.dev.provider.xrc_lookup(xrcd.obj, msg["qpn"]), client)
        return {}

    def op_xrc_unregister(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        xrcd = client.get(msg["xrcd"], "xrcd")
        prov = xrcd.dev.provider
        prov.xrc_release(prov.xrc_lookup(xrcd.obj, msg["qpn"]), client)
        return {}

    def op_open_qp(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        xrcd = client.get(msg["xrcd"], "xrcd")
        prov = xrcd.dev.provider
        eng = prov.xrc_lookup(xrcd.obj, msg["qpn"])
        rec = client.add("qp", xrcd.dev, eng, [])
        prov.xrc_hold(eng, rec)
        return {"obj": rec.number, "qpn": eng.qpn, "state": eng.state}

    # destruction
    def op_destroy(self, client: Client, msg: Msg, fds: list[int]) -> Msg:
        rec = client.get(msg["obj"], msg["kind"])
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
        for region in rec.regions:
            region.close()

    def drop(self, client: Client) -> None:
        """The process is gone: release everything it held."""
        if self.clients.pop(client.sock, None) is None:
            return
        with contextlib.suppress(Exception):
            self.sel.unregister(client.sock)
        client.alive = False
        with contextlib.suppress(OSError):
            client.sock.close()
        order = sorted(client.objects.values(), key=lambda r: (_TEARDOWN[r.kind], -r.number))
        for rec in order:
            try:
                self._destroy(rec)
            except Exception:
                log.exception("cleanup of %s %s of pid %d", rec.kind, rec.number, client.pid)
                client.objects.pop(rec.number, None)
        for dev in self.devices.values():
            dev.provider.xrc_release_all(client)
        self.stats["clients_dropped"] += 1

    def _shutdown(self) -> None:
        for client in list(self.clients.values()):
            self.drop(client)
        with contextlib.suppress(Exception):
            self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.registry.shutdown()

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


#: Teardown order when a process dies: users before what they use.
_TEARDOWN = {"qp": 0, "mw": 1, "srq": 2, "mr": 3, "cq": 4, "xrcd": 5, "pd": 6}


def _bare(message: str) -> str:
    """An error message without pyverbs' '. Errno: N, text' suffix."""
    return message.split(". Errno:")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="softverbsd", description="the softverbs device service")
    parser.add_argument("--socket", default=protocol.default_socket_path())
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        service = Service(args.socket)
    except OSError as exc:
        print(f"softverbsd: cannot listen on {args.socket}: {exc}", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: service.stop())
    print(f"softverbsd: serving on {args.socket} (pid {os.getpid()})", flush=True)
    service.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
