"""Providers: how verbs objects reach the device that runs their engine.

libibverbs talks to a NIC through a provider library; softverbs' verbs
objects talk to a device through a provider too.  Two exist:

* :class:`EmbeddedProvider` -- the engine runs in this process.  Every
  method acts on the device's :class:`~softverbs.engine.hca.HCA` directly and
  returns real engine objects (QPEngine, CompletionQueue, SharedRQ, MemKey).
* :class:`softverbs.service.client.ServiceProvider` -- the engine runs in the
  device service (``softverbsd``), another process.  It returns proxies
  with the same interface, backed by shared-memory rings and a socket.

Verbs objects only create and destroy through the provider; afterwards they
use the engine-shaped interface of what they got back (``set_attrs``,
``set_state``, ``doorbell``, ``state``, ring ``push``/``take``...), which is
why there is one verbs layer, not two.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Any

from softverbs.engine.hca import HCA, XrcDomain
from softverbs.engine.memory import MemKey, MemKind
from softverbs.engine.qp import QPEngine
from softverbs.engine.queues import CompletionQueue, SharedRQ, WorkQueue
from softverbs.enums import IBV_EVENT_SRQ_LIMIT_REACHED, IBV_QPT_XRC_RECV
from softverbs.errors import PyverbsRDMAError, ebusy, einval
from softverbs.fabric.runtime import Runtime

if TYPE_CHECKING:
    from softverbs.verbs.dm import DmPool
    from softverbs.verbs.memory import Memory


class EmbeddedProvider:
    """The device's engine lives in this process."""

    #: What the device can do beyond the basics (``ibv_query_device_ex``); a
    #: provider without these attributes (the device service's) has neither.
    #: On-demand paging: the engine reaches every mapped address of this
    #: process, at the moment of each access (see softverbs.verbs.device_ex).
    on_demand_paging = True
    #: Device memory (``ibv_alloc_dm``): the device's own bytes, in this process.
    device_memory = True
    #: ``ibv_modify_srq`` with IBV_SRQ_MAX_WR (``IBV_DEVICE_SRQ_RESIZE``).
    srq_resize = True

    def __init__(self, hca: HCA, runtime: Runtime) -> None:
        self.hca = hca
        self.runtime = runtime
        #: who "this process" is when it registers with an XRC receive QP
        self.process: object = object()
        self._dm_pool: DmPool | None = None

    # --- protection domains and memory ----------------------------------------------
    def alloc_pd(self, pd: object) -> None:
        """Nothing to do: the engine compares PDs by identity."""

    def dealloc_pd(self, pd: object) -> None:
        pass

    def dm_pool(self) -> DmPool:
        """The device's on-device memory (``ibv_alloc_dm``), made on first use."""
        from softverbs.verbs.dm import DmPool

        if self._dm_pool is None:
            self._dm_pool = DmPool()
        return self._dm_pool

    def alloc_memory(self, length: int) -> Memory:
        """Fresh, zeroed, page-aligned memory for ``MR(pd, length, access)``."""
        from softverbs.verbs import memory

        return memory.allocate(length)

    # --- queue pairs -------------------------------------------------------------
    def create_qp(
        self,
        qp_type: int,
        pd: object,
        send_cq: CompletionQueue | None,
        recv_cq: CompletionQueue | None,
        srq: SharedRQ | None,
        xrcd: XrcDomain | None,
        sq_size: int | None,
        rq_size: int | None,
        sq_sig_all: bool,
        pmtu: int,
        owner: Any,
        rings: tuple[Any, Any] | None = None,
        caps: tuple[int, int, int] = (1, 0, 1),
        engine_cls: type[QPEngine] = QPEngine,
    ) -> QPEngine:
        """A QP engine.  ``rings`` (send, receive) overrides the local rings
        the sizes would make: the device service passes shared-memory ones,
        and an ``engine_cls`` that mirrors the QP state into them.
        ``caps`` (max send SGEs, max inline bytes, max receive SGEs) size the
        slots of rings that need a fixed layout; local rings do not."""
        hca = self.hca
        if rings is None:
            rings = (
                WorkQueue(sq_size) if sq_size is not None else None,
                WorkQueue(rq_size) if rq_size is not None else None,
            )
        with self.runtime.lock:
            qpn = hca.alloc_qpn(xrc_recv=qp_type == IBV_QPT_XRC_RECV)
            eng = engine_cls(
                hca, qpn, qp_type, pd, send_cq, recv_cq, rings[0], rings[1],
                srq, sq_sig_all, owner=owner,
            )  # fmt: skip
            eng.xrcd = xrcd
            eng.pmtu = pmtu
            hca.qps[qpn] = eng
        return eng

    def destroy_qp(self, eng: QPEngine) -> None:
        with self.runtime.lock:
            eng.reset()
            self.hca.qps.pop(eng.qpn, None)
            self.hca.xrc_refs.pop(eng.qpn, None)
            self.runtime.progress()

    # --- XRC receive QPs: owned by the device, held by processes (seed 002) -----------
    def xrc_hold(self, eng: QPEngine, holder: object) -> None:
        """``holder`` (a process, or a QP object) now keeps the receive QP alive."""
        with self.runtime.lock:
            self.hca.xrc_refs.setdefault(eng.qpn, set()).add(holder)

    def xrc_lookup(self, domain: XrcDomain, qpn: int) -> QPEngine:
        """The XRC receive QP ``qpn`` of ``domain``, or EINVAL saying why not."""
        hca = self.hca
        with self.runtime.lock:
            eng = hca.qps.get(qpn)
            if eng is None or not isinstance(eng, QPEngine):
                raise einval(f"QP {qpn:#x} does not exist")
            if eng.qp_type != IBV_QPT_XRC_RECV or qpn not in hca.xrc_refs:
                raise einval(f"QP {qpn:#x} is not an XRC receive QP")
            if eng.xrcd is not domain:
                raise einval(f"XRC receive QP {qpn:#x} belongs to another XRC domain")
            return eng

    def xrc_release(self, eng: QPEngine, holder: object) -> bool:
        """``holder`` lets go; the last one destroys the QP.  True if destroyed."""
        with self.runtime.lock:
            refs = self.hca.xrc_refs.get(eng.qpn)
            if refs is None:
                return False
            refs.discard(holder)
            if refs:
                return False
            self.destroy_qp(eng)
            return True

    def xrc_rcv_qp_alloc(
        self, domain: XrcDomain, steps: list[tuple[int, dict[str, Any]]], holder: object
    ) -> int:
        """Create a receive QP in ``domain``, apply ``steps`` (state, attributes),
        and register ``holder`` -- atomically, as ``ibv_xrc_rcv_qp_alloc``."""
        eng = self.create_qp(IBV_QPT_XRC_RECV, None, None, None, None, domain, None, None,
                             False, 1024, None)  # fmt: skip
        with self.runtime.lock:
            try:
                for state, values in steps:
                    eng.set_attrs(values)
                    eng.set_state(state, self.runtime.clock.now())
            except Exception:
                self.destroy_qp(eng)
                raise
            self.xrc_hold(eng, holder)
        return eng.qpn

    def xrc_register(self, domain: XrcDomain, qpn: int) -> None:
        """``ibv_xrc_rcv_qp_register``: once per process; again adds no reference."""
        self.xrc_hold(self.xrc_lookup(domain, qpn), self.process)

    def xrc_unregister(self, domain: XrcDomain, qpn: int) -> None:
        """``ibv_xrc_rcv_qp_unregister``: the last registration destroys the QP."""
        self.xrc_release(self.xrc_lookup(domain, qpn), self.process)

    def open_xrc_qp(self, domain: XrcDomain, qpn: int, holder: object) -> QPEngine:
        """``ibv_open_qp``: a new handle on an existing receive QP."""
        eng = self.xrc_lookup(domain, qpn)
        self.xrc_hold(eng, holder)
        return eng

    def xrc_release_all(self, holder: object) -> None:
        """A process is gone: drop every reference it held."""
        with self.runtime.lock:
            for qpn, refs in list(self.hca.xrc_refs.items()):
                if holder in refs:
                    eng = self.hca.qps.get(qpn)
                    if isinstance(eng, QPEngine):
                        self.xrc_release(eng, holder)

    # --- completion and shared receive queues ------------------------------------------
    def create_cq(self, capacity: int, owner: Any) -> CompletionQueue:
        ring = CompletionQueue(capacity)
        ring.owner = owner
        return ring

    def destroy_cq(self, ring: CompletionQueue) -> None:
        ring.error = True

    def create_srq(
        self,
        max_wr: int,
        max_sge: int,
        limit: int,
        pd: object,
        xrcd: XrcDomain | None,
        cq: CompletionQueue | None,
        owner: Any,
        ring: Any = None,
    ) -> SharedRQ:
        """An SRQ; ``ring`` overrides the local one (the service's shared ring)."""
        hca = self.hca
        srq: SharedRQ = ring if ring is not None else SharedRQ(max_wr, max_sge)
        with self.runtime.lock:
            srq.owner = owner
            srq.pd = pd
            srq.xrcd = xrcd
            srq.cq = cq
            srq.armed_limit = limit
            srq.on_limit = lambda r: hca.post_event(IBV_EVENT_SRQ_LIMIT_REACHED, r)
            if xrcd is not None:
                srq.srqn = hca.alloc_srqn()
                hca.srqs[srq.srqn] = srq
        return srq

    def destroy_srq(self, ring: SharedRQ) -> None:
        with self.runtime.lock:
            if self.hca.srqs.get(ring.srqn) is ring:
                del self.hca.srqs[ring.srqn]

    # --- memory --------------------------------------------------------------------------
    def reg_mr(self, pd: object, mem: Memory, access: int, owner: Any) -> MemKey:
        with self.runtime.lock:
            return self.hca.keys.register(MemKind.MR, pd, mem.view, mem.addr, access, owner)

    def reg_mr_implicit(self, pd: object, resolver: Any, access: int, owner: Any) -> MemKey:
        """An implicit ODP region: one key for every mapped address."""
        with self.runtime.lock:
            return self.hca.keys.register_implicit(pd, resolver, access, owner)

    def update_mr(self, key: MemKey, mem: Memory | None, access: int | None, pd: object) -> None:
        """``ibv_rereg_mr``: new translation, access and/or PD for a region."""
        from softverbs.enums import IBV_ACCESS_ZERO_BASED

        with self.runtime.lock:
            if key.binds:
                raise ebusy("rereg: memory windows are bound to this MR")
            if access is not None:
                key.access = access
            if mem is not None:
                key.view = mem.view
                key.length = len(mem.view)
            base = mem.addr if mem is not None else key.iova
            if mem is not None or access is not None:
                key.iova = 0 if key.access & IBV_ACCESS_ZERO_BASED else base
            if pd is not None:
                key.pd = pd

    def dereg_mr(self, key: MemKey) -> None:
        with self.runtime.lock:
            if key.binds:
                raise ebusy(
                    f"Failed to dereg MR: {key.binds} memory window(s) are still bound to it; "
                    "invalidate or deallocate them first"
                )
            self.hca.keys.unregister(key)

    def alloc_mw(self, pd: object, kind: MemKind, owner: Any) -> MemKey:
        with self.runtime.lock:
            return self.hca.keys.register(kind, pd, None, 0, 0, owner)

    def dealloc_mw(self, key: MemKey) -> None:
        with self.runtime.lock:
            if key.mr is not None:
                key.mr.binds -= 1
                key.mr = None
            self.hca.keys.unregister(key)

    # --- XRC domains --------------------------------------------------------------------
    def open_xrcd(self, fd: int, oflags: int) -> XrcDomain:
        """``ibv_open_xrcd``: the domain shared through ``fd``'s file, or a new one."""
        key = None
        if fd != -1:
            try:
                st = os.fstat(fd)
            except OSError as exc:
                raise PyverbsRDMAError(f"Failed to allocate XRCD: fd {fd}: {exc}",
                                       errno.EBADF) from None  # fmt: skip
            key = (st.st_dev, st.st_ino)
        hca = self.hca
        with self.runtime.lock:
            domain = hca.xrcds.get(key) if key is not None else None
            if domain is not None:
                if oflags & os.O_CREAT and oflags & os.O_EXCL:
                    raise PyverbsRDMAError(
                        "Failed to allocate XRCD: the file already backs an XRC domain "
                        "and O_EXCL was given",
                        errno.EEXIST,
                    )
            else:
                if not oflags & os.O_CREAT:
                    raise einval("Failed to allocate XRCD: no XRC domain uses this file; "
                                 "pass O_CREAT to create one")  # fmt: skip
                domain = hca.open_xrcd(key)
            domain.refs += 1
            return domain

    def close_xrcd(self, domain: XrcDomain) -> None:
        with self.runtime.lock:
            self.hca.close_xrcd(domain)

    # --- device ---------------------------------------------------------------------------
    @property
    def gids(self) -> list[bytes]:
        return self.hca.gids

    def set_event_sink(self, sink: Any) -> None:
        """Where async events go: ``sink(event_type, engine object)``."""
        self.hca.on_event = sink

    def counters(self) -> dict[str, int]:
        with self.runtime.lock:
            return dict(self.hca.counters)
