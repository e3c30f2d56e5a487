"""Protection domains and address handles.

A PD is an identity the engine compares: a region, a window or a QP of one
PD never meets the memory keys of another.  An address handle is a route
(:func:`~softverbs.device.core.resolve_route`) resolved when it is created,
against the device's GID table; a UD send WQE names it by handle.
"""

from __future__ import annotations

from softverbs.device import records
from softverbs.device.core import CtxObj, Host, Obj, Owner, Resources, kind_class, resolve_route
from softverbs.device.records import KIND_AH, KIND_PD
from softverbs.engine.rings import Route


class ProtectionDomain:
    """A protection domain's identity: the engine compares PDs by identity."""

    __slots__ = ()


@kind_class
class PDObj(Obj):
    KIND = KIND_PD
    __slots__ = ()

    engine: ProtectionDomain

    def __init__(self, owner: Owner, ctx: CtxObj) -> None:
        super().__init__(owner, ctx.device, ctx)
        self.engine = ProtectionDomain()


@kind_class
class AHObj(Obj):
    KIND = KIND_AH
    __slots__ = ()

    engine: Route

    def __init__(self, owner: Owner, pd: PDObj, route: Route) -> None:
        super().__init__(owner, pd.device, pd.ctx)
        self.engine = route


def alloc_pd(host: Host, owner: Owner, req: records.Ctx, res: Resources) -> records.Handle:
    ctx = host.ctx(owner, req.ctx)
    rec = host.add(PDObj(owner, ctx), (ctx,))
    return records.Handle(rec.handle, 0)


def create_ah(host: Host, owner: Owner, req: records.CreateAH, res: Resources) -> records.Handle:
    pd = host.obj(owner, req.pd, PDObj)
    route = resolve_route(pd.device.hca.gids, req.av, "Failed to create AH")
    rec = host.add(AHObj(owner, pd, route), (pd,))
    return records.Handle(rec.handle, 0)
