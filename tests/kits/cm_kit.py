"""Helpers for the RDMA CM tests: simulated pairs of CM IDs, and packet filters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from softverbs.cm.api import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam
from softverbs.cm.mad import GSI_QPN
from softverbs.enums import (
    IBV_QPT_RC,
    IBV_QPT_UD,
    RAI_PASSIVE,
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_ROUTE_RESOLVED,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
    rdma_cm_event_type,
)
from softverbs.verbs.device import counters
from softverbs.verbs.qp import QPCap, QPInitAttr
from softverbs.wire.packet import Packet

A, B = "10.0.0.1", "10.0.0.2"  #: the Simulation's devices "a" and "b"


def expect(channel: CMEventChannel, event: int, timeout: float = 120.0) -> CMEvent:
    """The channel's next event, which must be ``event``."""
    ev = CMEvent(channel, timeout=timeout)
    assert ev.event_type == event, (
        f"expected {rdma_cm_event_type(event).name}, got {ev.event_str()} (status {ev.status})"
    )
    return ev


def qp_init(ps: int) -> QPInitAttr:
    qpt = IBV_QPT_UD if ps == RDMA_PS_UDP else IBV_QPT_RC
    return QPInitAttr(qp_type=qpt, cap=QPCap(max_send_wr=4, max_recv_wr=4))


def listener(port: int, ps: int = RDMA_PS_TCP, ip: str = B) -> tuple[CMEventChannel, CMID]:
    ch = CMEventChannel()
    lst = CMID(creator=ch, port_space=ps)
    lst.bind_addr(AddrInfo(src=ip, src_service=str(port), flags=RAI_PASSIVE, port_space=ps))
    lst.listen()
    return ch, lst


def active(port: int, ps: int = RDMA_PS_TCP, src: str = A, dst: str = B,
           qp: bool = True) -> tuple[CMEventChannel, CMID]:  # fmt: skip
    """An active CM ID with its address and route resolved (and a QP)."""
    ch = CMEventChannel()
    cid = CMID(creator=ch, port_space=ps)
    cid.resolve_addr(AddrInfo(src=src, dst=dst, dst_service=str(port), port_space=ps))
    expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED).ack_cm_event()
    cid.resolve_route()
    expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED).ack_cm_event()
    if qp:
        cid.create_qp(qp_init(ps))
    return ch, cid


class Requested(NamedTuple):
    """A connection request as the listener has it: its ID made, nothing answered."""

    pch: CMEventChannel
    lst: CMID
    ach: CMEventChannel
    act: CMID
    req: CMEvent
    child: CMID


def requested(port: int, ps: int = RDMA_PS_TCP, param: ConnParam | None = None,
              src: str = A, dst: str = B) -> Requested:  # fmt: skip
    """A listener on ``dst``, an active ID on ``src`` that connects to it, and the
    listener's new ID for the CONNECT_REQUEST (not yet acknowledged)."""
    pch, lst = listener(port, ps, ip=dst)
    ach, act = active(port, ps, src=src, dst=dst)
    act.connect(param or ConnParam())
    req = expect(pch, RDMA_CM_EVENT_CONNECT_REQUEST)
    return Requested(pch, lst, ach, act, req, CMID(creator=req, listen_id=lst))


def connect_pair(port: int, ps: int = RDMA_PS_TCP, param: ConnParam | None = None,
                 accept_param: ConnParam | None = None) -> dict[str, Any]:  # fmt: skip
    """Listener on b, active on a, connected; returns every object."""
    pch, lst, ach, act, req, child = requested(port, ps, param)
    req.ack_cm_event()
    child.create_qp(qp_init(ps))
    child.accept(accept_param or ConnParam())
    est = expect(ach, RDMA_CM_EVENT_ESTABLISHED)
    out = {"pch": pch, "lst": lst, "ach": ach, "act": act, "child": child, "req": req,
           "est": est}  # fmt: skip
    if ps == RDMA_PS_TCP:
        out["pest"] = expect(pch, RDMA_CM_EVENT_ESTABLISHED)
    return out


def cm_counters(cid: CMID) -> dict[str, int]:
    """The CM counters of ``cid``'s device."""
    return {k: v for k, v in counters(cid.context).items() if k.startswith("cm_")}


def fabric_counters(sim: Any) -> Counter[str]:
    """The CM counters of every device of a simulation, summed."""
    total: Counter[str] = Counter()
    for dev in sim.registry.devices.values():
        total.update({k: v for k, v in dev.hca.counters.items() if k.startswith("cm_")})
    return total


def mad_attr(pkt: Packet) -> int:
    data = bytes(pkt.payload)
    return int.from_bytes(data[16:18], "big") if len(data) >= 18 else -1


class DropMads:
    """A packet filter (``runtime.faults``) that drops CM MADs matching a test.

    ``drop(pkt)`` says whether to drop; ``limit`` caps how many are dropped.
    """

    def __init__(self, drop: Callable[[Packet], bool], limit: int | None = None) -> None:
        self.test = drop
        self.limit = limit
        self.dropped: list[int] = []

    def process(self, pkt: Packet, now: float) -> list[tuple[float, Packet]]:
        room = self.limit is None or len(self.dropped) < self.limit
        if pkt.dqpn == GSI_QPN and room and self.test(pkt):
            self.dropped.append(mad_attr(pkt))
            return []
        return [(now, pkt)]
