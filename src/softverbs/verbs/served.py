"""The application side of the device service: softverbs' own driver for it.

Device names resolve to devices served by ``softverbsd`` (started on
demand) unless ``SOFTVERBS_SERVICE=0``.  A :class:`ServiceProvider` is the
:class:`~softverbs.verbs.provider.Provider` of such a device: the verbs
objects are the same as for an in-process device, and what a verb becomes
is the same operation of :mod:`softverbs.device.ops`; here it travels as
bytes (:mod:`softverbs.device.protocol`):

* **Rings** live in memfds this process creates and passes with the request
  that creates the queue; posting writes WQEs into them and rings a one-way
  ``DOORBELL``; polling reads CQEs from shared memory without a system call.
* **Memory** is reached by the service directly: regions softverbs allocates
  (``MR(pd, length, access)``) are memfds it maps; any other region --
  a bytearray, an mmap, an ``address=`` -- through the descriptor of this
  process's ``/proc/self/mem`` passed with ``HELLO``
  (:mod:`softverbs.device.memory`).
* **Events** arrive on sockets of their own -- one per context (async
  events), one per completion channel, one for the RDMA CM -- drained
  whenever the application calls into softverbs and waited on by the
  blocking calls; a channel's socket is its ``fd``, so ``poll()`` works.

The connection is shared by every served device of this process.  A forked
child never uses its parent's: it gets a connection of its own on first use.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from softverbs import config, sanitizer
from softverbs.config import service_command
from softverbs.device import ops, protocol, records
from softverbs.device.core import Features
from softverbs.engine.rings import (
    CQE_SIZE,
    HEADER_SIZE,
    CompletionRing,
    SendSlots,
    SharedRecvRing,
    SharedRegion,
    WorkRing,
    recv_slot_size,
    send_slot_size,
    shared_cq,
    shared_srq,
    shared_work_ring,
)
from softverbs.errors import PyverbsRDMAError, eopnotsupp
from softverbs.fabric.runtime import Clock, MonotonicClock
from softverbs.layout import Record
from softverbs.verbs.memory import Memory, address_of
from softverbs.verbs.provider import Attach
from softverbs.verbs.registry import DeviceSpec, SoftDevice

Rep = TypeVar("Rep", bound=Record)

START_TIMEOUT = 15.0
#: An on-demand service exits after this long without a client (SOFTVERBS_IDLE_EXIT).
IDLE_EXIT = 60.0


def idle_exit() -> float:
    """``SOFTVERBS_IDLE_EXIT`` (seconds), checked; :data:`IDLE_EXIT` if unset."""
    from softverbs.errors import ConfigError

    text = os.environ.get("SOFTVERBS_IDLE_EXIT", "").strip()
    if not text:
        return IDLE_EXIT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:
        raise ConfigError(f"SOFTVERBS_IDLE_EXIT={text!r}: give the seconds a service started "
                          "on demand waits, once idle, before it exits (a number above 0)")
    return value


#: ``PR_SET_PTRACER`` (``<linux/prctl.h>``): Yama's, naming the process that may ptrace this one
PR_SET_PTRACER = 0x59616D61


def _libc_prctl() -> Any:
    """libc's ``prctl`` through ``ctypes``, keeping its errno; None where there is none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_int
    return call


_LIBC_PRCTL = _libc_prctl()


def _prctl(option: int, arg: int) -> int:
    """``prctl(option, arg, 0, 0, 0)``: 0, or the errno it failed with.  Tests replace
    this name to see the calls."""
    if _LIBC_PRCTL is None:
        return errno.ENOSYS
    args = (ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if _LIBC_PRCTL(ctypes.c_int(option), *args) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


def name_ptracer(sock: socket.socket, service_pid: int) -> bool:
    """After ``HELLO``: name the service this process's ptracer, so that under
    Yama's ``ptrace_scope`` 1 it may copy large transfers with
    ``process_vm_readv``/``process_vm_writev`` (docs/architecture.md, *Copies
    that bypass the descriptor*); the C library does the same (conn.c).
    Whether ``prctl(PR_SET_PTRACER, service_pid)`` was asked.

    Only when ``service_pid`` (the reply's) is the process at the other end of
    ``sock`` (``SO_PEERCRED``, in this process's pid namespace: 0 if not in it)
    and not this process: a service in another pid namespace, whose pid would
    name another process here, is not named.  Never ``PR_SET_PTRACER_ANY``.
    Every error is ignored -- EINVAL without Yama; without the right the
    service copies through the descriptor.  Not with ``SOFTVERBS_NO_PTRACER``
    (:func:`softverbs.config.ptracer_left_alone`): Yama keeps one ptracer per
    process, and ours replaces one the program named itself."""
    if config.ptracer_left_alone() or service_pid <= 0 or service_pid == os.getpid():
        return False
    try:
        peer = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return False
    if peer[0] != service_pid:
        return False
    _prctl(PR_SET_PTRACER, service_pid)
    return True


def _lost(exc: BaseException) -> PyverbsRDMAError:
    return PyverbsRDMAError(f"lost the softverbs device service: {exc}", errno.ECONNRESET)


class Connection:
    """One socket to the service, shared by every served device of this process."""

    def __init__(self, path: str, spawn: bool = True) -> None:
        self.path = path
        self.sock = self._connect(path, spawn)
        self.lock = threading.RLock()
        self._seq = 1
        self.pid = os.getpid()
        #: the doorbell eventfd the service took (SOFTVERBS_DOORBELL=eventfd), or -1:
        #: send queues ring by writing it, not by a DOORBELL message (docs/rings.md)
        self.bell = -1
        #: send queues this process holds: the eventfd rings while they are at
        #: most config.BELL_MAX_QUEUES (the service reads every db per write)
        self.send_queues = 0
        reply = self._hello(0, records.HELLO_MEMORY)
        self.service_pid: int = reply.service_pid
        self.token: int = reply.token
        value = sanitizer.from_environment()
        self.sanitized = value is not None
        if value is not None:  # reports go to this process's stderr (docs/sanitizer.md)
            self.call(ops.SANITIZE, records.Empty(), [2], sanitizer.for_python(value).encode())

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
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                if not spawn:
                    raise PyverbsRDMAError(f"no softverbs device service is listening on {path}",
                                           errno.ECONNREFUSED) from None  # fmt: skip
                if not started:
                    _spawn_service(path)
                    started = True
                if time.monotonic() > deadline:
                    raise PyverbsRDMAError(
                        f"cannot reach the softverbs device service at {path} ({exc.strerror}); "
                        "start it with 'softverbs service start', or set SOFTVERBS_SERVICE=0 "
                        "for in-process devices", errno.ECONNREFUSED,
                    ) from None  # fmt: skip
                time.sleep(0.05)

    def call(self, op: records.Op[Any, Rep], body: Record,
             fds: list[int] | None = None, tail: bytes = b"") -> tuple[Rep, bytes]:  # fmt: skip
        """A request and its reply; errors become PyverbsRDMAError with the errno."""
        self._check_pid()
        with self.lock:
            seq = self._seq
            self._seq = (seq + 1) & 0xFFFFFFFF or 1
            try:
                try:
                    protocol.send(self.sock, protocol.encode(op, seq, body, tail), fds)
                except (BrokenPipeError, ConnectionResetError) as exc:
                    # refused at once (another uid): the reason waits to be read
                    msg = self._reply(seq, socket.MSG_DONTWAIT, exc)
                else:
                    msg = self._reply(seq, 0, None)
            except (OSError, EOFError, protocol.ProtocolError) as exc:
                raise _lost(exc) from None
        if msg.header.status:
            raise PyverbsRDMAError(msg.error, msg.header.status)
        return msg.body, msg.tail

    def _reply(self, seq: int, flags: int, failed: OSError | None) -> protocol.Message:
        """The reply to request ``seq``, or the unsolicited error (seq 0) that
        refuses this connection.  A tail passed as a memfd (FLAG_TAIL_FD) is read."""
        while True:
            try:
                data, got = protocol.recv(self.sock, flags)
            except (BlockingIOError, EOFError):
                if failed is not None:
                    raise failed from None
                raise
            try:
                msg = protocol.decode(data)
                if msg.header.flags & protocol.FLAG_TAIL_FD:
                    msg.tail = protocol.read_tail_fd(got)
            finally:
                for fd in got:
                    os.close(fd)
            if msg.header.seq == seq or (msg.header.seq == 0 and msg.header.status):
                return msg

    def post(self, op: records.Op[Any, Any], body: Record) -> None:
        """A one-way message (a doorbell)."""
        self._check_pid()
        data = protocol.encode(op, 0, body)
        with self.lock:
            try:
                self.sock.send(data)
            except OSError as exc:
                raise _lost(exc) from None

    def _check_pid(self) -> None:
        if os.getpid() != self.pid:
            self._rejoin()

    def _rejoin(self) -> None:
        """A forked child: never the parent's socket (the service would mix their
        requests), but a socket of its own to the same owner -- as a forked child
        shares its parent's uverbs file: it may use the parent's objects for
        commands, never their rings (see ServiceProvider.forked)."""
        with contextlib.suppress(OSError):
            os.close(self.sock.detach())
        self.lock = threading.RLock()
        self.pid = os.getpid()
        self.sock = self._connect(self.path, spawn=False)
        # its own memory too: the regions it registers are its pages, not the parent's;
        # and a doorbell eventfd of its own (the parent's copy rings the parent's queues)
        self._hello(self.token, records.HELLO_JOIN | records.HELLO_MEMORY)

    def _hello(self, token: int, flags: int) -> records.HelloReply:
        """HELLO, passing this process's memory and, if the setting asks for
        it, a doorbell eventfd (kept in :attr:`bell` if the service took it)."""
        fds = [os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)]
        if config.doorbell_mode() == "eventfd":
            fds.append(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
            flags |= records.HELLO_DOORBELL_FD
        try:
            reply, _ = self.call(ops.HELLO, records.Hello(token, protocol.PROTOCOL_VERSION,
                                                       flags, os.getpid(), 0), fds)  # fmt: skip
        except BaseException:
            for fd in fds[1:]:
                os.close(fd)
            raise
        finally:
            os.close(fds[0])
        name_ptracer(self.sock, reply.service_pid)
        old, self.bell = self.bell, -1
        if old >= 0:
            os.close(old)
        if len(fds) > 1:
            if reply.features & records.FEATURE_DOORBELL_FD:
                self.bell = fds[1]
            else:
                os.close(fds[1])
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.bell >= 0:
            with contextlib.suppress(OSError):
                os.close(self.bell)
            self.bell = -1

    def abandon(self) -> None:
        """In a forked child: let go of the parent's socket without a word (a
        later call joins the parent's owner on a socket of its own)."""
        self.lock = threading.RLock()
        with contextlib.suppress(OSError):
            os.close(self.sock.detach())
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _spawn_service(path: str) -> None:
    """Start ``softverbsd`` in the background, to exit once idle (on-demand start)."""
    config.ensure_socket_dir(path)
    # the observing settings are this process's: it applies them to its own
    # packets through the FAULTS and CAPTURE operations, not the service to all
    env = {k: v for k, v in os.environ.items() if k not in _PER_PROCESS}
    subprocess.Popen(
        service_command("--socket", path, "--idle-exit", str(idle_exit())),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True, env=env,
    )  # fmt: skip


#: settings a client applies to its own packets (see ServiceProvider)
#: (SOFTVERBS_TRACE: a service traces only if started with it, by 'softverbs service start')
_PER_PROCESS = ("SOFTVERBS_FAULTS", "SOFTVERBS_PCAP", "SOFTVERBS_TRACE")


class ClientRuntime:
    """What drives served devices from here: a lock, and the event sockets.

    The device runs in the service, so nothing here ever needs progress but
    the draining of the sockets events arrive on."""

    virtual = False

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.clock: Clock = MonotonicClock()
        self.faults = None
        self.generation = 0
        self._readers: dict[int, tuple[socket.socket, Callable[[bytes], None]]] = {}

    def watch(self, sock: socket.socket, on_packet: Callable[[bytes], None]) -> None:
        sock.setblocking(False)
        with self.lock:
            self._readers[sock.fileno()] = (sock, on_packet)

    def unwatch(self, sock: socket.socket) -> None:
        with self.lock:
            self._readers.pop(sock.fileno(), None)
        with contextlib.suppress(OSError):
            sock.close()

    def progress(self) -> bool:
        """Handle every event already waiting; True if there was one."""
        got = False
        with self.lock:
            for sock, on_packet in list(self._readers.values()):
                while True:
                    try:
                        data = sock.recv(protocol.MAX_MESSAGE)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        break
                    if not data:
                        break
                    got = True
                    on_packet(data)
            if got:
                self.generation += 1
                self.cond.notify_all()
        return got

    def posted(self) -> bool:
        """A post's doorbell is already on its way to the service: nothing to run."""
        return False

    def idle_step(self) -> bool:
        return False

    def next_deadline(self) -> float | None:
        return None

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``ready()``; False on timeout.  Waits on the event sockets,
        and looks again every millisecond for what shared memory may bring."""
        end = None if timeout is None else time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        try:
            with self.lock:
                for sock, _ in self._readers.values():
                    sel.register(sock, selectors.EVENT_READ)
            while True:
                with self.lock:
                    self.progress()
                    if ready():
                        return True
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                sel.select(0.001 if left is None else min(left, 0.001))
        finally:
            sel.close()

    def add_tap(self, *args: Any) -> None:
        raise PyverbsRDMAError("to capture a served device's packets, use "
                               "softverbs.capture(ctx, path) (the service writes the file)",
                               errno.EOPNOTSUPP)  # fmt: skip


_trace_noted = False


def _note_trace(device: str) -> None:
    """``SOFTVERBS_TRACE`` in a client of the service: say, once, that it records nothing
    here -- the QPs run in the service, which traces only if it was started with it."""
    global _trace_noted
    from softverbs.trace import ENV

    path = os.environ.get(ENV)
    if not path or _trace_noted:
        return
    _trace_noted = True
    print(f"softverbs: {ENV}={path} is not written by this process: device {device} is "
          f"served by softverbsd, which traces only when started with {ENV} set "
          f"({ENV}=FILE softverbs service start; see docs/trace.md)", file=sys.stderr)  # fmt: skip


class ServiceProvider:
    """A provider whose device runs in ``softverbsd`` (see the module docstring)."""

    def __init__(self, conn: Connection, runtime: ClientRuntime, name: str) -> None:
        self.conn = conn
        self.runtime = runtime
        self.name = name
        self.features = Features()
        #: in a forked child: the rings are the parent's; the verbs refuse to touch them
        self.forked = False
        #: a receive doorbell is a message: sent only where the device must act at
        #: once, and for the sanitizer's checks (docs/rings.md)
        self.rings_rq = conn.sanitized
        #: id(ring) -> its shared memory: the one record of the rings this provider
        #: holds (a send queue among them is the one whose slots are SendSlots)
        self._regions: dict[int, SharedRegion] = {}
        self._sockets: dict[tuple[int, int], socket.socket] = {}  #: (kind, handle) -> events
        # a context of the registry's own, for the device's GIDs and MTU
        self._ctx = self.call(ops.OPEN_DEVICE, records.OpenDevice(name), Attach(sink=_ignore)).ctx
        self.gids = [self._gid(i) for i in range(16)]
        while self.gids and not any(self.gids[-1]):
            self.gids.pop()
        from softverbs.enums import mtu_to_bytes

        port = self.call(ops.QUERY_PORT, records.QueryPort(self._ctx, 1))
        self.mtu = mtu_to_bytes(port.active_mtu)
        self._apply_environment()
        _PROVIDERS.add(self)

    def _apply_environment(self) -> None:
        """``SOFTVERBS_FAULTS`` and ``SOFTVERBS_PCAP`` of this process, on the
        packets of its QPs (faults) and of the device (capture): the service
        holds them for as long as this process is connected."""
        from softverbs.verbs.registry import environment_faults, environment_pcap

        _note_trace(self.name)
        text = environment_faults()
        if text is not None:
            self.call(ops.FAULTS, records.Ctx(self._ctx, 0), Attach(text=text))
        writer = environment_pcap()
        if writer is not None:
            writer.flush()  # the header, before the service appends to the file
            self.call(ops.CAPTURE, records.CaptureReq(self._ctx, records.CAPTURE_APPEND),
                      Attach(file=writer))  # fmt: skip

    def _gid(self, index: int) -> bytes:
        try:
            return bytes(self.call(ops.QUERY_GID, records.QueryGid(self._ctx, 1, index, 0)).gid)
        except PyverbsRDMAError as exc:
            if exc.error_code == errno.ENODATA:
                return bytes(16)
            raise

    # --- operations ---------------------------------------------------------------------
    def call(self, op: records.Op[Any, Rep], body: Record, attach: Attach | None = None) -> Rep:
        fds, passed_only, local = self._descriptors(body, attach)
        tail = attach.text.encode() if attach is not None else b""
        try:
            reply, _ = self.conn.call(op, body, fds, tail)
        except BaseException:
            for sock in local:
                sock.close()
            raise
        finally:
            for fd in passed_only:  # the service has its own copy now
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._adopt_sockets(op, reply, attach, local)
        if op is ops.DESTROY and isinstance(body, records.Destroy):
            self.destroyed(body.kind, body.handle)
        return reply

    def call_tail(self, op: records.Op[Any, Rep], body: Record) -> tuple[Rep, bytes]:
        return self.conn.call(op, body)

    def _descriptors(self, body: Any, attach: Attach | None,
                     ) -> tuple[list[int], list[int], list[socket.socket]]:  # fmt: skip
        """The descriptors ``attach`` becomes (rings, memory, event sockets, a
        file), those of them to close once sent, and the sockets kept here."""
        fds: list[int] = []
        passed_only: list[int] = []
        local: list[socket.socket] = []
        if attach is None:
            return fds, passed_only, local
        if attach.sink is not None:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            local.append(mine)
            fds.append(theirs.detach())
            passed_only.append(fds[-1])
        if attach.memory is not None and attach.memory.region is not None:
            body.flags |= records.REG_MR_HAS_FD
            body.offset = attach.memory.offset
            fds.append(attach.memory.region.fd)
        for ring in (attach.cq, attach.srq, attach.sq, attach.rq):
            if ring is not None:
                fds.append(self._regions[id(ring)].fd)
        if attach.srq is not None and isinstance(body, records.CreateSRQ):
            body.slot = int(getattr(attach.srq.slots, "slot", 0))
        if attach.file_fd != -1:
            fds.append(attach.file_fd)
        if attach.file is not None:
            try:
                fds.append(attach.file.fileno())
            except (AttributeError, OSError, ValueError):
                raise eopnotsupp("a served device writes to a file of its own: pass a path "
                                 "or a file that has a descriptor") from None  # fmt: skip
        return fds, passed_only, local

    def _adopt_sockets(self, op: records.Op[Any, Any], reply: Any, attach: Attach | None,
                       local: list[socket.socket]) -> None:  # fmt: skip
        if attach is None or attach.sink is None or not local:
            return
        sock = local[0]
        sink = attach.sink
        if op is ops.OPEN_DEVICE:
            key = (records.KIND_CTX, int(reply.ctx))

            def on_packet(data: bytes) -> None:
                rec = records.AsyncEventRecord.unpack(data)
                sink(rec, data[records.AsyncEventRecord.size() :].decode("utf-8", "replace"))
        else:
            key = (records.KIND_CHANNEL, int(reply.handle))

            def on_packet(data: bytes) -> None:
                sink(records.CompEventRecord.unpack(data).cq)

        self._sockets[key] = sock
        attach.fd_out = sock.fileno()
        self.runtime.watch(sock, on_packet)

    def destroyed(self, kind: int, handle: int) -> None:
        """A context or channel went: stop listening on its socket."""
        sock = self._sockets.pop((kind, handle), None)
        if sock is not None:
            self.runtime.unwatch(sock)

    def doorbell(self, qp: int, queue: int) -> None:
        """The send queue's ``db`` moved: a write of the doorbell eventfd, if the
        service took one, else (and for a receive queue) a DOORBELL message."""
        conn = self.conn
        if (queue == records.DB_SQ and conn.bell >= 0 and conn.pid == os.getpid()
                and conn.send_queues <= config.BELL_MAX_QUEUES):  # fmt: skip
            try:
                os.eventfd_write(conn.bell, 1)
                return
            except OSError:  # the counter is full, or the descriptor gone: by message
                pass
        conn.post(ops.DOORBELL, records.Doorbell(qp, queue))

    # --- rings and memory ------------------------------------------------------------------
    def _region(self, size: int, name: str) -> SharedRegion:
        return SharedRegion(size, name=f"softverbs-{name}")

    def work_ring(self, size: int, send: bool, max_sge: int, max_inline: int,
                  qp_type: int) -> WorkRing:  # fmt: skip
        slot = send_slot_size(max_sge, max_inline) if send else recv_slot_size(max_sge)
        region = self._region(HEADER_SIZE + size * slot, "sq" if send else "rq")
        ring = shared_work_ring(region, size, slot, send)
        self._regions[id(ring)] = region
        if send:
            self.conn.send_queues += 1  # undone by free_ring, see there
        return ring

    def cq_ring(self, capacity: int) -> CompletionRing:
        region = self._region(HEADER_SIZE + capacity * CQE_SIZE, "cq")
        ring = shared_cq(region, capacity)
        self._regions[id(ring)] = region
        return ring

    def srq_ring(self, size: int, max_sge: int) -> SharedRecvRing:
        slot = recv_slot_size(max_sge)
        region = self._region(HEADER_SIZE + size * slot, "srq")
        ring = shared_srq(region, size, slot, max_sge)
        self._regions[id(ring)] = region
        return ring

    def _swap(self, ring: Any, new: Any) -> None:
        old = self._regions.pop(id(ring), None)
        self._regions[id(ring)] = self._regions.pop(id(new))
        if old is not None:
            old.close()

    def adopt_cq(self, ring: CompletionRing, new: CompletionRing) -> None:
        """The service moved the CQ into ``new``'s memory: use it."""
        ring.adopt(new.slots, new.hdr, new.capacity)
        self._swap(ring, new)

    def adopt_srq(self, ring: SharedRecvRing, new: SharedRecvRing) -> None:
        ring.adopt(new.slots, new.hdr, new.size)
        self._swap(ring, new)

    def free_ring(self, ring: Any) -> None:
        """Unmap ``ring``'s memory; a send queue no longer counts towards the
        eventfd doorbell's limit.  Only a ring still listed in ``_regions`` is
        counted down, so freeing one twice (a failed create, then the QP's
        destroy) counts it once; its slots say whether it was a send queue."""
        region = self._regions.pop(id(ring), None)
        if region is None:
            return
        if isinstance(ring.slots, SendSlots):
            self.conn.send_queues -= 1
        region.close()

    def alloc_memory(self, length: int) -> Memory:
        """Zeroed memory in a memfd the service maps too."""
        region = self._region(length, "mr")
        view = region.view[:length]
        return Memory(view, address_of(view) if length else 0, region, region, 0)

    def dm_pool(self) -> Any:
        """The device memory of this process's contexts: a memfd the service maps."""
        from softverbs.verbs.memory import MAX_DM_SIZE, DmPool

        pool = getattr(self, "_dm", None)
        if pool is None:
            pool = self._dm = DmPool(MAX_DM_SIZE, self._region(MAX_DM_SIZE, "dm"))
        return pool

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()


def _ignore(*_: Any) -> None:
    """The registry's own context hears no events."""


_PROVIDERS: weakref.WeakSet[ServiceProvider] = weakref.WeakSet()


class ServiceRegistry:
    """Device names resolve to the service's devices (see the module docstring)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or protocol.default_socket_path()
        self._conn: Connection | None = None
        self.runtime = ClientRuntime()
        self.devices: dict[str, SoftDevice] = {}
        self._lock = threading.Lock()
        _REGISTRIES.add(self)

    def connection(self) -> Connection:
        if self._conn is None:
            self._conn = Connection(self.path)
        return self._conn

    def entries(self) -> list[records.DeviceEntry]:
        reply, tail = self.connection().call(ops.LIST_DEVICES, records.Empty())
        size = records.DeviceEntry.size()
        return [records.DeviceEntry.unpack(tail, i * size) for i in range(reply.count)]

    def specs(self) -> list[DeviceSpec]:
        return [DeviceSpec(e.name, "service") for e in self.entries()]

    def open(self, name: str) -> SoftDevice:
        with self._lock:
            dev = self.devices.get(name)
            if dev is not None:
                return dev
            entries = {e.name: e for e in self.entries()}
            entry = entries.get(name)
            if entry is None:
                raise PyverbsRDMAError(f"Failed to find device {name}; softverbs devices are: "
                                       f"{', '.join(entries) or 'none'}", errno.ENODEV)  # fmt: skip
            provider = ServiceProvider(self.connection(), self.runtime, name)
            spec = DeviceSpec(name, "service", mac=_guid_mac(entry.node_guid))
            dev = SoftDevice(spec, None, self.runtime, entry.index, provider.mtu, provider)
            self.devices[name] = dev
            return dev

    def release(self, dev: SoftDevice) -> None:
        pass

    def shutdown(self) -> None:
        for dev in self.devices.values():
            dev.provider.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- the RDMA CM in the service -----------------------------------------------------------
    def cm_request(self, op: Any, request: Record) -> Any:
        """One ``CM_*`` request to the service's CM agent; its reply record
        (the records and their meaning: :mod:`softverbs.cm.wire`)."""
        reply, _ = self.connection().call(op, request)
        return reply

    def cm_events(self, deliver: Callable[[records.CmEvent], None]) -> None:
        """Have this process's CM events delivered (once), as records."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.detach()
        try:
            # channel 0: all of ours
            self.connection().call(ops.CM_EVENTS, records.Handle(0, 0), [fd])
        finally:
            os.close(fd)

        def on_packet(data: bytes) -> None:
            deliver(records.CmEvent.unpack(data))

        self.runtime.watch(mine, on_packet)


def _guid_mac(guid: int) -> bytes:
    """The MAC a modified EUI-64 node GUID was made from."""
    raw = guid.to_bytes(8, "big")
    return bytes([raw[0] ^ 0x02]) + raw[1:3] + raw[5:8]


_REGISTRIES: weakref.WeakSet[ServiceRegistry] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Fork safety: a child must not talk on its parent's connection -- the
    service would mix their requests, and replies would go to whichever process
    reads first.  The child forgets the parent's connection, devices and
    providers; it connects on its own at first use."""
    for reg in list(_REGISTRIES):
        conn, reg._conn = reg._conn, None
        reg.devices = {}
        reg.runtime = ClientRuntime()
        reg._lock = threading.Lock()
        if conn is not None:
            conn.abandon()
    for prov in list(_PROVIDERS):
        prov.forked = True
    _PROVIDERS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
