"""Two processes connected by the RDMA CM through softverbsd (run by test_cm_processes).

``python cm_procs.py SCENARIO DEVICE IP PORT`` forks a passive and an active
process from one parent -- as rdma-core's RDMACMBaseTest does -- after the
parent has opened the device itself (so each child must leave the parent's
service connection alone).  Both use the device DEVICE, served by the
service that ``SOFTVERBS_SERVICE`` names, and the IP address IP.  The parent
prints one JSON line: each side's exit code and what it reported.

Scenarios: ``rc`` (SEND both ways, RDMA WRITE and READ, disconnect), ``ud``
(SIDR, then datagrams both ways), ``reject`` (with private data), ``crash``
(the passive process dies connected: its peer must see DISCONNECTED).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import traceback
from typing import Any

from softverbs.cm.api import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam, UDParam
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QPT_RC,
    IBV_QPT_UD,
    IBV_SEND_SIGNALED,
    RAI_PASSIVE,
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_DISCONNECTED,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_REJECTED,
    RDMA_CM_EVENT_ROUTE_RESOLVED,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
)
from softverbs.verbs.addr import AH
from softverbs.verbs.device import Context
from softverbs.verbs.mr import MR
from softverbs.verbs.qp import QPCap, QPInitAttr

GRH = 40
SIZE = 256


def _ev(ch: CMEventChannel, want: int) -> CMEvent:
    ev = CMEvent(ch, timeout=20)
    if ev.event_type != want:
        raise AssertionError(f"got {ev.event_str()} (status {ev.status}), wanted {want}")
    return ev


def _init(ud: bool) -> QPInitAttr:
    return QPInitAttr(qp_type=IBV_QPT_UD if ud else IBV_QPT_RC,
                      cap=QPCap(max_send_wr=4, max_recv_wr=4))  # fmt: skip


def passive(scenario: str, ip: str, port: int, bar: Any, q: Any) -> dict[str, Any]:
    ud = scenario == "ud"
    ps = RDMA_PS_UDP if ud else RDMA_PS_TCP
    ch = CMEventChannel()
    lst = CMID(creator=ch, port_space=ps)
    lst.bind_addr(AddrInfo(src=ip, src_service=str(port), flags=RAI_PASSIVE, port_space=ps))
    lst.listen()
    bar.wait()
    req = _ev(ch, RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lst)
    got: dict[str, Any] = {"private_data": req.private_data[:5].decode()}
    req.ack_cm_event()
    if scenario == "reject":
        child.reject(b"go away")
        bar.wait()
        return got
    child.create_qp(_init(ud))
    access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE
    mr = MR(child.pd, SIZE + GRH, access)
    child.post_recv(mr)
    child.accept(ConnParam())
    if not ud:
        _ev(ch, RDMA_CM_EVENT_ESTABLISHED).ack_cm_event()
    q.put((mr.buf, mr.rkey))
    wc = child.get_recv_comp()
    got["received"] = mr.read(4, GRH if ud else 0).decode()
    # the reply of a UD server: an AH from the completion and the GRH in the buffer
    ah = AH(child.pd, wc=wc, port_num=1, grh=mr.buf) if ud else None
    mr.write(b"pong" * (SIZE // 4), SIZE)
    if ah is not None:
        child.post_ud_send(mr, ah, rqpn=wc.src_qp, length=SIZE)
    else:
        child.post_send(mr, length=SIZE)
    got["send_status"] = child.get_send_comp().status
    bar.wait()  # the active side WRITEs and READs our memory meanwhile
    if scenario == "crash":
        return got  # and exit connected, without a disconnect (see _side)
    if not ud:
        got["written"] = mr.read(4, 0).decode()
        child.disconnect()
    return got


def active(scenario: str, ip: str, port: int, bar: Any, q: Any) -> dict[str, Any]:
    ud = scenario == "ud"
    ps = RDMA_PS_UDP if ud else RDMA_PS_TCP
    ch = CMEventChannel()
    cm = CMID(creator=ch, port_space=ps)
    bar.wait()
    cm.resolve_addr(AddrInfo(src=ip, dst=ip, dst_service=str(port), port_space=ps))
    _ev(ch, RDMA_CM_EVENT_ADDR_RESOLVED).ack_cm_event()
    cm.resolve_route()
    _ev(ch, RDMA_CM_EVENT_ROUTE_RESOLVED).ack_cm_event()
    cm.create_qp(_init(ud))
    param = ConnParam(data_len=8)
    param.set_private_data(b"hello")
    cm.connect(param)
    got: dict[str, Any] = {"dev": cm.dev_name}
    if scenario == "reject":
        rej = _ev(ch, RDMA_CM_EVENT_REJECTED)
        got["reject"] = [rej.status, rej.private_data[:7].decode()]
        bar.wait()
        return got
    est = _ev(ch, RDMA_CM_EVENT_ESTABLISHED)
    params = UDParam(est) if ud else None
    est.ack_cm_event()
    raddr, rkey = q.get(timeout=20)
    mr = cm.reg_msgs(SIZE + GRH)
    mr.write(b"ping" * (SIZE // 4), SIZE)
    cm.post_recv(mr)
    if params is not None:
        ah = AH(cm.pd, attr=params.ah_attr)
        cm.post_ud_send(mr, ah, rqpn=params.qp_num, length=SIZE)
    else:
        cm.post_send(mr, length=SIZE)
    got["send_status"] = cm.get_send_comp().status
    cm.get_recv_comp()
    got["received"] = mr.read(4, GRH if ud else 0).decode()
    if not ud:
        mr.write(b"writ" * (SIZE // 4), SIZE)
        cm.post_write(mr, SIZE, raddr, rkey, flags=IBV_SEND_SIGNALED)
        got["write_status"] = cm.get_send_comp().status
        cm.post_read(mr, SIZE, raddr, rkey, flags=IBV_SEND_SIGNALED)
        got["read_status"] = cm.get_send_comp().status
        got["read"] = mr.read(4, 0).decode()
    bar.wait()
    if not ud:
        dis = _ev(ch, RDMA_CM_EVENT_DISCONNECTED)
        got["disconnected"] = dis.status
        cm.disconnect()
    return got


def _side(fn: Any, results: Any, *args: Any) -> None:
    try:
        results.put((fn.__name__, fn(*args)))
    except BaseException:
        results.put((fn.__name__, {"error": traceback.format_exc()}))
        sys.exit(2)
    if fn is passive and args[0] == "crash":
        results.close()
        results.join_thread()
        os._exit(0)  # no cleanup of any kind: the service must tell the peer


def main() -> int:
    scenario, dev, ip, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    Context(name=dev).query_device()  # the parent uses the service before it forks
    ctx = mp.get_context("fork")
    bar, q, results = ctx.Barrier(2, timeout=20), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_side, args=(fn, results, scenario, ip, port, bar, q))
             for fn in (passive, active)]  # fmt: skip
    for p in procs:
        p.start()
    out: dict[str, Any] = {}
    for _ in procs:
        try:
            name, got = results.get(timeout=40)
        except Exception:
            break
        out[name] = got
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    out["exitcodes"] = [p.exitcode for p in procs]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
