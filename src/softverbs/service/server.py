"""``softverbsd``: the host device service, an owner that outlives processes.

The service holds the engines of the host's devices -- ``sv0``, the host
device every process reaches with no setup, and the UDP links of the
``softverbs link`` table -- and executes the operations of
:mod:`softverbs.device.ops` for every process that connects, Python or C,
through the same :class:`~softverbs.device.core.Host` an in-process device
uses.  The service adds only what crossing a process boundary needs:

* **Who is asking.**  A connection's peer is identified by ``SO_PEERCRED``:
  only the service's own user (or root) may connect, and each connection is
  one :class:`~softverbs.device.core.Owner`.  Its objects are named by
  handles no other connection can use.
* **Bytes.**  Requests arrive as :mod:`~softverbs.device.protocol`
  messages; descriptors passed with them become what the request needs
  (one rule per kind of what an operation takes, :data:`TAKES`, as the ops
  table of :mod:`softverbs.device.ops` declares it): shared-memory rings the service maps, a memfd
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
per-client queue.  It sleeps in epoll between messages and the writes
of the clients' doorbell eventfds (``_Bell``, docs/rings.md); with
``SOFTVERBS_SPIN_US`` it polls for that long after serving a client first,
and drivers then skip the doorbell messages of the send queues it polls
(doorbell suppression: docs/rings.md, where the ordering argument is).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import platform
import select
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from softverbs import compiled, config
from softverbs.device import ops, protocol, records
from softverbs.device.core import ALLOWED_OPCODES, DeviceRuntime, Owner, Resources
from softverbs.device.memory import ProcessMemory
from softverbs.device.protocol import ProtocolError
from softverbs.device.qp import (
    QPObj,
    ring_deferred,
    send_queue_header,
    send_queues,
)
from softverbs.device.srq import SRQObj
from softverbs.engine import memory as engine_memory
from softverbs.engine.rings import (
    C_CONSTANTS,
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
from softverbs.enums import IBV_SRQ_MAX_WR
from softverbs.errors import ConfigError, PyverbsError, PyverbsRDMAError, einval
from softverbs.layout import Record
from softverbs.verbs.registry import Registry

log = logging.getLogger("softverbsd")

#: replies a client may leave unread before it is disconnected
MAX_BACKLOG = 4096
#: messages read from one client before the loop serves the others
READ_BATCH = 64
#: at most this many turns read one message from a client before draining it again (_read)
QUIET_TURNS = 64
#: the largest ring slot a client may ask for
MAX_SLOT = records.MAX_SLOT
#: the largest memory region a client may pass as a memfd
MAX_MAPPED = 1 << 40
#: RDMA CM event channels (sockets) one process may register
MAX_CM_CHANNELS = 1024
#: microseconds the loop polls before it sleeps, after serving a client (_wait)
SPIN_US = 0.0
#: send queues the loop polls at once while it spins (more ring by message only)
MAX_POLLED = 64
#: the send queue header words the loop reads and writes (docs/rings.md)
SQ_DB, SQ_POLLED = C_CONSTANTS["SQ_DB"], C_CONSTANTS["SQ_POLLED"]
_KIND_QP = QPObj.KIND


class _Fence:
    """A full memory barrier, which Python has no statement for.

    A ``FUTEX_WAKE`` system call on a word nobody waits on is one on every
    architecture Linux runs on: the kernel orders it with ``smp_mb()`` before
    it looks for waiters (the ordering argument at the top of Linux's
    kernel/futex/waitwake.c).  About a microsecond; the loop needs one each
    time it stops polling its rings, not per message.  ``available`` is False
    where the system call number is not known: the loop then never offers
    doorbell suppression and every post rings by message."""

    #: SYS_futex by machine
    SYSCALL = {"x86_64": 202, "aarch64": 98, "riscv64": 98, "ppc64le": 221, "s390x": 238}
    FUTEX_WAKE_PRIVATE = 1 | 128

    def __init__(self) -> None:
        self.number = self.SYSCALL.get(platform.machine(), 0)
        self.word = ctypes.c_uint32(0)
        self.available = False
        if self.number:
            try:
                self._syscall = ctypes.CDLL(None, use_errno=True).syscall
                self.available = self() >= 0
            except (OSError, AttributeError):
                self.available = False

    def __call__(self) -> int:
        return int(self._syscall(self.number, ctypes.byref(self.word),
                                 self.FUTEX_WAKE_PRIVATE, 1, None, None, 0))  # fmt: skip


class _Polled:
    """A send queue the loop polls while it spins: its header words, the
    doorbell it last acted on, and whose it is."""

    __slots__ = ("client", "db", "handle", "hdr")

    def __init__(self, client: Client, handle: int, hdr: memoryview) -> None:
        self.client = client
        self.handle = handle
        self.hdr = hdr
        self.db = int(hdr[SQ_DB])


class _Bell:
    """A client's doorbell eventfd (``HELLO_DOORBELL_FD``, docs/rings.md).

    The client stores a send queue's ``db`` and then writes 1 to the eventfd
    instead of sending a ``DOORBELL`` message.  The loop's epoll holds the
    eventfd *edge-triggered* and never reads it: every write is a wake-up (the
    kernel wakes the eventfd's waiters on each write, and an edge-triggered
    item goes back on the ready list at each wake-up), writes between two
    turns wake it once, and the counter the service never reads is the
    client's alone.  Whatever the client does to its side -- never writes,
    writes any value, reads the counter back (epoll checks that it is still
    readable when it reports it, so a read right after a write can lose that
    write's wake-up), fills it so that its own writes fail, clears
    ``O_NONBLOCK``, closes it -- only delays its own queues: the service makes
    no system call on the descriptor but ``epoll_ctl``.  A
    flood costs the service one scan per turn, as a turn's reads of a flood of
    messages are bounded by READ_BATCH.

    On a wake the loop compares each of the owner's send queues' ``db`` with
    the last it acted on (:attr:`seen`) and rings those that moved -- the
    doorbell a message would ring.  The loop also compares them before it
    serves any other request of the client: a write of the eventfd has no
    place in the socket's order, and a request must see the posts made before
    it (a destroy, a move to ERR, the sanitizer's checks).  The list of the
    owner's QPs (:attr:`queues`) is built again only when the host made or
    destroyed a QP since (:attr:`made`), so a scan costs one read per send
    queue, not a walk of every object the process holds.  It holds the QP
    records and their send queues' header words -- the ring's own view of
    them, which a destroy releases (so the ring's memory is still unmapped);
    a QP destroyed since it was listed is skipped before its header is read."""

    __slots__ = ("client", "fd", "made", "queues", "seen")

    def __init__(self, client: Client, fd: int) -> None:
        self.client = client
        self.fd = fd
        #: (handle, record, send queue header) of the owner's QPs with a send queue
        self.queues: list[tuple[int, QPObj, memoryview]] = []
        #: the host's count of QPs made and destroyed when :attr:`queues` was built
        self.made = -1
        #: QP handle -> the last ``db`` rung for it (kept across rebuilds)
        self.seen: dict[int, int] = {}


class _Selector(selectors.EpollSelector):
    """selectors' epoll, which can also hold a descriptor edge-triggered; the
    loop's wait reads its epoll object and its keys directly (:meth:`Service._ready`)."""

    def __init__(self) -> None:
        super().__init__()
        # selectors keeps its epoll object and its keys private; the loop's
        # wait reads both directly, once per turn
        self.epoll: select.epoll = vars(self)["_selector"]
        self.keys: dict[int, selectors.SelectorKey] = vars(self)["_fd_to_key"]

    def register_edge(self, fd: int, data: object) -> None:
        """Hold ``fd`` for reading, reported once per wake-up of its waiters."""
        self.register(fd, selectors.EVENT_READ, data)
        self.epoll.modify(fd, select.EPOLLIN | select.EPOLLET)  # selectors has no such mode


#: epoll's events as selectors' (selectors.EpollSelector.select)
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_NOT_IN, _NOT_OUT = ~select.EPOLLIN, ~select.EPOLLOUT
#: what the loop's two descriptors of its own are registered with (compared by identity)
_LISTEN, _WAKE = "listen", "wake"
#: the signals that stop softverbsd (Service.stop_on_signals)
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def _eventfd(fd: int) -> bool:
    """Whether ``fd`` is an eventfd (its /proc link names the anonymous inode)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
    except OSError:
        return False


def _spin_setting() -> float:
    """``SOFTVERBS_SPIN_US`` in seconds (ConfigError if it is not a number of microseconds)."""
    text = os.environ.get("SOFTVERBS_SPIN_US", "").strip()
    if not text:
        return SPIN_US / 1e6
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1e6:
        raise ConfigError(f"SOFTVERBS_SPIN_US={text!r}: give the microseconds the service "
                          f"polls before it sleeps, 0 to 1000000 (0: never poll)")  # fmt: skip
    return value / 1e6


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
        #: this process's own memory when it joined another's owner (a forked
        #: child): the regions it registers are its pages, not its parent's
        self.memory: ProcessMemory | None = None
        self.memory_lent = False  #: a region may use it: it stays until the owner goes
        self.alive = True
        self.greeted = False
        self.kicked = False  #: disconnect once the error reply is out
        #: replies not sent yet, with the descriptors they pass (closed once sent)
        self.outq: deque[tuple[bytes, list[int]]] = deque()
        self.events_dropped = 0
        #: turns left in which the loop reads one message, not all (Service._read)
        self.single = 0
        self.quiet = 0  #: how many such turns follow a drain that finds one message
        #: RDMA CM event channel number -> the socket its events go to
        self.cm_events: dict[int, EventSocket] = {}
        self.bell: _Bell | None = None  #: its doorbell eventfd (HELLO_DOORBELL_FD)
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
        self.sel = _Selector()
        self._epoll, self._keys = self.sel.epoll, self.sel.keys  #: what the wait reads (_ready)
        self.stats: Counter[str] = Counter()
        #: send queues rung by eventfd wake-ups, not yet in :attr:`stats` (a C integer
        #: compiled: counted per wake-up, added to stats when they are read, op_status)
        self._eventfd_rung = 0
        self.started = time.monotonic()
        self._idle_since: float | None = time.monotonic()
        #: stop() was called: the loop ends after its turn (a flag, not an Event: the
        #: loop reads it every turn, and stop() wakes the wait itself)
        self._stopping = False
        self._writers: set[Client] = set()
        self._writers_lock = threading.Lock()
        #: seconds the loop polls before it sleeps, after serving a client (_wait)
        self.spin = _spin_setting()
        self._busy = 0.0  #: when the loop last served a client
        self._fence = _Fence()
        #: the send queues polled while spinning (handle -> _Polled), and whether
        #: their ``polled`` words are set now
        self._polled: dict[int, _Polled] = {}
        self._flagged = False
        #: runtimes whose devices' doorbells rang since their engines last ran (_doorbell)
        self._rung: set[DeviceRuntime] = set()
        #: the next wait's timeout: the earliest engine timer (_progress)
        self._timeout = 1.0
        #: the runtimes of the open devices (_runtimes), None when to be listed again,
        #: and how many devices there were when they were listed
        self._runtime_list: list[DeviceRuntime] | None = None
        self._runtime_devices = 0
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
        self.sel.register(self.listener, selectors.EVENT_READ, _LISTEN)
        self.sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)

    def _release_pidfile(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pidfile)
        with contextlib.suppress(OSError):
            os.close(self._pid_fd)

    # --- the loop ------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stopping:
                self._turn()
        finally:
            self._shutdown()

    def _devices(self) -> list[Any]:
        return [d for d in list(self.registry.devices.values()) if d.core is not None]

    def _turn(self) -> None:
        """One pass of the loop: wait, serve what is ready, run the engines.

        The wait's timeout is the earliest engine timer, as :meth:`_progress`
        found it at the end of the turn before (nothing runs between the two)."""
        if self._writers:  # _want_write wakes the loop after it adds one
            self._register_writers()
        served = False
        for key, mask in self._wait(self._timeout):
            data = key.data
            if type(data) is _Bell:  # the data path first: a client rang its eventfd
                self._rang(data)
                served = True
            elif data is _LISTEN:
                self._accept()
            elif data is _WAKE:
                self._woken()
            else:
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if mask & _WRITE:
                    self._write(sock)
                if mask & _READ:
                    self._read(sock)
                    served = True
        if served and self.spin:  # only the spin (_wait) asks when the loop last served
            self._busy = time.monotonic()
        self._timeout = self._progress(self._runtimes())
        for client in self.clients.values():
            if not client.alive:  # rare: list the gone ones, then drop them
                for gone in [c for c in self.clients.values() if not c.alive]:
                    self.drop(gone)
                break
        if self.idle_exit:
            self._check_idle()

    def _runtimes(self) -> list[DeviceRuntime]:
        """The runtimes of the open devices, each once: the in-process devices
        share one, whose progress loop runs them all.  Kept from turn to turn
        (:attr:`_runtime_list`): devices are opened and closed only by requests
        and by a client's going, which drop it (:meth:`handle`, :meth:`drop`)."""
        out = self._runtime_list
        if out is None or len(self.registry.devices) != self._runtime_devices:
            devices = list(self.registry.devices.values())
            out = []
            for dev in devices:
                if dev.core is not None and dev.runtime not in out:
                    out.append(dev.runtime)
            self._runtime_list = out
            self._runtime_devices = len(devices)
        return out

    def _progress(self, runtimes: Iterable[DeviceRuntime]) -> float:
        """Run the engines of ``runtimes``: every doorbell rung so far is served.
        The seconds until the earliest of their timers (at most one), under the
        same hold of each runtime's lock."""
        timeout = 1.0
        for runtime in runtimes if type(runtimes) is list else list(runtimes):
            runtime.lock.acquire()  # as ``with``, without its two bound methods (_rang)
            try:
                runtime.progress()
                nxt = runtime.next_deadline()
                if nxt is not None:
                    # the deadline and the clock as C doubles: no float made between them
                    deadline = nxt
                    now = runtime.clock.now()
                    timeout = min(timeout, max(0.0, deadline - now))
            except Exception:  # the engine must not take the service down
                self.stats["engine_errors"] += 1
                names = [d.name for d in list(self.registry.devices.values())
                         if d.runtime is runtime]  # fmt: skip
                log.exception("engine progress on %s", ", ".join(names))
            finally:
                runtime.lock.release()
        if self._rung:
            self._rung.clear()
        return timeout

    def _wait(self, timeout: float) -> list[tuple[selectors.SelectorKey, int]]:
        """What is ready, waiting at most ``timeout`` seconds.

        After a turn that served a client (``_busy``), the loop polls without
        sleeping for up to :attr:`spin` seconds before it blocks in epoll: a
        ping-pong's next doorbell usually arrives within a round trip, and
        finding it by polling saves the sleep and the wake-up (the scheduler
        has to give the service a core back).  Meanwhile it polls the send
        queues that rang it too (doorbell suppression, docs/rings.md).  The
        polls do not yield the core: a service that yields waits behind every
        other runnable task for its next poll, which made a spinning C program's
        SENDs six times slower on two cores (docs/performance.md).  An idle
        service never spins; ``SOFTVERBS_SPIN_US`` unset, it never does (nor
        reads the clock)."""
        if not self.spin:
            return self._ready(timeout)
        if self._polled and not self._flagged and self._poll_rings():
            return []  # a store of db the loop missed (see _unflag): serve it now
        spin_end = self._busy + self.spin
        now = time.monotonic()
        if now < spin_end and timeout > 0:
            self._flag()
            while True:
                if self._polled and self._poll_rings():
                    return []
                ready = self._ready(0.0)
                if ready:
                    return ready
                now = time.monotonic()
                if now >= spin_end:
                    break
            self.stats["spins_expired"] += 1
            timeout = max(0.0, timeout - self.spin)
        if self._flagged:
            self._unflag()
            if self._poll_rings():  # posted before the client could see the flag go
                return []
        return self._ready(timeout)

    def _ready(self, timeout: float) -> list[tuple[selectors.SelectorKey, int]]:
        """What ``selectors``' ``select`` returns, without its Python frames: the
        keys ready within ``timeout`` seconds and their events.  The epoll
        object rounds the timeout up to the millisecond itself (CPython's
        ``epoll.poll`` converts with ``_PyTime_ROUND_CEILING``), so a timer is
        never woken for early."""
        keys = self._keys
        out = []
        for fd, ev in self._epoll.poll(timeout, len(keys) or 1):
            key = keys.get(fd)
            if key is not None:  # as select(): a descriptor it no longer holds is skipped
                mask = (_WRITE if ev & _NOT_IN else 0) | (_READ if ev & _NOT_OUT else 0)
                out.append((key, mask & key.events))
        return out

    # --- doorbell suppression (docs/rings.md) ---------------------------------------------------
    def _watch(self, client: Client, handle: int) -> None:
        """A DOORBELL message is about to ring ``handle``'s send queue: poll it
        from now on.  The ``db`` it starts from is read before the doorbell
        runs, so a store the doorbell misses still differs from it; the loop
        moves it only to a value it read before running a doorbell itself
        (_poll_rings): a doorbell run twice finds nothing new, one never run
        would leave WQEs unseen."""
        if len(self._polled) >= MAX_POLLED or not self._fence.available or not self.spin:
            return
        try:
            with self.host.lock:
                hdr = send_queue_header(self.host, client.owner, handle)
        except PyverbsError:
            return
        if hdr is None:
            return
        polled = self._polled[handle] = _Polled(client, handle, hdr)
        if self._flagged:
            polled.hdr[SQ_POLLED] = 1

    def _poll_rings(self) -> bool:
        """Serve every polled send queue whose ``db`` moved; whether one did."""
        served = False
        for polled in self._polled.values():  # a doorbell never changes the dict
            db = polled.hdr[SQ_DB]
            if db == polled.db:
                continue
            polled.db = int(db)
            served = True
            engine_memory.new_pass()  # as for a DOORBELL message (handle)
            self.stats["doorbells_polled"] += 1
            self._doorbell(polled.client, polled.handle, records.DB_SQ)
        if served:
            self._busy = time.monotonic()
        return served

    def _flag(self) -> None:
        """The loop polls: tell the polled queues' drivers not to send DOORBELLs."""
        if not self._flagged:
            for polled in self._polled.values():
                polled.hdr[SQ_POLLED] = 1
            self._flagged = True

    def _unflag(self) -> None:
        """The loop stops polling: clear the flags, then the fence, so that the
        loop's next load of each ``db`` (_poll_rings) comes after its store of
        0 -- the driver's side stores db, fences, then loads the flag, so
        either it sees 0 and sends a DOORBELL, or the loop sees its db."""
        for polled in self._polled.values():
            polled.hdr[SQ_POLLED] = 0
        self._flagged = False
        self._fence()

    def _forget_polled(self) -> None:
        """Stop polling every queue (before any request that may destroy or
        change one, and when a client goes): its driver rings by message again."""
        if self._polled:
            if self._flagged:
                self._unflag()
            self._polled.clear()

    # --- doorbell eventfds (_Bell) ---------------------------------------------------------------
    def _rang(self, bell: _Bell) -> None:
        """A client wrote its doorbell eventfd: ring its send queues whose ``db`` moved.

        The ``db`` compared is read before the doorbell runs, as for polling
        (_watch): a store racing with the doorbell is a change the next wake
        sees.  A queue new to :attr:`_Bell.seen` rings once if anything was
        ever posted to it (a doorbell run twice finds nothing new)."""
        client = bell.client
        if not client.alive:
            return
        host = self.host
        objects = client.owner.objects
        made = host.changes.get(_KIND_QP, 0)  # a Counter: a missing kind is 0 as by [ ]
        queues = bell.queues
        if made != bell.made:  # a QP may have come or gone: list them again
            try:
                with host.lock:
                    queues = bell.queues = [(handle, rec, sq.hdr)
                                            for handle, rec in send_queues(client.owner)
                                            if (sq := rec.engine.sq) is not None]  # fmt: skip
            except Exception:  # the owner is going: nothing to ring
                self.stats["doorbell_errors"] += 1
                return
            bell.made = made
            self.stats["doorbell_lists"] += 1
            live = {handle for handle, _, _ in queues}
            for handle in [h for h in bell.seen if h not in live]:
                del bell.seen[handle]
        engine_memory.new_pass()  # as for a DOORBELL message (handle)
        seen = bell.seen
        moved: list[QPObj] | None = None
        for handle, rec, hdr in queues:
            if objects.get(handle) is not rec:  # destroyed since it was listed: its header too
                continue
            db = hdr[SQ_DB]
            if seen.get(handle, 0) != db:
                seen[handle] = db
                if moved is None:
                    moved = [rec]
                else:
                    moved.append(rec)
        if moved is None:
            return
        self._eventfd_rung += len(moved)  # into stats when they are read (_stats)
        if self.spin:  # doorbell suppression watches the queues it rings (_ring)
            for rec in moved:
                self._ring(client, rec.handle, records.DB_SQ)
        elif client.owner.closed:  # as _doorbell
            self.stats["doorbell_errors"] += len(moved)
        else:  # the listed records are the owner's QPs: ring them without a lookup (_doorbell)
            # under one take of each runtime's lock and one read of its clock for
            # the run of queues of its devices (one runtime, mostly), not per queue.
            # The locks are taken and released by their methods, not by ``with``
            # (which makes a bound method of each of __enter__ and __exit__ per take,
            # compiled); the ``finally`` releases them as ``with`` would.
            n = len(moved)
            i = 0
            lock = host.lock
            lock.acquire()
            try:
                rec = moved[0]
                while i < n:
                    runtime = rec.device.runtime
                    runtime.lock.acquire()
                    try:
                        now = runtime.clock.now()
                        while True:
                            i += 1
                            eng = rec.engine
                            try:
                                eng.doorbell(now)  # the engine runs next (_progress)
                            except PyverbsError as exc:
                                self.stats["doorbell_errors"] += 1
                                log.debug("doorbell of pid %d: %s", client.pid, exc)
                            else:
                                self._rung.add(runtime)
                            if i == n:
                                break  # the last
                            rec = moved[i]
                            if rec.device.runtime is not runtime:
                                break  # the next is another runtime's
                    finally:
                        runtime.lock.release()
            finally:
                lock.release()

    def _close_bell(self, client: Client) -> None:
        bell, client.bell = client.bell, None
        if bell is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.sel.unregister(bell.fd)
            with contextlib.suppress(OSError):
                os.close(bell.fd)

    def _check_idle(self) -> None:
        if not self.idle_exit:
            return
        if self.clients:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()
        elif time.monotonic() - self._idle_since >= self.idle_exit:
            log.info("no client for %.0f s: exiting", self.idle_exit)
            self._stopping = True

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def stop_on_signals(self) -> None:
        """SIGTERM, SIGINT and SIGHUP stop the loop (main thread only).

        Python runs a signal's handler when the main thread next executes
        bytecode, and the compiled loop may execute none: a signal that arrives
        while it serves, not while it sleeps in epoll (where EINTR runs the
        handler), would wait for the next interpreted call, which a busy
        service may never make.  So the C-level handler also writes the signal's
        number to the wake socket (``signal.set_wakeup_fd``), and the loop stops
        when it reads it (:meth:`_woken`).  The Python handler stays, for a
        loop that runs interpreted."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.stop())
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)

    def _woken(self) -> None:
        """Drain the wake socket: NUL bytes (:meth:`stop`, :meth:`_want_write`) or
        the numbers of signals (:meth:`stop_on_signals`)."""
        with contextlib.suppress(OSError):
            if not STOP_SIGNALS.isdisjoint(self._wake_r.recv(4096)):
                self._stopping = True

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
                ops.HELLO.code, 0, errno.EPERM,
                f"softverbsd of uid {os.getuid()} serves only its own user, not uid {uid}"))
            return
        sock.setblocking(False)
        owner = self.host.add_owner(Owner(f"pid {pid}", pid, uid))
        client = Client(sock, pid, uid, owner, self._want_write)
        self.clients[sock] = client
        self.sel.register(sock, selectors.EVENT_READ, "client")
        self.stats["clients_connected"] += 1

    def _read(self, sock: socket.socket) -> None:
        """Serve what ``sock``'s client sent: drain it, or read one message.

        Draining costs a ``recvmsg`` that finds nothing (BlockingIOError) after
        the last message; a ping-pong sends one message per turn, so a drain
        every turn would add that empty call to each message (one in seven of
        the service's system calls per ``ib_send_lat`` message).  So after a
        drain that found a single message, the next :attr:`Client.quiet` turns
        read one message each (epoll, level-triggered, reports the socket again
        in the next turn if more wait), and that number about doubles, up to
        :data:`QUIET_TURNS`, while drains keep finding one; a drain that finds
        more makes the next turn drain again.

        The DOORBELL messages of a drain ring once per queue (:meth:`_ring_held`),
        after the drain or before the first other request in it: the device
        reads the queue's doorbell record when it rings, which covers every WQE
        whose DOORBELL message was read, so a burst of posts (``ib_write_bw``
        refilling its send queue) costs one fetch and one pass of the requester,
        not one per WQE."""
        client = self.clients.get(sock)
        if client is None:
            return
        budget = READ_BATCH
        if client.single:
            client.single -= 1
            budget = 1
        got = 0
        held: dict[tuple[int, int], int] = {}  # (qp, queue) -> DOORBELL messages read
        decode_doorbell, recv = protocol.decode_doorbell, protocol.recv
        while got < budget:
            try:
                data, fds = recv(sock)
            except BlockingIOError:
                break
            except (EOFError, OSError):  # what it rang before it went is served
                self._ring_held(client, held)
                self.drop(client)
                return
            except ProtocolError as exc:
                self._ring_held(client, held)
                self._kick(client, 0, 0, str(exc))
                return
            got += 1
            if not fds and client.greeted:  # the data path first, in one unpack
                rung = decode_doorbell(data)
                if rung is not None:
                    held[rung] = held.get(rung, 0) + 1
                    continue
            if held:  # the request sees what the doorbells before it started
                self._ring_held(client, held)
            self.handle(client, data, fds)
            if not client.alive:
                client.flush()  # the error that explains the disconnect, if it fits
                self.drop(client)
                return
        if held:
            self._ring_held(client, held)
        if budget > 1:  # a drain
            if got <= 1:
                client.quiet = min(2 * client.quiet + 1, QUIET_TURNS)
                client.single = client.quiet
            else:
                client.quiet = 0

    def _ring_held(self, client: Client, held: dict[tuple[int, int], int]) -> None:
        """Ring each queue of ``held`` (:meth:`_read`) once, in the order the
        first DOORBELL of each was read, and forget them.  One that fails
        counts one error per DOORBELL message it stood for."""
        if not held:
            return
        engine_memory.new_pass()  # they may follow an unmap: check mappings (device/memory.py)
        for (qp, queue), n in held.items():
            if not self._ring(client, qp, queue) and n > 1:
                self.stats["doorbell_errors"] += n - 1
            if n > 1:
                self.stats["doorbells_coalesced"] += n - 1
        held.clear()

    def _kick(self, client: Client, op: int, seq: int, why: str) -> None:
        self.stats["protocol_errors"] += 1
        client.send(protocol.encode_error(op, seq, errno.EPROTO, f"not a softverbs client: {why}"))
        client.flush()
        self.drop(client)

    # --- requests ------------------------------------------------------------------------
    def handle(self, client: Client, data: bytes, fds: list[int]) -> None:
        """Serve one message; every failure becomes an error reply."""
        engine_memory.new_pass()  # it may follow an unmap: check mappings again (device/memory.py)
        if not fds and client.greeted:  # the data path first, in one unpack
            rung = protocol.decode_doorbell(data)
            if rung is not None:
                self._ring(client, rung[0], rung[1])
                return
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
        if not client.greeted and op is not ops.HELLO:
            self._close(fds)
            self._kick(client, op.code, seq, f"{op.name} before HELLO")
            return
        if op is ops.DOORBELL:  # with descriptors (decode_doorbell takes the others)
            self._close(fds)
            self._ring(client, msg.body.qp, msg.body.queue)
            return
        self._forget_polled()
        self._runtime_list = None  # the request may open or close a device
        if client.bell is not None:  # its posts before this request run before it, as a
            self._rang(client.bell)  # DOORBELL message before it on the socket would
        if self._rung:  # the request sees what the doorbells before it started
            self._progress(self._rung)
        reply, passed = self._dispatch(client, op, msg, fds)
        client.send(reply, passed)
        if client.kicked:
            client.alive = False

    def _ring(self, client: Client, qp: int, queue: int) -> bool:
        """A DOORBELL message: the data path, no reply, no resources; whether it rang."""
        if self.spin and queue == records.DB_SQ and qp not in self._polled:
            self._watch(client, qp)  # before the doorbell runs: see _watch
        return self._doorbell(client, qp, queue)

    def _doorbell(self, client: Client, qp: int, queue: int) -> bool:
        """Ring one doorbell, rung by message or found by polling; whether it rang.

        The engine does not run here: :meth:`_turn` runs each device's engine
        once after every doorbell the turn read (batching: a burst of posts
        costs one engine pass, and its WQEs go out in one go)."""
        try:
            if client.owner.closed:
                raise PyverbsRDMAError("the owner of this doorbell is gone", errno.EIO)
            with self.host.lock:
                self._rung.add(ring_deferred(self.host, client.owner, qp, queue).runtime)
        except PyverbsError as exc:
            self.stats["doorbell_errors"] += 1
            log.debug("doorbell of pid %d: %s", client.pid, exc)
            return False
        return True

    @staticmethod
    def _close(fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        fds.clear()

    def _dispatch(self, client: Client, op: records.Op[Any, Any], msg: protocol.Message,
                  fds: list[int]) -> tuple[bytes, list[int]]:  # fmt: skip
        """The reply to one request, and the descriptors it passes (a reply too
        long for a message passes its tail as a memfd).  Descriptors nobody took
        are closed."""
        try:
            out = self._serve(client, op, msg, fds)
        finally:
            self._close(fds)
        return (out, []) if isinstance(out, bytes) else out

    def _serve(self, client: Client, op: records.Op[Any, Any], msg: protocol.Message,
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
                res = TAKES[op.takes](self, client, op, msg.body, fds, msg.tail)
                if op.takes == records.REGION and res.span is None and client.memory is not None:
                    res.memory = client.memory  # a joined child's region: its own pages
                    client.memory_lent = True
                try:
                    reply = self.host.execute(client.owner, op, msg.body, res)
                    body, tail = reply.body, reply.tail
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

    # --- the service's own operations ---------------------------------------------------------
    def op_hello(self, client: Client, req: records.Hello, tail: bytes,
                 fds: list[int]) -> tuple[Any, bytes]:  # fmt: skip
        if req.version != protocol.PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {req.version}; this service speaks "
                                f"{protocol.PROTOCOL_VERSION}")  # fmt: skip
        if client.greeted:
            raise ProtocolError("HELLO twice")
        if req.flags & ~(records.HELLO_MEMORY | records.HELLO_JOIN | records.HELLO_DOORBELL_FD):
            raise ProtocolError(f"unknown HELLO flags {req.flags:#x}")
        want = (1 if req.flags & records.HELLO_MEMORY else 0) + (
            1 if req.flags & records.HELLO_DOORBELL_FD else 0)
        if len(fds) != want:
            raise einval(f"HELLO: expected {want} file descriptor(s) (HELLO_MEMORY, then "
                         f"HELLO_DOORBELL_FD), got {len(fds)}")  # fmt: skip
        bell = fds[-1] if req.flags & records.HELLO_DOORBELL_FD else -1
        if bell >= 0 and not _eventfd(bell):
            raise einval("HELLO: the descriptor passed with HELLO_DOORBELL_FD is not an "
                         "eventfd (create it with eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC))")
        if req.flags & records.HELLO_JOIN:
            parent = self.host.owner_by_token(req.token)
            if parent is None or parent.uid != client.uid:
                raise PyverbsRDMAError("HELLO: no owner of this user has that token (join "
                                       "what the parent process holds)", errno.EPERM)  # fmt: skip
            self.host.owners.discard(client.owner)
            client.owner = parent
            parent.connections += 1
        if req.flags & records.HELLO_MEMORY:
            fd = fds.pop(0)
            try:
                _own_memory(fd, client, req.pid)
            except BaseException:
                os.close(fd)
                raise
            memory = ProcessMemory(fd, client.pid, reuse=True)
            if client.owner.memory is None:
                client.owner.memory = memory
            else:  # joined: kept while the owner lives, for the regions registered here
                client.memory = memory
                client.owner.release.append(memory.close)
        features = 0
        if bell >= 0:
            fds.remove(bell)
            client.bell = _Bell(client, bell)
            try:
                self.sel.register_edge(bell, client.bell)
            except OSError:
                client.bell = None
                os.close(bell)
            else:
                features |= records.FEATURE_DOORBELL_FD
        client.greeted = True
        return records.HelloReply(client.owner.token, protocol.PROTOCOL_VERSION, os.getpid(),
                              len(self.registry.entries()), features), b""  # fmt: skip

    def op_status(self, client: Client, req: records.Empty, tail: bytes,
                  fds: list[int]) -> tuple[Any, bytes]:  # fmt: skip
        """The service, its clients and their objects (the asking one left out)."""
        described = self.host.describe(skip={client.owner, self.registry.owner})
        others = []
        live: Counter[str] = Counter()
        for o in described["owners"]:
            mine = Counter(obj["kind"] for obj in o["objects"])
            live.update(mine)
            others.append({"pid": o["pid"], "uid": o["uid"], "label": o["label"],
                           "objects": dict(mine), "handles": o["objects"],
                           "copies": o.get("copies")})  # fmt: skip
        hcas = [d.hca for d in self._devices() if d.hca is not None]
        if self._eventfd_rung:
            self.stats["doorbells_eventfd"] += self._eventfd_rung
            self._eventfd_rung = 0
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
        return records.Empty(), json.dumps(out).encode()

    def op_cm(self, client: Client, op: records.Op[Any, Any], req: Any) -> tuple[Any, bytes]:
        """A ``CM_*`` command for the service's CM agent (cm/service.py)."""
        from softverbs.cm import service as cm

        return cm.handle(self, client, op.code, req), b""

    def op_cm_events(self, client: Client, req: records.Handle, tail: bytes,
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
        return records.Empty(), b""

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
        self._forget_polled()
        self._runtime_list = None  # its going may close a device (Registry._idle)
        self._close_bell(client)
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
        if client.memory is not None and not client.memory_lent:
            with contextlib.suppress(ValueError):  # no region of it: close it now
                owner.release.remove(client.memory.close)
            client.memory.close()
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


def _async_sink(ev: EventSocket) -> Callable[[records.AsyncEventRecord, str], None]:
    def sink(rec: records.AsyncEventRecord, reason: str) -> None:
        ev.write(rec.pack() + reason.encode("utf-8", "replace")[:1024])

    return sink


def _comp_sink(ev: EventSocket) -> Callable[[int], None]:
    last: list[Any] = [None, b""]  # the last CQ's event record, packed: the next is its, mostly

    def sink(cq: int) -> None:
        if last[0] != cq:
            last[0], last[1] = cq, records.CompEventRecord(cq, 0).pack()
        ev.write(last[1])

    return sink


# --- what descriptors become: one rule per kind of what an operation takes --------------------
# Each rule checks the descriptors a request passed -- how many, what kind of
# file, its size and seals -- and turns them into the Resources the handler
# uses; whatever it does not take is closed by the caller.

Op = records.Op[Any, Any]


def _take_nothing(svc: Service, client: Client, op: Op,
                  body: Record, fds: list[int], tail: bytes) -> Resources:  # fmt: skip
    _fds(fds, 0, op.name)
    return Resources()


def _take_event_socket(svc: Service, client: Client, op: Op,
                       body: Record, fds: list[int], tail: bytes) -> Resources:  # fmt: skip
    (fd,) = _fds(fds, 1, op.name)
    ev = _event_socket(fd, client)
    res = Resources(release=[ev.close])
    if isinstance(body, records.OpenDevice):
        res.events = _async_sink(ev)
    else:
        res.completions = _comp_sink(ev)
    return res


def _take_region(svc: Service, client: Client, op: Op,
                 body: records.RegMR | records.ReregMR, fds: list[int],
                 tail: bytes) -> Resources:  # fmt: skip
    what = op.name
    res = Resources()
    if body.flags & records.REG_MR_HAS_FD:
        (fd,) = _fds(fds, 1, what)
        if body.offset + body.length > MAX_MAPPED:
            os.close(fd)
            raise einval(f"{what}: a region of {body.length} bytes at offset "
                         f"{body.offset} is larger than the device maps")  # fmt: skip
        region = _map(fd, body.offset + body.length, what)
        res.span = region.view[body.offset : body.offset + body.length]
        res.release.append(region.close)
    else:
        _fds(fds, 0, what)
    return res


def _take_cq_ring(svc: Service, client: Client, op: Op,
                  body: records.CreateCQ | records.ResizeCQ, fds: list[int],
                  tail: bytes) -> Resources:  # fmt: skip
    what = op.name
    (fd,) = _fds(fds, 1, what)
    cqe = int(body.cqe)
    if not 1 <= cqe <= 1 << 20:
        os.close(fd)
        raise einval(f"{what}: cqe {cqe} is out of range")
    region = _map(fd, HEADER_SIZE + cqe * CQE_SIZE, what)
    return Resources(cq=shared_cq(region, cqe), release=[region.close])


def _take_srq_ring(svc: Service, client: Client, op: Op,
                   body: records.CreateSRQ | records.ModifySRQ, fds: list[int],
                   tail: bytes) -> Resources:  # fmt: skip
    what = op.name
    if isinstance(body, records.CreateSRQ):
        max_sge = int(body.max_sge)
        slot = _slot(body.slot, recv_slot_size(max_sge), what)
    else:
        if not body.mask & IBV_SRQ_MAX_WR:  # only a resize passes a new ring
            _fds(fds, 0, what)
            return Resources()
        max_sge = svc.host.obj(client.owner, body.srq, SRQObj).engine.max_sge
        slot = recv_slot_size(max_sge)
    (fd,) = _fds(fds, 1, what)
    size = int(body.max_wr)
    if not 1 <= size <= 1 << 20:
        os.close(fd)
        raise einval(f"{what}: max_wr {size} is out of range")
    region = _map(fd, HEADER_SIZE + size * slot, what)
    return Resources(srq=shared_srq(region, size, slot, max_sge), release=[region.close])


def _take_qp_rings(svc: Service, client: Client, op: Op,
                   body: records.CreateQP, fds: list[int], tail: bytes) -> Resources:  # fmt: skip
    what = op.name
    want = (1 if body.sq_slot else 0) + (1 if body.rq_slot else 0)
    taken = _fds(fds, want, what)
    caps = body.caps
    opcodes = ALLOWED_OPCODES.get(body.qp_type, frozenset()) | {WR_DRIVER1}
    res = Resources()
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
            _slot(slot, least, what)
            if size > 1 << 20:
                raise einval(f"{what}: a queue of {size} WQEs is too large")
        except PyverbsRDMAError:
            for other in [fd, *taken]:
                os.close(other)
            raise
        region = _map(fd, HEADER_SIZE + size * slot, what)
        ring = shared_work_ring(region, size, slot, is_send, frozenset(opcodes))
        res.release.append(region.close)
        if is_send:
            res.sq = ring
        else:
            res.rq = ring
    return res


def _take_xrcd_file(svc: Service, client: Client, op: Op,
                    body: records.OpenXRCD, fds: list[int], tail: bytes) -> Resources:  # fmt: skip
    res = Resources()
    if body.flags & records.OPEN_XRCD_HAS_FD:
        (fd,) = _fds(fds, 1, op.name)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        res.file_key = (st.st_dev, st.st_ino)
    else:
        _fds(fds, 0, op.name)
    return res


def _take_pcap_file(svc: Service, client: Client, op: Op,
                    body: records.CaptureReq, fds: list[int],
                    tail: bytes) -> Resources:  # fmt: skip
    (fd,) = _fds(fds, 1, op.name)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise einval("CAPTURE: the descriptor is not a file or a pipe")
        file = os.fdopen(fd, "wb", buffering=0)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return Resources(file=file, release=[file.close])


def _take_rules_text(svc: Service, client: Client, op: Op,
                     body: Record, fds: list[int], tail: bytes) -> Resources:  # fmt: skip
    _fds(fds, 0, op.name)
    return Resources(text=tail.decode("utf-8", "replace"))


def _take_report_file(svc: Service, client: Client, op: Op,
                      body: Record, fds: list[int], tail: bytes) -> Resources:  # fmt: skip
    (fd,) = _fds(fds, 1, op.name)
    file = os.fdopen(fd, "wb", buffering=0)
    return Resources(file=file, text=tail.decode("utf-8", "replace"), release=[file.close])


#: The rule for each kind of what a request takes (records.Takes); the
#: service's own operations (:data:`_LOCAL`) take theirs themselves.
TAKES: dict[records.Takes, Callable[[Service, Client, Op, Any, list[int], bytes], Resources]] = {
    records.NOTHING: _take_nothing,
    records.ASYNC_SOCKET: _take_event_socket,
    records.COMP_SOCKET: _take_event_socket,
    records.REGION: _take_region,
    records.CQ_RING: _take_cq_ring,
    records.SRQ_RING: _take_srq_ring,
    records.QP_RINGS: _take_qp_rings,
    records.XRCD_FILE: _take_xrcd_file,
    records.PCAP_FILE: _take_pcap_file,
    records.RULES_TEXT: _take_rules_text,
    records.REPORT_FILE: _take_report_file,
}


#: Operations the service serves itself (the rest go to the host).
_LOCAL: dict[int, Callable[..., tuple[Any, bytes]]] = {
    ops.HELLO.code: Service.op_hello,
    ops.STATUS.code: Service.op_status,
    ops.CM_EVENTS.code: Service.op_cm_events,
}
#: the RDMA CM's commands: served by the CM agent (Service.op_cm)
_CM_COMMANDS = frozenset(op.code for op in ops.CM_OPS) - {ops.CM_EVENTS.code}


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
    service.stop_on_signals()
    print(f"softverbsd: serving on {args.socket} (pid {os.getpid()})", flush=True)
    service.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

