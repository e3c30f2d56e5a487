"""Completion channels and completion queues.

A CQ is a ring the application polls (:class:`~softverbs.engine.rings.CompletionRing`,
in memory both sides map); the device writes completions into it.  A CQ made
on a completion channel tells the channel's sink when it is armed and a
completion arrives.  Resizing moves the CQEs not yet polled into the new
ring the request passes.
"""

from __future__ import annotations

from softverbs.device import records
from softverbs.device.core import (
    LIMITS,
    CompSink,
    CtxObj,
    Host,
    Obj,
    Owner,
    Resources,
    kind_class,
)
from softverbs.device.memory import full_fence
from softverbs.device.records import KIND_CHANNEL, KIND_CQ
from softverbs.engine.hca import HCA
from softverbs.engine.rings import CompletionRing
from softverbs.errors import einval


@kind_class
class ChannelObj(Obj):
    """A completion channel: its CQs' completion events go to its sink."""

    KIND = KIND_CHANNEL
    __slots__ = ("sink",)

    def __init__(self, owner: Owner, ctx: CtxObj, sink: CompSink | None) -> None:
        super().__init__(owner, ctx.device, ctx)
        self.sink = sink

    def teardown(self, hca: HCA) -> None:
        self.sink = None


@kind_class
class CQObj(Obj):
    KIND = KIND_CQ
    __slots__ = ()

    engine: CompletionRing

    def __init__(self, owner: Owner, ctx: CtxObj, ring: CompletionRing) -> None:
        super().__init__(owner, ctx.device, ctx)
        self.engine = ring

    def teardown(self, hca: HCA) -> None:
        ring = self.engine
        ring.set_error()
        ring.notify = None
        ring.fence = None
        ring.owner = None

    def describe(self, entry: dict[str, object]) -> None:
        entry.update(cqe=self.engine.capacity, waiting=self.engine.waiting())


def create_comp_channel(host: Host, owner: Owner, req: records.Ctx,
                        res: Resources) -> records.Handle:  # fmt: skip
    ctx = host.ctx(owner, req.ctx)
    rec = host.add(ChannelObj(owner, ctx, res.completions), (ctx,))
    rec.release = res.release
    return records.Handle(rec.handle, 0)


def create_cq(host: Host, owner: Owner, req: records.CreateCQ,
              res: Resources) -> records.CreateCQReply:  # fmt: skip
    ctx = host.ctx(owner, req.ctx)
    dev = ctx.device
    if not 1 <= req.cqe <= LIMITS["max_cqe"]:
        raise einval(f"Failed to create a CQ: cqe {req.cqe} is out of range; a CQ holds "
                     f"1..{LIMITS['max_cqe']} entries")  # fmt: skip
    if req.comp_vector != 0:
        raise einval(f"Failed to create a CQ: comp_vector {req.comp_vector} is out of range; "
                     "the device has 1 completion vector(s)")  # fmt: skip
    ring = res.cq
    if ring is None or ring.capacity != req.cqe:
        raise einval(f"Failed to create a CQ: no ring of {req.cqe} entries was passed")
    channel = host.opt(owner, req.channel, ChannelObj, dev)
    with host.on(dev):
        rec = host.add(CQObj(owner, ctx, ring), (ctx, channel))
        rec.release = res.release
        ring.owner = rec
        sink = channel.sink if channel is not None else None
        if sink is not None:
            handle = rec.handle
            ring.notify = lambda: sink(handle) if not owner.closed else None
            ring.fence = full_fence  # the application arms it from its own process
    return records.CreateCQReply(rec.handle, req.cqe)


def resize_cq(host: Host, owner: Owner, req: records.ResizeCQ,
              res: Resources) -> records.CreateCQReply:  # fmt: skip
    rec = host.obj(owner, req.cq, CQObj)
    ring = rec.engine
    new = res.cq
    with host.on(rec.device):
        waiting = ring.waiting()
        if not 1 <= req.cqe <= LIMITS["max_cqe"] or req.cqe < waiting:
            raise einval(f"Failed to resize CQ: it must hold 1..{LIMITS['max_cqe']} entries "
                         f"and at least the {waiting} waiting to be polled; {req.cqe} was "
                         "asked")  # fmt: skip
        if new is None or new.capacity != req.cqe:
            raise einval(f"Failed to resize CQ: no ring of {req.cqe} entries was passed")
        ring.move_to(new.slots, new.hdr, req.cqe)
        for close in rec.release:
            close()
        rec.release = res.release
    return records.CreateCQReply(rec.handle, req.cqe)
