"""Protection domains (pyverbs ``PD``, ``ParentDomain``).

A PD is an identity: memory keys and QPs of one PD can reach each other; a
key of another PD is refused (local protection or remote access error).  The
engine compares PDs by identity, through :attr:`PD.engine_pd`:

* a PD is its own engine PD;
* a :class:`ParentDomain` (``ibv_alloc_parent_domain``) protects with the PD
  it was made from, so an MR of either one serves a QP of either one;
* an imported PD (``PD(ctx, handle=...)``, ``ibv_import_pd``) is the very PD
  it was imported from.

Parent domain allocators.  ``ibv_alloc_parent_domain`` lets a program supply
``alloc``/``free`` callbacks that a provider *may* use for the buffers it
shares with the hardware (WQE rings, doorbell records).  softverbs' providers
share no such buffers with anything -- rings are device-side objects (or
the device service's shared memory, which it allocates itself) -- so the
callbacks are kept but never called.  Everything else a parent domain is
(a PD for QPs, SRQs, MRs, windows, AHs and extended CQs) works.

``advise_mr`` (``ibv_advise_mr``) prefetches pages of on-demand-paging MRs:
softverbs touches them, so they are resident when the device uses them.
"""

from __future__ import annotations

import errno
from typing import Any

from softverbs.device import ops, records
from softverbs.enums import (
    IBV_ACCESS_ON_DEMAND,
    IBV_ADVISE_MR_ADVICE_PREFETCH,
    IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
    IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
    IBV_ADVISE_MR_FLAG_FLUSH,
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS,
    IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError
from softverbs.verbs.base import PyverbsCM, PyverbsObject, as_uint, require
from softverbs.verbs.device import Context
from softverbs.verbs.provider import destroy
from softverbs.verbs.sge import SGE

_ADVICES = (IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)  # fmt: skip


class PD(PyverbsCM):
    """A protection domain: ``PD(ctx)``, or ``PD(ctx, handle=h)`` to import one."""

    close_rank = 80

    def __init__(self, creator: Any, **kwargs: Any) -> None:
        super().__init__()
        if not isinstance(creator, Context):
            raise PyverbsUserError(f"Cannot create PD from {type(creator)}")
        creator._check_open()
        self.ctx: Context = creator
        self._ctx = creator
        self._imported = False
        handle = kwargs.get("handle")
        if handle is not None:
            original = creator.ucontext.lookup(PD, handle, "Failed to import PD")
            self._engine_pd: PD = original.engine_pd
            self._handle: int = original.handle
            self._imported = True
        else:
            self._engine_pd = self
            reply = creator.provider.call(ops.ALLOC_PD, records.Ctx(creator.handle, 0))
            self.dev_handle: int = reply.handle  #: the device's name for this PD
            self._handle = creator.ucontext.add(self)
        creator.add_ref(self)

    @property
    def engine_pd(self) -> PD:
        """The PD the device checks keys and QPs against."""
        return self._engine_pd

    @property
    def device_pd(self) -> int:
        """The device's handle of :attr:`engine_pd`."""
        return self._engine_pd.dev_handle

    def _release(self) -> None:
        if not self._imported:
            self.ctx.ucontext.remove(self)
            destroy(self.ctx.provider, records.KIND_PD, self.dev_handle)

    def unimport(self) -> None:
        """``ibv_unimport_pd``: forget an imported PD without freeing it."""
        self.close()

    @property
    def context(self) -> Any:
        return self.ctx

    @property
    def handle(self) -> int:
        return self._handle

    @property
    def pd(self) -> int:
        return id(self._engine_pd)

    def advise_mr(self, advise: int, flags: int, sg_list: list[Any]) -> int:
        """``ibv_advise_mr``: prefetch ranges of ODP MRs of this PD (0 on success)."""
        self._check_open()
        if not isinstance(sg_list, (list, tuple)):
            raise PyverbsUserError(f"sg_list must be a list of SGEs, got {type(sg_list).__name__}")
        advise = as_uint(advise, 32, "advise")
        flags = as_uint(flags, 32, "flags")
        sges = list(sg_list)
        for s in sges:
            require(s, SGE, "sg_list entry")
        fail = "Failed to advise MR"
        if advise not in _ADVICES:
            raise PyverbsRDMAError(f"{fail}: unknown advice {advise}", errno.EOPNOTSUPP)
        if flags & ~IBV_ADVISE_MR_FLAG_FLUSH:
            raise PyverbsRDMAError(f"{fail}: unknown flags {flags:#x}", errno.EOPNOTSUPP)
        if not sges:
            raise PyverbsRDMAError(f"{fail}: the SGE list is empty", errno.EINVAL)
        for s in sges:
            mr = self.ctx.ucontext.by_lkey(s.lkey)
            if mr is None or mr.pd.engine_pd is not self.engine_pd:
                raise PyverbsRDMAError(f"{fail}: lkey {s.lkey:#x} is not an MR of this PD",
                                       errno.EINVAL)  # fmt: skip
            if not mr.access & IBV_ACCESS_ON_DEMAND:
                raise PyverbsRDMAError(f"{fail}: lkey {s.lkey:#x} is not an on-demand "
                                       "paging MR", errno.EOPNOTSUPP)  # fmt: skip
            mr.prefetch(s.addr, s.length, advise != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
        return 0


class ParentDomainContext(PyverbsObject):
    """The ``pd_context`` of a parent domain: Python alloc/free callbacks and user data."""

    def __init__(self, pd: PD, alloc_func: Any, free_func: Any, user_data: Any = None) -> None:
        super().__init__()
        require(pd, PD, "pd")
        if not callable(alloc_func) or not callable(free_func):
            raise PyverbsUserError("alloc_func and free_func must be callable")
        self.pd = pd
        self.p_alloc = alloc_func
        self.p_free = free_func
        self.user_data = user_data


class ParentDomainInitAttr(PyverbsObject):
    """``ibv_parent_domain_init_attr``: ``ParentDomainInitAttr(pd, pd_context=None)``."""

    def __init__(self, pd: PD, pd_context: ParentDomainContext | None = None) -> None:
        super().__init__()
        require(pd, PD, "pd")
        require(pd_context, ParentDomainContext, "pd_context", optional=True)
        self.pd = pd
        self.pd_context = pd_context
        self._comp_mask = (
            IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT | IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
            if pd_context is not None
            else 0
        )

    @property
    def comp_mask(self) -> int:
        return int(self._comp_mask)


class ParentDomain(PD):
    """A parent domain: ``ParentDomain(ctx, attr=ParentDomainInitAttr(pd, ...))``.

    It protects with ``attr.pd`` (see the module docstring); closing ``attr.pd``
    closes the parent domain first.
    """

    close_rank = 75

    def __init__(self, context: Context, attr: ParentDomainInitAttr) -> None:
        require(context, Context, "context")
        require(attr, ParentDomainInitAttr, "attr")
        attr.pd._check_open()
        if attr.pd.ctx.device is not context.device:
            raise PyverbsRDMAError("Failed to allocate Parent Domain: the PD belongs to "
                                   "another device", errno.EINVAL)  # fmt: skip
        PyverbsCM.__init__(self)
        self.ctx = context
        self._ctx = context
        self._imported = False
        self.protection_domain = attr.pd
        self.pd_context = attr.pd_context
        self._engine_pd = attr.pd.engine_pd
        self._handle = context.ucontext.add(self)
        attr.pd.add_ref(self)
        context.add_ref(self)

    def _release(self) -> None:
        self.ctx.ucontext.remove(self)
