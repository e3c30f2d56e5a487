"""``softverbsd``: the host device service, an owner that outlives processes.

The service holds the engines of the host's devices -- ``sv0``, the host
device every process reaches with no setup, and the UDP links of the
``softverbs link`` table -- and executes the operations of
:mod:`softverbs.device.api` for every process that connects, Python or C,
through the same :class:`~softverbs.device.core.Host` an in-process device
uses.  The service adds only what crossing a process boundary needs:

* **Who is asking.**  A connection's peer is identified by ``SO_PEERCRED``:
  only the service's own user (or root) may connect, and each connection is
  one :class:`~softverbs.device.core.Owner`.  Its objects are named by
  handles no other connection can use.
* **Bytes.**  Requests arrive as :mod:`~softverbs.service.protocol`
  messages; descriptors passed with them become what the request needs
  (:func:`Service.resources`): shared-memory rings the service maps, a memfd
  holding a memory region, the process's ``/proc/self/mem`` (every other
  region), event sockets, an XRC domain's file.  Each descriptor is checked
  (right size, right kind) before anything uses it.
* **Events.**  Async events go to the socket the context passed with
  ``OPEN_DEVICE``; completion events to the channel's socket.  Both are
  written without blocking; one that does not fit (the process does not
  read them) is dropped and counted.
* **Death.**  When a connection closes -- exit, crash, SIGKILL -- the owner's
  objects are destroyed (users before what they use) and its XRC
  registrations dropped: no heartbeat is needed (seed 002, note 2).

A peer that sends something that is not a softverbs message gets ``EPROTO``
and is disconnected; a request that fails gets its errno and a message, and
the connection stays.  Nothing a peer sends is executed, and no bad peer
stops the service: an unexpected exception in a request or in the engine is
logged, counted, answered with ``EIO`` where someone waits, and the loop
goes on.

Lifetime: one service per socket path (a pidfile next to it holds an
exclusive ``flock`` while the service lives).  A service started on demand
(``--idle-exit``) stops after that many seconds without a client; one
started with ``softverbs service start`` stays until stopped.  The loop is
single-threaded; replies that cannot be sent at once wait in a bounded
per-client queue.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import logging
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from softverbs import compiled, config
from softverbs.device import api
from softverbs.device.core import ALLOWED_OPCODES, Owner, Resources
from softverbs.device.memory import ProcessMemory
from softverbs.engine.rings import (
    CQE_SIZE,
    HEADER_SIZE,
    WR_DRIVER1,
    SharedRegion,
    recv_slot_size,
    ring_slots,
    send_slot_size,
    shared_cq,
    shared_srq,
    shared_work_ring,
)
from softverbs.errors import ConfigError, PyverbsError, PyverbsRDMAError, einval
from softverbs.service import protocol
from softverbs.service.protocol import ProtocolError
from softverbs.verbs.registry import Registry

log = logging.getLogger("softverbsd")

#: replies a client may leave unread before it is disconnected
MAX_BACKLOG = 4096
#: messages read from one client before the loop serves the others
READ_BATCH = 64
#: the largest ring slot a client may ask for
MAX_SLOT = api.MAX_SLOT
#: the largest memory region a client may pass as a memfd
MAX_MAPPED = 1 << 40
#: RDMA CM event channels (sockets) one process may register
MAX_CM_CHANNELS = 1024


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


class Client:
    """A connected process: its socket, its owner record, what waits to be sent."""

    def __init__(self, sock: socket.socket, pid: int, uid: int, owner: Owner,
                 want_write: Callable[[Client], None]) -> None:  # fmt: skip
        self.sock = sock
        self.pid = pid
        self.uid = uid
        self.owner = owner
        self.alive = True
        self.greeted = False
        self.kicked = False  #: disconnect once the error reply is out
        #: replies not sent yet, with the descriptors they pass (closed once sent)
        self.outq: deque[tuple[bytes, list[int]]] = deque()
        self.events_dropped = 0
        #: RDMA CM event channel number -> the socket its events go to
        self.cm_events: dict[int, EventSocket] = {}
        self._want_write = want_write
        self._send_lock = threading.Lock()

    def send(self, data: bytes, fds: list[int] | None = None) -> None:
        """Send without blocking; what does not fit waits in :attr:`outq`.
        The descriptors ``fds`` are the client's to close once sent (or dropped)."""
        fds = fds or []
        if not self.alive:
            _close_all(fds)
            return
        with self._send_lock:
            if not self.outq:
                try:
                    protocol.send(self.sock, data, fds)
                    _close_all(fds)
                    return
                except BlockingIOError:
                    pass
                except OSError:
                    self.alive = False
                    _close_all(fds)
                    return
            if len(self.outq) >= MAX_BACKLOG:
                log.warning("pid %d left %d replies unread: disconnecting it", self.pid,
                            len(self.outq))  # fmt: skip
                self.alive = False
                _close_all(fds)
                return
            self.outq.append((data, fds))
        self._want_write(self)

    def flush(self) -> bool:
        """Send what waits; True when nothing is left."""
        with self._send_lock:
            while self.outq:
                data, fds = self.outq[0]
                try:
                    protocol.send(self.sock, data, fds)
                except BlockingIOError:
                    return False
                except OSError:
                    self.alive = False
                    self.discard()
                    return True
                self.outq.popleft()
                _close_all(fds)
            return True

    def discard(self) -> None:
        """Drop what waits to be sent, closing its descriptors."""
        while self.outq:
            _close_all(self.outq.popleft()[1])

    def __repr__(self) -> str:
        return f"<Client pid={self.pid} objects={len(self.owner.objects)}>"


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class EventSocket:
    """One end of a socketpair a client passed: where its events go."""

    def __init__(self, sock: socket.socket, client: Client) -> None:
        self.sock = sock
        self.client = client

    def write(self, data: bytes) -> None:
        try:
            self.sock.send(data, socket.MSG_DONTWAIT)
        except OSError:  # full (the process does not read them) or gone
            self.client.events_dropped += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _event_socket(fd: int, client: Client) -> EventSocket:
    """A client's event socket, checked to be a SOCK_SEQPACKET Unix socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        os.close(fd)
        raise einval(f"the file descriptor passed is not a socket: {exc}") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
        sock.close()
        raise einval("an event socket must be an AF_UNIX SOCK_SEQPACKET socket (socketpair)")
    return EventSocket(sock, client)


#: the seals every memfd a client passes must carry before the service maps it:
#: a file sealed against shrinking can never become shorter than the mapping, so
#: no access through the mapping can fault (SIGBUS) whatever the client does later
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK


def _map(fd: int, size: int, what: str) -> SharedRegion:
    """A client's shared-memory fd, mapped (``size`` bytes); EINVAL if it is not one.

    The order matters: the seals are read first (they are never removed), then
    the size -- a file sealed against shrinking keeps the size it has now."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a memory file (memfd)")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise ValueError("not a memfd: it cannot be sealed") from None
        if seals & REQUIRED_SEALS != REQUIRED_SEALS:
            raise ValueError("the memfd is not sealed against shrinking: create it with "
                             "MFD_ALLOW_SEALING and add F_SEAL_SHRINK (fcntl F_ADD_SEALS) "
                             "before passing it")  # fmt: skip
        return SharedRegion(size, fd=fd)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise einval(f"{what}: the file descriptor passed is not {size} bytes of sealed "
                     f"shared memory ({exc})") from None  # fmt: skip


def _own_memory(fd: int, client: Client, pid: int) -> None:
    """EINVAL unless ``fd`` is the connecting process's own ``/proc/<pid>/mem``.

    The peer is who ``SO_PEERCRED`` says; the descriptor must be that process's
    ``mem`` file (same device and inode as the service's own look-up of
    ``/proc/<peer pid>/mem``), so a region is only ever read or written in the
    process that registered it -- never in another process, nor in the service."""
    if pid != client.pid:
        raise einval(f"HELLO: pid {pid} is not the connecting process (SO_PEERCRED: pid "
                     f"{client.pid})")  # fmt: skip
    try:
        st = os.fstat(fd)
        own = os.stat(f"/proc/{client.pid}/mem")
    except OSError as exc:
        raise einval(f"HELLO: the memory descriptor cannot be checked: {exc.strerror}") from None
    if (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino):
        raise einval(f"HELLO: the descriptor passed with HELLO_MEMORY is not /proc/{client.pid}"
                     f"/mem, the connecting process's own memory (open /proc/self/mem and "
                     f"pass that)")  # fmt: skip


def _refuse(sock: socket.socket, reply: bytes) -> None:
    """Send ``reply`` (seq 0: it answers whatever the peer sent first) and close
    so that the peer reads it.  A Unix socket closed with unread messages
    resets its peer (ECONNRESET) before the peer reads what was sent to it, so:
    send, shut both directions (the peer's further sends fail with EPIPE, and
    nothing new arrives), drop what it had queued (closing any descriptors it
    passed), then close -- an orderly end of file after the reply."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(reply)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    for _ in range(MAX_BACKLOG):  # bounded: the peer can no longer add any
        try:
            _data, fds = protocol.recv(sock)
        except ProtocolError:  # consumed all the same (and its descriptors closed)
            continue
        except (OSError, EOFError):
            break
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    sock.close()


def _fds(fds: list[int], want: int, what: str) -> list[int]:
    if len(fds) != want:
        raise einval(f"{what}: expected {want} file descriptor(s), got {len(fds)}")
    taken = list(fds)
    fds.clear()
    return taken


def _slot(value: int, least: int, what: str) -> int:
    if not least <= value <= MAX_SLOT or value % 16:
        raise einval(f"{what}: a slot of {value} bytes is not a multiple of 16 in "
                     f"{least}..{MAX_SLOT}")  # fmt: skip
    return value


class Service:
    """The device service (see the module docstring)."""

    def __init__(self, path: str, registry: Registry | None = None,
                 pidfile: str | None = None, idle_exit: float = 0.0) -> None:  # fmt: skip
        self.path = path
        self.pidfile = pidfile if pidfile is not None else path + ".pid"
        self.registry = registry or Registry(host_device=True)
        self.host = self.registry.host
        self.idle_exit = idle_exit
        self.clients: dict[socket.socket, Client] = {}
        self.sel = selectors.DefaultSelector()
        self.stats: Counter[str] = Counter()
        self.started = time.monotonic()
        self._idle_since: float | None = time.monotonic()
        self._stop = threading.Event()
        self._writers: set[Client] = set()
        self._writers_lock = threading.Lock()
        self._pid_fd = claim_pidfile(self.pidfile, path)
        try:
            # We hold the lock: a socket file left here is a dead service's.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            old = os.umask(0o177)  # owner-only from the start, not after a chmod
            try:
                self.listener.bind(path)
            finally:
                os.umask(old)
        except BaseException:
            self._release_pidfile()
            raise
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

    # --- the loop ------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                self._turn()
        finally:
            self._shutdown()

    def _devices(self) -> list[Any]:
        return [d for d in list(self.registry.devices.values()) if d.core is not None]

    def _turn(self) -> None:
        """One pass of the loop: wait, serve what is ready, run the engines."""
        timeout = 1.0
        for dev in self._devices():
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
        for dev in self._devices():
            with dev.runtime.lock:
                try:
                    dev.runtime.progress()
                except Exception:  # the engine must not take the service down
                    self.stats["engine_errors"] += 1
                    log.exception("engine progress on %s", dev.name)
        for client in [c for c in self.clients.values() if not c.alive]:
            self.drop(client)
        self._check_idle()

    def _check_idle(self) -> None:
        if not self.idle_exit:
            return
        if self.clients:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()
        elif time.monotonic() - self._idle_since >= self.idle_exit:
            log.info("no client for %.0f s: exiting", self.idle_exit)
            self._stop.set()

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
            self.stats["clients_refused"] += 1
            _refuse(sock, protocol.encode_error(
                api.HELLO.code, 0, errno.EPERM,
                f"softverbsd of uid {os.getuid()} serves only its own user, not uid {uid}"))
            return
        sock.setblocking(False)
        owner = self.host.add_owner(Owner(f"pid {pid}", pid, uid))
        client = Client(sock, pid, uid, owner, self._want_write)
        self.clients[sock] = client
        self.sel.register(sock, selectors.EVENT_READ, "client")
        self.stats["clients_connected"] += 1

    def _read(self, sock: socket.socket) -> None:
        client = self.clients.get(sock)
        if client is None:
            return
        for _ in range(READ_BATCH):
            try:
                data, fds = protocol.recv(sock)
            except BlockingIOError:
                return
            except (EOFError, OSError):
                self.drop(client)
                return
            except ProtocolError as exc:
                self._kick(client, 0, 0, str(exc))
                return
            self.handle(client, data, fds)
            if not client.alive:
                client.flush()  # the error that explains the disconnect, if it fits
                self.drop(client)
                return

    def _kick(self, client: Client, op: int, seq: int, why: str) -> None:
        self.stats["protocol_errors"] += 1
        client.send(protocol.encode_error(op, seq, errno.EPROTO, f"not a softverbs client: {why}"))
        client.flush()
        self.drop(client)

    # --- requests ------------------------------------------------------------------------
    def handle(self, client: Client, data: bytes, fds: list[int]) -> None:
        """Serve one message; every failure becomes an error reply."""
        try:
            msg = protocol.decode(data)
        except ProtocolError as exc:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            op, seq = (struct.unpack_from("<4xH2xI", data) if len(data) >= 12 else (0, 0))
            client.kicked = True
            self.stats["protocol_errors"] += 1
            client.send(protocol.encode_error(op, seq, errno.EPROTO,
                                              f"not a softverbs client: {exc}"))  # fmt: skip
            client.alive = False
            return
        op, seq = msg.op, msg.header.seq
        if msg.header.flags & protocol.FLAG_REPLY:
            self._close(fds)
            self._kick(client, op.code, seq, "a client sends requests, not replies")
            return
        if not client.greeted and op is not api.HELLO:
            self._close(fds)
            self._kick(client, op.code, seq, f"{op.name} before HELLO")
            return
        if op is api.DOORBELL:  # the data path: no reply, no resources
            self._close(fds)
            try:
                self.host.execute(client.owner, op, msg.body)
            except PyverbsError as exc:
                self.stats["doorbell_errors"] += 1
                log.debug("doorbell of pid %d: %s", client.pid, exc)
            return
        reply, passed = self._dispatch(client, op, msg, fds)
        client.send(reply, passed)
        if client.kicked:
            client.alive = False

    @staticmethod
    def _close(fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        fds.clear()

    def _dispatch(self, client: Client, op: api.Op[Any, Any], msg: protocol.Message,
                  fds: list[int]) -> tuple[bytes, list[int]]:  # fmt: skip
        """The reply to one request, and the descriptors it passes (a reply too
        long for a message passes its tail as a memfd).  Descriptors nobody took
        are closed."""
        try:
            out = self._serve(client, op, msg, fds)
        finally:
            self._close(fds)
        return (out, []) if isinstance(out, bytes) else out

    def _serve(self, client: Client, op: api.Op[Any, Any], msg: protocol.Message,
               fds: list[int]) -> bytes | tuple[bytes, list[int]]:  # fmt: skip
        """A reply (and what it passes), or an error reply."""
        seq = msg.header.seq
        try:
            local = _LOCAL.get(op.code)
            if op.code in _CM_COMMANDS:
                body, tail = self.op_cm(client, op, msg.body)
            elif local is not None:
                body, tail = local(self, client, msg.body, msg.tail, fds)
            else:
                res = self.resources(client, op, msg.body, fds, msg.tail)
                try:
                    body, tail = self.host.execute(client.owner, op, msg.body, res)
                except BaseException:
                    for close in res.release:
                        close()
                    raise
            return protocol.encode_reply(op, seq, body, tail)
        except PyverbsRDMAError as exc:
            code = exc.error_code if exc.error_code > 0 else errno.EINVAL
            return protocol.encode_error(op.code, seq, code, _bare(exc))
        except PyverbsError as exc:
            return protocol.encode_error(op.code, seq, errno.EINVAL, _bare(exc))
        except ProtocolError as exc:
            self.stats["protocol_errors"] += 1
            client.kicked = True
            return protocol.encode_error(op.code, seq, errno.EPROTO,
                                         f"not a softverbs client: {exc}")  # fmt: skip
        except (ValueError, OverflowError, struct.error) as exc:
            return protocol.encode_error(op.code, seq, errno.EINVAL, f"bad {op.name}: {exc}")
        except OSError as exc:
            return protocol.encode_error(op.code, seq, exc.errno or errno.EIO, f"{op.name}: {exc}")
        except Exception as exc:  # a bug: log it, answer, keep serving
            self.stats["internal_errors"] += 1
            log.exception("request %s of pid %d", op.name, client.pid)
            return protocol.encode_error(op.code, seq, errno.EIO,
                                         f"internal error in softverbsd serving {op.name}: "
                                         f"{exc!r}")  # fmt: skip

    # --- what descriptors become -------------------------------------------------------------
    def resources(self, client: Client, op: api.Op[Any, Any], body: Any, fds: list[int],
                  tail: bytes = b"") -> Resources:  # fmt: skip
        """Turn the descriptors a request passed into what it needs (checked)."""
        res = Resources()
        code = op.code
        if code in (api.OPEN_DEVICE.code, api.CREATE_COMP_CHANNEL.code):
            (fd,) = _fds(fds, 1, op.name)
            ev = _event_socket(fd, client)
            res.release.append(ev.close)
            res.sink = _async_sink(ev) if code == api.OPEN_DEVICE.code else _comp_sink(ev)
        elif code in (api.REG_MR.code, api.REREG_MR.code):
            if body.flags & api.REG_MR_HAS_FD:
                (fd,) = _fds(fds, 1, op.name)
                if body.offset + body.length > MAX_MAPPED:
                    os.close(fd)
                    raise einval(f"{op.name}: a region of {body.length} bytes at offset "
                                 f"{body.offset} is larger than the device maps")  # fmt: skip
                region = _map(fd, body.offset + body.length, op.name)
                res.span = region.view[body.offset : body.offset + body.length]
                res.release.append(region.close)
            else:
                _fds(fds, 0, op.name)
        elif code in (api.CREATE_CQ.code, api.RESIZE_CQ.code):
            (fd,) = _fds(fds, 1, op.name)
            cqe = int(body.cqe)
            if not 1 <= cqe <= 1 << 20:
                os.close(fd)
                raise einval(f"{op.name}: cqe {cqe} is out of range")
            region = _map(fd, HEADER_SIZE + cqe * CQE_SIZE, op.name)
            res.cq = shared_cq(region, cqe)
            res.release.append(region.close)
        elif code in (api.CREATE_SRQ.code, api.MODIFY_SRQ.code):
            if code == api.MODIFY_SRQ.code and not body.mask & 1:  # IBV_SRQ_MAX_WR
                _fds(fds, 0, op.name)
                return res
            (fd,) = _fds(fds, 1, op.name)
            size = int(body.max_wr)
            max_sge = int(getattr(body, "max_sge", 0)) if code == api.CREATE_SRQ.code else \
                self._srq_max_sge(client, body.srq)  # fmt: skip
            slot = _slot(body.slot, recv_slot_size(max_sge), op.name) if \
                code == api.CREATE_SRQ.code else recv_slot_size(max_sge)  # fmt: skip
            if not 1 <= size <= 1 << 20:
                os.close(fd)
                raise einval(f"{op.name}: max_wr {size} is out of range")
            region = _map(fd, HEADER_SIZE + size * slot, op.name)
            res.srq = shared_srq(region, size, slot, max_sge)
            res.release.append(region.close)
        elif code == api.CREATE_QP.code:
            want = (1 if body.sq_slot else 0) + (1 if body.rq_slot else 0)
            taken = _fds(fds, want, op.name)
            caps = body.caps
            opcodes = ALLOWED_OPCODES.get(body.qp_type, frozenset()) | {WR_DRIVER1}
            for is_send, slot, size, least in (
                (True, body.sq_slot, caps.max_send_wr,
                 send_slot_size(caps.max_send_sge, caps.max_inline_data)),
                (False, body.rq_slot, caps.max_recv_wr, recv_slot_size(caps.max_recv_sge)),
            ):  # fmt: skip
                if not slot:
                    continue
                size = ring_slots(size)
                fd = taken.pop(0)
                try:
                    _slot(slot, least, op.name)
                    if size > 1 << 20:
                        raise einval(f"{op.name}: a queue of {size} WQEs is too large")
                except PyverbsRDMAError:
                    for other in [fd, *taken]:
                        os.close(other)
                    raise
                region = _map(fd, HEADER_SIZE + size * slot, op.name)
                ring = shared_work_ring(region, size, slot, is_send, frozenset(opcodes))
                res.release.append(region.close)
                if is_send:
                    res.sq = ring
                else:
                    res.rq = ring
        elif code == api.CAPTURE.code:
            (fd,) = _fds(fds, 1, op.name)
            try:
                mode = os.fstat(fd).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
                    raise einval("CAPTURE: the descriptor is not a file or a pipe")
                res.file = os.fdopen(fd, "wb", buffering=0)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            res.release.append(res.file.close)
        elif code == api.FAULTS.code:
            _fds(fds, 0, op.name)
            res.text = tail.decode("utf-8", "replace")
        elif code == api.SANITIZE.code:
            (fd,) = _fds(fds, 1, op.name)
            res.file = os.fdopen(fd, "wb", buffering=0)
            res.release.append(res.file.close)
            res.text = tail.decode("utf-8", "replace")
        elif code == api.OPEN_XRCD.code:
            if body.flags & api.OPEN_XRCD_HAS_FD:
                (fd,) = _fds(fds, 1, op.name)
                try:
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                res.file_key = (st.st_dev, st.st_ino)
            else:
                _fds(fds, 0, op.name)
        else:
            _fds(fds, 0, op.name)
        return res

    def _srq_max_sge(self, client: Client, handle: int) -> int:
        from softverbs.device.api import KIND_SRQ

        return int(self.host.obj(client.owner, handle, KIND_SRQ).engine.max_sge)

    # --- the service's own operations ---------------------------------------------------------
    def op_hello(self, client: Client, req: api.Hello, tail: bytes,
                 fds: list[int]) -> tuple[Any, bytes]:  # fmt: skip
        if req.version != protocol.PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {req.version}; this service speaks "
                                f"{protocol.PROTOCOL_VERSION}")  # fmt: skip
        if client.greeted:
            raise ProtocolError("HELLO twice")
        if req.flags & ~(api.HELLO_MEMORY | api.HELLO_JOIN):
            raise ProtocolError(f"unknown HELLO flags {req.flags:#x}")
        if req.flags & api.HELLO_JOIN:
            parent = self.host.owner_by_token(req.token)
            if parent is None or parent.uid != client.uid:
                raise PyverbsRDMAError("HELLO: no owner of this user has that token (join "
                                       "what the parent process holds)", errno.EPERM)  # fmt: skip
            self.host.owners.discard(client.owner)
            client.owner = parent
            parent.connections += 1
        if req.flags & api.HELLO_MEMORY:
            (fd,) = _fds(fds, 1, "HELLO")
            try:
                _own_memory(fd, client, req.pid)
            except BaseException:
                os.close(fd)
                raise
            if client.owner.memory is not None:  # joined: the memory is the first process's
                os.close(fd)
            else:
                client.owner.memory = ProcessMemory(fd, client.pid)
        client.greeted = True
        return api.HelloReply(client.owner.token, protocol.PROTOCOL_VERSION, os.getpid(),
                              len(self.registry.entries()), 0), b""  # fmt: skip

    def op_status(self, client: Client, req: api.Empty, tail: bytes,
                  fds: list[int]) -> tuple[Any, bytes]:  # fmt: skip
        """The service, its clients and their objects (the asking one left out)."""
        described = self.host.describe(skip={client.owner, self.registry.owner})
        others = []
        live: Counter[str] = Counter()
        for o in described["owners"]:
            mine = Counter(obj["kind"] for obj in o["objects"])
            live.update(mine)
            others.append({"pid": o["pid"], "uid": o["uid"], "label": o["label"],
                           "objects": dict(mine), "handles": o["objects"]})  # fmt: skip
        hcas = [d.hca for d in self._devices() if d.hca is not None]
        out = {
            "pid": os.getpid(), "socket": self.path, "uptime": time.monotonic() - self.started,
            "mode": compiled.mode(),  # compiled with Cython, or interpreted
            "idle_exit": self.idle_exit, "clients": len(others), "processes": others,
            "objects": dict(live), "devices": sorted(d.name for d in self._devices()),
            "engine_qps": sum(len(h.qps) for h in hcas), "keys": sum(len(h.keys) for h in hcas),
            "xrc_qps": len(described["xrc_rcv_qps"]), "xrc_rcv_qps": described["xrc_rcv_qps"],
            "xrc_srqs": sum(len(h.srqs) for h in hcas), "xrcds": sum(len(h.xrcds) for h in hcas),
            "stats": {**dict(self.stats), **{k: v for k, v in self.host.stats.items()
                                             if k == "cleanup_errors"}},
            # for `softverbs res`: every device served (index, name), the CM IDs on each
            "links": [{"ifindex": e.index, "ifname": e.name} for e in self.registry.entries()],
            "cm_ids": _cm_ids(self),
            "cm_listening": _cm_listening(self),
        }  # fmt: skip
        return api.Empty(), json.dumps(out).encode()

    def op_cm(self, client: Client, op: api.Op[Any, Any], req: Any) -> tuple[Any, bytes]:
        """A ``CM_*`` command for the service's CM agent (cm/service.py)."""
        from softverbs.cm import service as cm

        return cm.handle(self, client, op.code, req), b""

    def op_cm_events(self, client: Client, req: api.Handle, tail: bytes,
                     fds: list[int]) -> tuple[Any, bytes]:  # fmt: skip
        """Where the CM events of event channel ``req.handle`` go (a socket it passed)."""
        (fd,) = _fds(fds, 1, "CM_EVENTS")
        sock = _event_socket(fd, client)
        old = client.cm_events.pop(req.handle, None)
        if old is not None:
            old.close()
        if len(client.cm_events) >= MAX_CM_CHANNELS:
            sock.close()
            raise einval(f"a process may have {MAX_CM_CHANNELS} RDMA CM event channels")
        client.cm_events[req.handle] = sock
        return api.Empty(), b""

    def cm_event(self, client: Client, channel: int, event: dict[str, Any]) -> None:
        sock = client.cm_events.get(channel)
        if sock is not None:
            from softverbs.cm.wire import event_record

            sock.write(event_record(event).pack())
        else:
            client.events_dropped += 1

    # --- lifetime ------------------------------------------------------------------------------
    def drop(self, client: Client) -> None:
        """The process is gone: release everything it held."""
        if self.clients.pop(client.sock, None) is None:
            return
        with contextlib.suppress(Exception):
            self.sel.unregister(client.sock)
        client.alive = False
        client.discard()
        with contextlib.suppress(OSError):
            client.sock.close()
        try:  # its RDMA CM IDs first: their peers get a DREQ or REJ
            from softverbs.cm import service as cm

            cm.drop(self, client)
        except Exception:
            log.exception("dropping the CM IDs of pid %d", client.pid)
        for sock in client.cm_events.values():
            sock.close()
        client.cm_events.clear()
        owner = client.owner
        owner.connections -= 1
        try:
            if owner.connections <= 0:
                self.host.close_owner(owner)
        except Exception:
            self.stats["internal_errors"] += 1
            log.exception("cleanup of pid %d", client.pid)
        self.stats["clients_dropped"] += 1
        if client.events_dropped:
            self.stats["events_dropped"] += client.events_dropped

    def _shutdown(self) -> None:
        for client in list(self.clients.values()):
            self.drop(client)
        with contextlib.suppress(Exception):
            self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.registry.shutdown()
        self._release_pidfile()


def _cm_ids(service: Service) -> dict[str, int]:
    """How many RDMA CM IDs are bound to each device (none if no CM agent runs)."""
    from softverbs.cm import service as cm

    agent = cm._agents.get(service)
    if agent is None:
        return {}
    return dict(Counter(cid.dev for cid in agent.ids.values() if cid.dev))


def _cm_listening(service: Service) -> list[int]:
    """The ports RDMA CM IDs listen on (what a client may connect to now)."""
    from softverbs.cm import service as cm
    from softverbs.cm.states import RdmaState

    agent = cm._agents.get(service)
    if agent is None:
        return []
    return sorted({cid.src[1] for cid in list(agent.ids.values())
                   if cid.state == RdmaState.LISTEN and cid.src is not None})  # fmt: skip


def _async_sink(ev: EventSocket) -> Callable[[api.AsyncEventRecord, str], None]:
    def sink(rec: api.AsyncEventRecord, reason: str) -> None:
        ev.write(rec.pack() + reason.encode("utf-8", "replace")[:1024])

    return sink


def _comp_sink(ev: EventSocket) -> Callable[[int], None]:
    def sink(cq: int) -> None:
        ev.write(api.CompEventRecord(cq, 0).pack())

    return sink


#: Operations the service serves itself (the rest go to the host).
_LOCAL: dict[int, Callable[..., tuple[Any, bytes]]] = {
    api.HELLO.code: Service.op_hello,
    api.STATUS.code: Service.op_status,
    api.CM_EVENTS.code: Service.op_cm_events,
}
#: the RDMA CM's commands: served by the CM agent (Service.op_cm)
_CM_COMMANDS = frozenset(op.code for op in api.CM_OPS) - {api.CM_EVENTS.code}


def _bare(exc: PyverbsError) -> str:
    """An error message without pyverbs' '. Errno: N, text' suffix."""
    return str(exc).split(". Errno:")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="softverbsd", description="the softverbs device service")
    parser.add_argument("--socket", default=protocol.default_socket_path())
    parser.add_argument("--pidfile", help="default: the socket path + '.pid'")
    parser.add_argument("--idle-exit", type=float, default=0.0, metavar="SECONDS",
                        help="exit after this many seconds without a client (0: never)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s softverbsd[%(process)d] %(levelname)s %(message)s")
    try:
        config.ensure_socket_dir(args.socket, "--socket")
        from softverbs.trace import environment_trace

        environment_trace()  # SOFTVERBS_TRACE: open now, so a bad file fails the start
        service = Service(args.socket, pidfile=args.pidfile, idle_exit=args.idle_exit)
    except ServiceRunning as exc:
        print(f"softverbsd: {exc}", file=sys.stderr)
        return 3
    except ConfigError as exc:
        print(f"softverbsd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"softverbsd: cannot listen on {args.socket}: {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: service.stop())
    print(f"softverbsd: serving on {args.socket} (pid {os.getpid()})", flush=True)
    service.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

