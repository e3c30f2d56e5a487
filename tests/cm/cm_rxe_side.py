"""softverbs' side of the RDMA CM interop runs against rxe (run by test_cm_rxe).

``python cm_rxe_side.py client SERVER_IP`` speaks to librdmacm's
``rdma_server`` example: connect to port 7471, send 16 bytes, receive 16,
disconnect.  ``python cm_rxe_side.py server LOCAL_IP`` is ``rdma_server``
itself, for the guest's ``rdma_client``.  Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

from softverbs.cm import CMID, AddrInfo
from softverbs.enums import IBV_QPT_RC, RAI_PASSIVE, RDMA_PS_TCP
from softverbs.verbs.qp import QPCap, QPInitAttr

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


if __name__ == "__main__":
    role, ip = sys.argv[1], sys.argv[2]
    print(json.dumps(client(ip) if role == "client" else server(ip)), flush=True)
