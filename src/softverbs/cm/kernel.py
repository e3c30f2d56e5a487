"""How the user-side RDMA CM library reaches the CM agent: ``/dev/infiniband/rdma_cm``.

librdmacm writes commands to the kernel's ``rdma_cm`` device and reads
events back.  softverbs has two such paths, with one interface
(:class:`Kernel`):

* :class:`LocalKernel` -- the devices live in this process (embedded mode or
  a simulation): commands are method calls on this world's
  :class:`~softverbs.cm.agent.CmAgent`.
* :class:`ServiceKernel` -- the devices live in ``softverbsd``: commands are
  ``cm`` requests on the service socket and events arrive as ``cm_event``
  messages.  The agent runs in the service, next to the devices, so two
  processes on one device talk to one CM, as two processes on one rxe device
  do.

Either way, events carry the handle of the CM ID they belong to;
:meth:`Kernel.deliver` routes them to the event channel that registered the
handle, parking events for a handle not yet registered (a new connection's
ID, before its CONNECT_REQUEST has been read).
"""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from softverbs.errors import PyverbsRDMAError


class EventQueue(Protocol):
    """What an event channel offers the router."""

    def push(self, event: dict[str, Any]) -> None: ...


class Kernel:
    """Commands, event routing and waiting (see the module docstring)."""

    def __init__(self) -> None:
        self.routes: dict[int, EventQueue] = {}
        self.parked: dict[int, deque[dict[str, Any]]] = {}
        self.dead: set[int] = set()  #: destroyed handles: their late events are dropped
        self.route_lock = threading.Lock()

    # --- commands --------------------------------------------------------------------
    def call(self, cmd: str, **kw: Any) -> Any:
        raise NotImplementedError

    # --- events --------------------------------------------------------------------------
    def register(self, handle: int, queue: EventQueue) -> None:
        with self.route_lock:
            self.routes[handle] = queue
            parked = self.parked.pop(handle, None)
        for ev in parked or ():
            queue.push(ev)

    def unregister(self, handle: int) -> None:
        with self.route_lock:
            self.routes.pop(handle, None)
            self.parked.pop(handle, None)
            self.dead.add(handle)

    def deliver(self, event: dict[str, Any]) -> None:
        handle = int(event.get("handle", -1))
        with self.route_lock:
            queue = self.routes.get(handle)
            if queue is None:
                if handle in self.dead:
                    return
                self.parked.setdefault(handle, deque()).append(event)
                return
        queue.push(event)

    # --- waiting ----------------------------------------------------------------------------
    def wait(self, ready: Callable[[], bool], timeout: float | None, cond: threading.Condition,
             devices: list[str]) -> bool:  # fmt: skip
        """Block until ``ready()``, making the devices progress meanwhile."""
        raise NotImplementedError


class _LocalWorld:
    """A registry's devices, minus UDP devices this process inherited by ``fork``."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def specs(self) -> list[Any]:
        return list(self.registry.specs())

    def open(self, name: str) -> Any:
        dev = self.registry.open(name)
        if any(dev.runtime is rt for rt in _inherited):
            # Its sockets are shared with the parent and its progress thread stayed
            # there: both processes would read each other's packets.
            raise PyverbsRDMAError(
                f"device {name} was opened in the parent process before fork(): an embedded "
                "UDP device belongs to one process. To use one device from several "
                "processes, serve it with softverbsd (set SOFTVERBS_SERVICE)",
                errno.EOPNOTSUPP,
            )
        return dev


class LocalKernel(Kernel):
    """The agent of this process's (or this simulation's) devices."""

    def __init__(self, registry: Any) -> None:
        super().__init__()
        from softverbs.cm.agent import CmAgent

        self.registry = registry
        self.agent = CmAgent(_LocalWorld(registry))

    def call(self, cmd: str, **kw: Any) -> Any:
        """The command through the same records a served device's CM gets
        (:mod:`softverbs.cm.wire`), so both paths convert alike."""
        from softverbs.cm import wire

        command = wire.COMMANDS.get(cmd)
        if command is None:
            raise PyverbsRDMAError(f"unknown CM command {cmd!r}", errno.EINVAL)
        args = command.kwargs(command.request(kw))
        if args.pop("channel", None) is not None:
            args["sink"] = self._deliver_record
        return command.result(command.reply(command.method(self.agent, **args)))

    def _deliver_record(self, event: dict[str, Any]) -> None:
        """An event as a served device's process reads it: through its CmEvent record."""
        from softverbs.cm import wire

        self.deliver(wire.event_dict(wire.event_record(event)))

    def _runtimes(self, devices: list[str]) -> list[Any]:
        agent = self.agent
        names = [d for d in devices if d in agent.devices] or list(agent.devices)
        rts: list[Any] = []
        for name in names:
            rt = agent.devices[name].runtime
            if all(rt is not r for r in rts):
                rts.append(rt)
        if not rts:
            rts.append(self.registry.inproc_runtime())
        return rts

    def wait(self, ready: Callable[[], bool], timeout: float | None, cond: threading.Condition,
             devices: list[str]) -> bool:  # fmt: skip
        rts = self._runtimes(devices)
        if any(rt.clock.virtual for rt in rts):
            return self._wait_virtual(ready, timeout, rts)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            for rt in rts:
                with rt.lock:
                    rt.progress()
            with cond:
                if ready():
                    return True
                now = time.monotonic()
                if end is not None and now >= end:
                    return False
                # Wake for the next timer of an in-process fabric (nothing else runs
                # it), for an event (the sink notifies), and at least every 50 ms.
                wait = 0.05
                for rt in rts:
                    with rt.lock:
                        nxt = rt.next_deadline()
                        if nxt is not None:
                            wait = min(wait, max(0.0, nxt - rt.clock.now()))
                if end is not None:
                    wait = min(wait, end - now)
                cond.wait(wait)

    @staticmethod
    def _wait_virtual(ready: Callable[[], bool], timeout: float | None, rts: list[Any]) -> bool:
        """On a virtual clock ``timeout`` is in simulated seconds: time jumps from
        timer to timer, and never past the end of the wait."""
        end = None if timeout is None else rts[0].clock.now() + timeout
        while True:
            for rt in rts:
                with rt.lock:
                    rt.progress()
            if ready():
                return True
            deadlines = []
            for rt in rts:
                with rt.lock:
                    nxt = rt.next_deadline()
                if nxt is not None:
                    deadlines.append(nxt)
            if end is not None and (not deadlines or min(deadlines) > end):
                for rt in rts:
                    rt.clock.advance(end)
                return False
            stepped = False
            for rt in rts:
                with rt.lock:
                    stepped = rt.idle_step() or stepped
            if not stepped:
                raise PyverbsRDMAError(
                    "the simulation is idle: no CM message in flight and no timer armed, so "
                    "the event this call waits for can never come", errno.EDEADLK
                )  # fmt: skip


class ServiceKernel(Kernel):
    """The agent inside ``softverbsd``, reached over the service connection."""

    def __init__(self, registry: Any) -> None:
        super().__init__()
        self.registry = registry
        self.runtime = registry.runtime
        from softverbs.cm import wire

        registry.cm_events(lambda event: self.deliver(wire.event_dict(event)))

    def call(self, cmd: str, **kw: Any) -> Any:
        """One agent command as its ``CM_*`` request (:mod:`softverbs.cm.wire`)."""
        from softverbs.cm import wire

        command = wire.COMMANDS.get(cmd)
        if command is None:
            raise PyverbsRDMAError(f"unknown CM command {cmd!r}", errno.EINVAL)
        return command.result(self.registry.cm_request(command.op, command.request(kw)))

    def wait(self, ready: Callable[[], bool], timeout: float | None, cond: threading.Condition,
             devices: list[str]) -> bool:  # fmt: skip
        return bool(self.runtime.wait_for(ready, timeout))


_kernels: weakref.WeakKeyDictionary[Any, Kernel] = weakref.WeakKeyDictionary()
_kernels_lock = threading.Lock()


def kernel_for(registry: Any) -> Kernel:
    """The CM kernel of the world ``registry`` names (see :func:`registry.active`)."""
    from softverbs.verbs.served import ServiceRegistry

    with _kernels_lock:
        if isinstance(registry, ServiceRegistry):
            conn = registry.connection()
            kernel = _kernels.get(conn)
            if kernel is None:
                kernel = _kernels[conn] = ServiceKernel(registry)
            return kernel
        kernel = _kernels.get(registry)
        if kernel is None:
            kernel = _kernels[registry] = LocalKernel(registry)
        return kernel


#: Runtimes of embedded UDP devices that were open when this process was forked.
_inherited: list[Any] = []


def _reset_after_fork() -> None:
    """A forked child owns none of its parent's CM IDs or connections, and
    must not drive the UDP devices its parent had open."""
    global _kernels, _kernels_lock
    _kernels = weakref.WeakKeyDictionary()
    _kernels_lock = threading.Lock()
    from softverbs.verbs.world import worlds

    for reg in worlds():
        for dev in list(getattr(reg, "devices", {}).values()):
            if getattr(dev.spec, "kind", "") == "udp":
                _inherited.append(dev.runtime)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
