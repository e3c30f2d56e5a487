"""Watching the engine: the hooks a trace or a sanitizer hangs on.

A device's :class:`~softverbs.engine.hca.HCA` has an ``observer``: ``None``
(the default, and then every hook point costs one attribute test), or an
object with the methods of :class:`Observer`.  The engine calls them at the
moments a NIC's own tracing would see:

===================  ====================================================
``doorbell``         the driver moved a doorbell: new WQEs to fetch
``wqe_start``        a send WQE starts: its memory resolved, its PSNs given
``wqe_done``         a send WQE is finished and leaves the send queue (its CQE, if any, next)
``packet_out``       a packet (or a burst) leaves the QP for the fabric
``packet_in``        a packet (or a burst) reached its QP
``step``             the responder or the completer is done with a packet: where it ended
``retransmit``       the requester goes back to a PSN (timeout, NAK, RNR)
``rate``             the congestion control changed the QP's rate (a CNP, an increase)
``cqe``              a completion is written to a CQ
``state``            the QP changed state (by modify, or by itself)
``event``            an asynchronous event was posted
===================  ====================================================

Hooks run inside the engine, under the device's lock, and must not call
back into it: they record.  They get no time argument -- the engine is
sans-IO -- so an observer reads the clock of whatever drives the device
(its :class:`~softverbs.fabric.runtime.Runtime`); in a
:class:`~softverbs.sim.Simulation` that is virtual time.

:class:`Observers` fans one hook point out to several observers (a trace
and a sanitizer at once); :func:`attach` and :func:`detach` manage it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from softverbs.engine.core import QPCore
    from softverbs.engine.hca import HCA
    from softverbs.engine.rings import CQE, CompletionRing, SendWQE
    from softverbs.wire.packet import Packet

#: ``doorbell``'s queue names
SQ, RQ = "sq", "rq"
#: ``step``'s part names; the state is a :class:`~.responder.RespState` or a
#: :class:`~.completer.CompState`
RESPONDER, COMPLETER = "responder", "completer"


class Observer(Protocol):
    """What the engine tells an observer (see the module docstring)."""

    def doorbell(self, qp: QPCore, queue: str, index: int) -> None: ...
    def wqe_start(self, qp: QPCore, wqe: SendWQE) -> None: ...
    def wqe_done(self, qp: QPCore, wqe: SendWQE) -> None: ...
    def packet_out(self, qp: QPCore, pkt: Packet) -> None: ...
    def packet_in(self, qp: QPCore, pkt: Packet) -> None: ...
    def step(self, qp: QPCore, part: str, state: IntEnum) -> None: ...
    def retransmit(self, qp: QPCore, psn: int, why: str) -> None: ...
    def rate(self, qp: QPCore, bps: float, why: str) -> None: ...
    def cqe(self, qp: QPCore, cq: CompletionRing, cqe: CQE) -> None: ...
    def state(self, qp: QPCore, old: int, new: int) -> None: ...
    def event(self, event_type: int, element: Any) -> None: ...


class Observers:
    """Several observers behind one hook point, called in the order added."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = list(observers)

    def doorbell(self, qp: QPCore, queue: str, index: int) -> None:
        for o in self.observers:
            o.doorbell(qp, queue, index)

    def wqe_start(self, qp: QPCore, wqe: SendWQE) -> None:
        for o in self.observers:
            o.wqe_start(qp, wqe)

    def wqe_done(self, qp: QPCore, wqe: SendWQE) -> None:
        for o in self.observers:
            o.wqe_done(qp, wqe)

    def packet_out(self, qp: QPCore, pkt: Packet) -> None:
        for o in self.observers:
            o.packet_out(qp, pkt)

    def packet_in(self, qp: QPCore, pkt: Packet) -> None:
        for o in self.observers:
            o.packet_in(qp, pkt)

    def step(self, qp: QPCore, part: str, state: IntEnum) -> None:
        for o in self.observers:
            o.step(qp, part, state)

    def retransmit(self, qp: QPCore, psn: int, why: str) -> None:
        for o in self.observers:
            o.retransmit(qp, psn, why)

    def rate(self, qp: QPCore, bps: float, why: str) -> None:
        for o in self.observers:
            o.rate(qp, bps, why)

    def cqe(self, qp: QPCore, cq: CompletionRing, cqe: CQE) -> None:
        for o in self.observers:
            o.cqe(qp, cq, cqe)

    def state(self, qp: QPCore, old: int, new: int) -> None:
        for o in self.observers:
            o.state(qp, old, new)

    def event(self, event_type: int, element: Any) -> None:
        for o in self.observers:
            o.event(event_type, element)


def attach(hca: HCA, observer: Observer) -> None:
    """Add ``observer`` to the device's hooks."""
    current = hca.observer
    if current is None:
        hca.observer = observer
    elif isinstance(current, Observers):
        current.observers.append(observer)
    else:
        hca.observer = Observers(current, observer)


def attach_once(hca: HCA, observer: Observer) -> None:
    """Add ``observer`` unless it is already there."""
    current = hca.observer
    if current is observer or (isinstance(current, Observers) and observer in current.observers):
        return
    attach(hca, observer)


def detach(hca: HCA, observer: Observer) -> None:
    """Remove ``observer`` (no error if it is not there)."""
    current = hca.observer
    if current is observer:
        hca.observer = None
    elif isinstance(current, Observers):
        current.observers = [o for o in current.observers if o is not observer]
        if not current.observers:
            hca.observer = None
        elif len(current.observers) == 1:
            hca.observer = current.observers[0]
