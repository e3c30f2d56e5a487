"""softverbs' side of the RDMA CM interop runs against rxe (run by test_cm_rxe).

``python cm_rxe_side.py client SERVER_IP`` speaks to librdmacm's
``rdma_server`` example: connect to port 7471, send 16 bytes, receive 16,
disconnect.  ``python cm_rxe_side.py server LOCAL_IP`` is ``rdma_server``
itself, for the guest's ``rdma_client``.  ``python cm_rxe_side.py udclient
SERVER_IP`` is one ``udaddy`` client: SIDR to port 7174, ten 100-byte
datagrams (SEND with our QPN as immediate data, as udaddy sends them), ten
replies back.  Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

from softverbs.cm.api import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam, UDParam
from softverbs.enums import (
    IBV_QPT_RC,
    IBV_QPT_UD,
    IBV_SEND_SIGNALED,
    IBV_WR_SEND_WITH_IMM,
    RAI_PASSIVE,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
)
from softverbs.verbs.addr import AH
from softverbs.verbs.qp import QPCap, QPInitAttr
from softverbs.verbs.wr import SGE, RecvWR, SendWR

PORT = "7471"


def _init() -> QPInitAttr:
    return QPInitAttr(qp_type=IBV_QPT_RC, cap=QPCap(max_send_wr=1, max_recv_wr=1),
                      sq_sig_all=1)  # fmt: skip


def client(server: str) -> dict[str, object]:
    cm = CMID(creator=AddrInfo(dst=server, dst_service=PORT, port_space=RDMA_PS_TCP),
              qp_init_attr=_init())  # fmt: skip
    rmr, smr = cm.reg_msgs(16), cm.reg_msgs(16)
    cm.post_recv(rmr)
    cm.connect()
    smr.write(b"softverbs client", 16)
    cm.post_send(smr)
    send = cm.get_send_comp().status
    recv = cm.get_recv_comp()
    cm.disconnect()
    return {"send": send, "recv": recv.status, "bytes": recv.byte_len,
            "src": cm.src_addr, "dst": cm.dst_addr}  # fmt: skip


def server(local: str) -> dict[str, object]:
    lst = CMID(creator=AddrInfo(src=local, src_service=PORT, port_space=RDMA_PS_TCP,
                                flags=RAI_PASSIVE), qp_init_attr=_init())  # fmt: skip
    lst.listen()
    print("LISTENING", flush=True)
    cm = lst.get_request()
    rmr, smr = cm.reg_msgs(16), cm.reg_msgs(16)
    cm.post_recv(rmr)
    cm.accept()
    recv = cm.get_recv_comp()
    got = rmr.read(recv.byte_len, 0)
    smr.write(b"softverbs server", 16)
    cm.post_send(smr)
    send = cm.get_send_comp().status
    cm.disconnect()
    return {"send": send, "recv": recv.status, "bytes": recv.byte_len, "data": got.hex()}


def udclient(server: str, count: int = 10, size: int = 100) -> dict[str, object]:
    ch = CMEventChannel()
    cm = CMID(creator=ch, port_space=RDMA_PS_UDP)
    cm.resolve_addr(AddrInfo(dst=server, dst_service="7174", port_space=RDMA_PS_UDP))
    CMEvent(ch, timeout=10).ack_cm_event()
    cm.resolve_route()
    CMEvent(ch, timeout=10).ack_cm_event()
    cm.create_qp(QPInitAttr(qp_type=IBV_QPT_UD, cap=QPCap(max_send_wr=count,
                                                          max_recv_wr=count)))  # fmt: skip
    slot = size + 40
    mr = cm.reg_msgs(slot * (count + 1))
    for i in range(count):  # every reply has a buffer before the first send
        cm.qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf + i * slot, slot, mr.lkey)]))
    cm.connect(ConnParam())
    ev = CMEvent(ch, timeout=30)
    assert ev.event_type == RDMA_CM_EVENT_ESTABLISHED, ev.event_str()
    ud = UDParam(ev)
    ah = AH(cm.pd, attr=ud.ah_attr)
    qpn = int(cm.qpn or 0)
    imm = int.from_bytes(qpn.to_bytes(4, "big"), sys.byteorder)  # htobe32(qp_num)
    sent = 0
    for _ in range(count):
        sge = SGE(mr.buf + count * slot, size, mr.lkey)
        wr = SendWR(opcode=IBV_WR_SEND_WITH_IMM, num_sge=1, sg=[sge],
                    send_flags=IBV_SEND_SIGNALED, imm_data=imm)  # fmt: skip
        wr.set_wr_ud(ah, ud.qp_num, ud.qkey)
        cm.qp.post_send(wr)
        sent += cm.get_send_comp().status == 0
    got = 0
    for _ in range(count):
        wc = cm.get_recv_comp()
        got += wc.status == 0 and wc.byte_len == slot
    return {"qp_num": ud.qp_num, "qkey": ud.qkey, "sent": sent, "received": got}


if __name__ == "__main__":
    role, ip = sys.argv[1], sys.argv[2]
    run = {"client": client, "server": server, "udclient": udclient}[role]
    print(json.dumps(run(ip)), flush=True)
