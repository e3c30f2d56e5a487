"""An RC ping-pong written against pyverbs, in the style of rdma-core's tests.

It imports nothing but ``pyverbs.*`` and the standard library, so it runs
unchanged on real hardware with rdma-core's pyverbs. Under
``softverbs exec`` it runs on softverbs. Two RC QPs on one device are
connected to each other. Each side SENDs to the other ``ITERS`` times, then
the client RDMA WRITEs into the server's buffer. Every completion and every
byte is checked. It prints ``PASS`` and exits 0, or raises.
"""

from __future__ import annotations

import random
import sys
import time

import pyverbs.device as d
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.libibverbs_enums import (
    IBV_LINK_LAYER_ETHERNET,
    ibv_access_flags,
    ibv_mtu,
    ibv_qp_state,
    ibv_qp_type,
    ibv_wc_opcode,
    ibv_wc_status,
    ibv_wr_opcode,
)
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.utils import qp_state_to_str
from pyverbs.wr import SGE, RecvWR, SendWR

IB_PORT = 1
GID_INDEX = 1
MSG_SIZE = 1024
ITERS = 10
POLL_TIMEOUT = 10  # seconds


class RCPlayer:
    """Context, PD, CQ, MR and one RC QP, like rdma-core's RCResources."""

    def __init__(self, dev_name: str, msg: bytes) -> None:
        self.ctx = d.Context(name=dev_name)
        self.pd = PD(self.ctx)
        self.port_attr = self.ctx.query_port(IB_PORT)
        self.cq = CQ(self.ctx, 100, None, None, 0)
        access = ibv_access_flags.IBV_ACCESS_LOCAL_WRITE | ibv_access_flags.IBV_ACCESS_REMOTE_WRITE
        self.mr = MR(self.pd, MSG_SIZE, access)
        self.msg = msg
        cap = QPCap(max_send_wr=10, max_recv_wr=10, max_send_sge=1, max_recv_sge=1)
        init_attr = QPInitAttr(qp_type=ibv_qp_type.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
        qp_attr = QPAttr(port_num=IB_PORT)
        qp_attr.qp_access_flags = access
        self.qp = QP(self.pd, init_attr, qp_attr)
        self.psn = random.getrandbits(24)

    def to_rts(self, remote_qpn: int, remote_psn: int) -> None:
        attr = QPAttr(port_num=IB_PORT)
        attr.path_mtu = ibv_mtu.IBV_MTU_1024
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        gr = GlobalRoute(dgid=self.ctx.query_gid(IB_PORT, GID_INDEX), sgid_index=GID_INDEX)
        attr.ah_attr = AHAttr(port_num=IB_PORT, is_global=1, gr=gr, dlid=self.port_attr.lid)
        attr.dest_qp_num = remote_qpn
        attr.rq_psn = self.psn
        attr.sq_psn = remote_psn
        self.qp.to_rts(attr)

    def post_recv(self) -> None:
        sge = SGE(self.mr.buf, MSG_SIZE, self.mr.lkey)
        self.qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[sge]), None)

    def send(self) -> None:
        self.mr.write(self.msg, MSG_SIZE)
        sge = SGE(self.mr.buf, MSG_SIZE, self.mr.lkey)
        self.qp.post_send(SendWR(wr_id=2, opcode=ibv_wr_opcode.IBV_WR_SEND, num_sge=1, sg=[sge]))

    def close(self) -> None:
        self.ctx.close()


def poll_cq(cq: CQ, count: int = 1) -> list:
    wcs: list = []
    start = time.perf_counter()
    while count > 0 and time.perf_counter() - start < POLL_TIMEOUT:
        nc, batch = cq.poll(count)
        for wc in batch:
            if wc.status != ibv_wc_status.IBV_WC_SUCCESS:
                raise PyverbsRDMAError(f"Completion status is {wc.status}")
        count -= nc
        wcs.extend(batch)
    if count > 0:
        raise PyverbsError(f"Got timeout on polling ({count} CQEs remaining)")
    return wcs


def main() -> int:
    devices = d.get_device_list()
    if not devices:
        raise PyverbsError("No IB devices found")
    dev_name = devices[0].name.decode()
    client = RCPlayer(dev_name, b"c" * MSG_SIZE)
    server = RCPlayer(dev_name, b"s" * MSG_SIZE)
    try:
        assert client.port_attr.link_layer == IBV_LINK_LAYER_ETHERNET
        client.to_rts(server.qp.qp_num, server.psn)
        server.to_rts(client.qp.qp_num, client.psn)
        assert qp_state_to_str(client.qp.qp_state) == "RTS"
        assert client.qp.qp_state == ibv_qp_state.IBV_QPS_RTS
        for _ in range(ITERS):
            for sender, receiver in ((client, server), (server, client)):
                receiver.post_recv()
                sender.send()
                (swc,) = poll_cq(sender.cq)
                (rwc,) = poll_cq(receiver.cq)
                assert swc.opcode == ibv_wc_opcode.IBV_WC_SEND and swc.wr_id == 2
                assert rwc.opcode == ibv_wc_opcode.IBV_WC_RECV and rwc.byte_len == MSG_SIZE
                assert rwc.qp_num == receiver.qp.qp_num
                got = receiver.mr.read(MSG_SIZE, 0)
                assert got == sender.msg, f"data validation failed: {got[:8]!r}..."
        # RDMA WRITE straight into the server's MR, no receive consumed
        payload = b"w" * 64
        client.mr.write(payload, len(payload))
        wr = SendWR(wr_id=3, opcode=ibv_wr_opcode.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(client.mr.buf, len(payload), client.mr.lkey)])  # fmt: skip
        wr.set_wr_rdma(server.mr.rkey, server.mr.buf + 100)
        client.qp.post_send(wr)
        (wwc,) = poll_cq(client.cq)
        assert wwc.opcode == ibv_wc_opcode.IBV_WC_RDMA_WRITE
        assert server.mr.read(len(payload), 100) == payload
    finally:
        client.close()
        server.close()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
