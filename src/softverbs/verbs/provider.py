"""Providers: how verbs objects reach the device that runs their engine.

libibverbs talks to a NIC through a provider library; softverbs' verbs
objects talk to a device through a provider too.  Whatever the device, a
verb is one of the operations of :mod:`softverbs.device.ops`, judged by the
device's :class:`~softverbs.device.core.Host`; a provider only carries it
there:

* :class:`EmbeddedProvider` -- the device runs in this process: it calls
  the host directly with the request record, and the rings are the very
  objects the engine reads (:func:`~softverbs.engine.rings.local_work_ring`).
* :class:`softverbs.verbs.served.ServiceProvider` -- the device runs in
  ``softverbsd``: the request goes as bytes over a socket, the rings live in
  shared memory, and events arrive on sockets of their own.

Both give the verbs layer the same :class:`Provider` interface: ``call`` an
operation (with :class:`Attach` -- what the request passes besides its
record: rings, memory, an event sink, a file), make rings, ring doorbells.
So there is one verbs layer, and every check that matters happens in the
device, for every kind of device.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from softverbs.device import ops, records
from softverbs.device.core import KINDS, Device, Features, Host, Owner, Resources
from softverbs.device.qp import QPObj, ring_doorbell
from softverbs.engine.rings import (
    CompletionRing,
    SharedRecvRing,
    WorkRing,
    local_cq,
    local_srq,
    local_work_ring,
)
from softverbs.errors import PyverbsRDMAError
from softverbs.layout import Record
from softverbs.verbs.base import require

if TYPE_CHECKING:
    from softverbs.fabric.runtime import DeviceRuntime
    from softverbs.verbs.memory import DmPool, Memory

Rep = TypeVar("Rep", bound=Record)


@dataclass
class Attach:
    """What a request passes besides its record (the provider's to deliver)."""

    sink: Callable[..., None] | None = None  #: OPEN_DEVICE: (record, reason); channel: (cq)
    memory: Memory | None = None  #: REG_MR / REREG_MR
    cq: CompletionRing | None = None
    srq: SharedRecvRing | None = None
    sq: WorkRing | None = None
    rq: WorkRing | None = None
    file_fd: int = -1  #: OPEN_XRCD
    file: Any = None  #: CAPTURE: a binary file open for writing
    text: str = ""  #: FAULTS: the rules
    fd_out: int = -1  #: set by the provider: the local end of an event socket it made


class Provider(Protocol):
    """What verbs objects use to reach their device."""

    name: str
    features: Features
    #: this process is a fork of the one that made the rings: they are not its to use
    forked: bool
    #: every receive post rings the doorbell; else only where the device must act at
    #: once (a QP in ERR), as it reads a receive queue's doorbell record itself
    #: (docs/rings.md)
    rings_rq: bool

    @property
    def runtime(self) -> DeviceRuntime: ...

    @property
    def gids(self) -> list[bytes]: ...

    def call(self, op: records.Op[Any, Rep], body: Record, attach: Attach | None = None) -> Rep: ...
    def call_tail(self, op: records.Op[Any, Rep], body: Record) -> tuple[Rep, bytes]: ...
    def doorbell(self, qp: int, queue: int) -> None: ...
    def work_ring(self, size: int, send: bool, max_sge: int, max_inline: int,
                  qp_type: int) -> WorkRing: ...  # fmt: skip
    def cq_ring(self, capacity: int) -> CompletionRing: ...
    def srq_ring(self, size: int, max_sge: int) -> SharedRecvRing: ...
    def adopt_cq(self, ring: CompletionRing, new: CompletionRing) -> None: ...
    def adopt_srq(self, ring: SharedRecvRing, new: SharedRecvRing) -> None: ...
    def free_ring(self, ring: Any) -> None: ...
    def alloc_memory(self, length: int) -> Memory: ...
    def dm_pool(self) -> DmPool: ...
    def close(self) -> None: ...


def forked_error(what: str) -> PyverbsRDMAError:
    """Why a forked child may not touch its parent's rings (ibv_fork_init: the
    child gets an error, never the parent's queues)."""
    import errno

    return PyverbsRDMAError(f"{what}: this process is a fork of the one that made the queue; "
                            "its rings belong to the parent (open the device again here)",
                            errno.EIO)  # fmt: skip


def check_post(provider: Provider, verb: str, cls: type, wr: object, bad_wr: object) -> None:
    """What every post verb checks before it touches a ring: the WR list and
    ``bad_wr`` are ``cls``, and this process is not a fork of the ring's owner."""
    require(wr, cls, "wr")
    require(bad_wr, cls, "bad_wr", optional=True)
    if provider.forked:
        raise forked_error(verb)


def destroy(provider: Provider, kind: int, handle: int) -> None:
    """pyverbs' ``close()`` on the device: the object goes, and -- first --
    whatever of this process still uses it (objects whose Python side was
    dropped without ``close()``)."""
    provider.call(ops.DESTROY, records.Destroy(kind, handle, records.DESTROY_CASCADE, 0))


class EmbeddedProvider:
    """The device runs in this process (see the module docstring)."""

    def __init__(self, host: Host, owner: Owner, device: Device, runtime: DeviceRuntime) -> None:
        self.host = host
        self.owner = owner
        self.device = device
        self.runtime = runtime
        self.name = device.name
        self.features = device.info.features
        self.forked = False  #: a forked child has its own copy of an in-process device
        self.rings_rq = True  #: a doorbell is a call here; the engine's view stays current
        self._dm_pool: DmPool | None = None

    @property
    def gids(self) -> list[bytes]:
        """The device's GID table as it is now (a UDP device's grows as its
        interface's addresses become usable)."""
        return self.device.hca.gids

    # --- operations -------------------------------------------------------------------------
    def call(self, op: records.Op[Any, Rep], body: Record, attach: Attach | None = None) -> Rep:
        return self.host.execute(self.owner, op, body, self._resources(attach)).body

    def call_tail(self, op: records.Op[Any, Rep], body: Record) -> tuple[Rep, bytes]:
        reply = self.host.execute(self.owner, op, body)
        return reply.body, reply.tail

    @staticmethod
    def _resources(attach: Attach | None) -> Resources:
        if attach is None:
            return Resources()
        res = Resources(events=attach.sink, completions=attach.sink, cq=attach.cq,
                        srq=attach.srq, sq=attach.sq, rq=attach.rq, file=attach.file,
                        text=attach.text)  # fmt: skip
        if attach.memory is not None:
            res.span = attach.memory.view
        if attach.file_fd != -1:
            try:
                st = os.fstat(attach.file_fd)
            except OSError as exc:
                raise PyverbsRDMAError(f"Failed to allocate XRCD: fd {attach.file_fd}: "
                                       f"{exc.strerror}", exc.errno or 9) from None  # fmt: skip
            res.file_key = (st.st_dev, st.st_ino)
        return res

    def doorbell(self, qp: int, queue: int) -> None:
        """No message to send: the engine reads the ring in this process (the
        verb that rang runs the devices next: ``runtime.posted()``)."""
        rec = self.host.obj(self.owner, qp, QPObj)
        rt = self.runtime
        with rt.lock:
            ring_doorbell(rec.engine, queue, rt.clock.now())

    # --- rings and memory --------------------------------------------------------------------
    def work_ring(self, size: int, send: bool, max_sge: int, max_inline: int,
                  qp_type: int) -> WorkRing:  # fmt: skip
        return local_work_ring(size)

    def cq_ring(self, capacity: int) -> CompletionRing:
        return local_cq(capacity)

    def srq_ring(self, size: int, max_sge: int) -> SharedRecvRing:
        return local_srq(size, max_sge)

    def adopt_cq(self, ring: CompletionRing, new: CompletionRing) -> None:
        """Nothing to do: the device moved the one ring object both faces share."""

    def adopt_srq(self, ring: SharedRecvRing, new: SharedRecvRing) -> None:
        """Nothing to do: the device moved the one ring object both faces share."""

    def free_ring(self, ring: Any) -> None:
        """Local rings are ordinary objects."""

    def alloc_memory(self, length: int) -> Memory:
        """Fresh, zeroed, page-aligned memory for ``MR(pd, length, access)``."""
        from softverbs.verbs import memory

        return memory.allocate(length)

    def dm_pool(self) -> DmPool:
        """The device's on-device memory (``ibv_alloc_dm``), made on first use."""
        from softverbs.verbs.memory import DmPool

        if self._dm_pool is None:
            self._dm_pool = DmPool()
        return self._dm_pool

    def engine_of(self, kind: int, handle: int) -> Any:
        """The engine object behind one of this process's handles (a QPEngine,
        a MemKey, a ring...): what in-process tools, tests and the mlx5dv
        extension look inside."""
        return self.host.obj(self.owner, handle, KINDS[kind]).engine

    def close(self) -> None:
        """The device lives as long as its world (the registry)."""
