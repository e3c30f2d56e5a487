"""pyverbs helpers that softverbs implements for ``softverbs exec``.

This covers the text helpers (:mod:`softverbs.verbs.strings`),
``PyverbsRDMAErrno``, ``DataBuffer``, ``QPEx.ind_table`` and the
``query_port`` error text that rdma-core's tests match on.
"""

from __future__ import annotations

import errno
import sys
import threading
from collections.abc import Iterator

import pytest

from softverbs import enums as e
from softverbs.errors import PyverbsRDMAErrno, PyverbsUserError, last_errno
from softverbs.verbs import strings as s
from softverbs.verbs.addr import AHAttr, GlobalRoute
from softverbs.verbs.cq import CQ
from softverbs.verbs.device import Context
from softverbs.verbs.mr import MR
from softverbs.verbs.pd import PD
from softverbs.verbs.qp import QP, DataBuffer, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from softverbs.verbs.wr import SGE, RecvWR


@pytest.fixture
def ctx() -> Iterator[Context]:
    with Context(name="sv0") as c:
        yield c


# --- text helpers ---------------------------------------------------------------------------------


def test_port_texts(ctx: Context) -> None:
    attr = ctx.query_port(1)
    # what rdma-core's test_device.verify_port_attr checks
    for text in (s.phys_state_to_str(attr.state), s.translate_mtu(attr.max_mtu),
                 s.translate_mtu(attr.active_mtu), s.width_to_str(attr.active_width),
                 s.speed_to_str(attr.active_speed, attr.active_speed_ex),
                 s.translate_link_layer(attr.link_layer)):  # fmt: skip
        assert "Invalid" not in text
    assert s.translate_mtu(e.IBV_MTU_1024) == "1024 (3)"
    assert s.translate_mtu(9) == "Invalid MTU (9)"
    assert s.port_state_to_str(e.IBV_PORT_ACTIVE) == "Active (4)"
    assert s.phys_state_to_str(5) == "Link up (5)"
    assert s.width_to_str(1) == "1X (1)"
    assert s.speed_to_str(0x80, 0) == "100.0 Gbps (128)"
    assert s.speed_to_str(1, 32) == "25.0 Gbps (32)"  # the extended code wins
    assert s.speed_to_str(3, 0) == "Invalid speed"
    # rdma-core 44's pyverbs (and its suite) pass active_speed alone
    assert s.speed_to_str(0x20) == "25.0 Gbps (32)"
    assert s.speed_to_str(3) == "Invalid speed"
    assert s.translate_link_layer(e.IBV_LINK_LAYER_ETHERNET) == "Ethernet"
    assert s.translate_link_layer(7) == "Invalid link layer (7)"


def test_device_texts() -> None:
    assert s.translate_gid_type(e.IBV_GID_TYPE_ROCE_V2) == "RoCEv2"
    assert s.translate_gid_type(9) == "Unknown gid_type (9)"
    assert s.translate_node_type(e.IBV_NODE_CA) == "CA"
    assert s.translate_node_type(42) == "Unknown"
    assert s.translate_transport_type(e.IBV_TRANSPORT_IB) == "IB"
    assert s.guid_to_hex(0x0200FFFEABCD) == "200fffeabcd"
    flags = e.IBV_PORT_CM_SUP | e.IBV_PORT_SM
    assert s.translate_port_cap_flags(flags) == "\n  IBV_PORT_SM\n  IBV_PORT_CM_SUP\n  "
    assert s.translate_port_cap_flags2(0) == "\n  "
    assert "IBV_DEVICE_XRC\n" in s.translate_device_caps(e.IBV_DEVICE_XRC | e.IBV_DEVICE_MEM_WINDOW)
    assert (
        s.translate_event_type(e.IBV_EVENT_QP_LAST_WQE_REACHED) == "IBV_EVENT_QP_LAST_WQE_REACHED"
    )
    assert s.translate_event_type(99) == "Unknown event_type (99)"


def test_gid_and_guid_take_raw_be64_halves(ctx: Context) -> None:
    gid = ctx.query_gid(1, 0)
    raw = gid.raw
    # pyverbs passes the two halves of ibv_gid exactly as the union reads natively
    prefix = int.from_bytes(raw[:8], sys.byteorder)
    iid = int.from_bytes(raw[8:], sys.byteorder)
    assert s.gid_str(prefix, iid) == str(gid)
    assert s.guid_format(iid) == ":".join(raw[8:].hex()[i : i + 4] for i in range(0, 16, 4))
    assert s.be64toh(int.from_bytes(bytes(range(8)), sys.byteorder)) == 0x0001020304050607


def test_gid_str_to_array() -> None:
    arr = s.gid_str_to_array("fe80:0000:0000:0000:0000:00ff:fe00:0001")
    assert len(arr) == 16 and arr[:2] == ["fe", "80"] and arr[-2:] == ["00", "01"]
    with pytest.raises(PyverbsUserError):
        s.gid_str_to_array("fe80::1")
    with pytest.raises(ValueError):
        s.gid_str_to_array("zz80:0000:0000:0000:0000:00ff:fe00:0001")


def test_completion_texts() -> None:
    assert s.cqe_status_to_str(e.IBV_WC_WR_FLUSH_ERR) == "WR flush error"
    assert s.cqe_status_to_str(99) == "Unknown CQE status"
    assert s.cqe_opcode_to_str(e.IBV_WC_RECV) == "Receive"
    assert s.cqe_opcode_to_str(0x99) == "Unknown CQE opcode 153"
    assert s.cqe_flags_to_str(e.IBV_WC_GRH | e.IBV_WC_WITH_IMM) == "GRH With immediate "
    both = e.IBV_WC_EX_WITH_BYTE_LEN | e.IBV_WC_EX_WITH_IMM
    assert s.create_wc_flags_to_str(both) == "IBV_WC_EX_WITH_BYTE_LEN IBV_WC_EX_WITH_IMM "
    assert s.flags_to_str(5, {1: "a", 2: "b", 4: "c"}) == "a c "


def test_qp_and_mr_texts() -> None:
    assert s.mwtype2str(e.IBV_MW_TYPE_2) == "IBV_MW_TYPE_2"
    assert s.mwtype2str(7) == "Unknown MW type (7)"
    assert s.qp_type_to_str(e.IBV_QPT_RC) == "RC"
    assert s.qp_type_to_str(77) == "Unknown (77)"
    assert s.qp_state_to_str(e.IBV_QPS_ERR) == "Error"
    assert s.qp_state_to_str(77) == "Unknown (77)"
    assert s.mtu_to_str(e.IBV_MTU_4096) == 4096
    assert s.mtu_to_str(0) == 0
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
    assert s.access_flags_to_str(access) == "Local write Remote read "
    assert s.mig_state_to_str(e.IBV_MIG_ARMED) == "Armed"
    assert s.rereg_error_to_str(e.IBV_REREG_MR_ERR_INPUT) == "IBV_REREG_MR_ERR_INPUT"
    assert s.rereg_error_to_str(5) == "Unknown error (5)"


# --- errors ------------------------------------------------------------------------------------


def test_query_port_bad_flow_text(ctx: Context) -> None:
    # rdma-core's test_query_port_bad_flow matches on both phrases
    with pytest.raises(PyverbsRDMAErrno("").__class__) as info:
        ctx.query_port(2)
    assert "Failed to query port" in info.value.args[0]
    assert "Invalid argument" in info.value.args[0]


def test_pyverbs_rdma_errno_is_the_last_failure(ctx: Context) -> None:
    with pytest.raises(Exception):  # noqa: B017 -- only the errno it leaves matters
        ctx.query_pkey(1, 5)
    assert last_errno() == errno.EINVAL
    err = PyverbsRDMAErrno("Failed to poll CQ")
    assert err.error_code == errno.EINVAL
    assert str(err) == "Failed to poll CQ. Errno: 22, Invalid argument"

    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(last_errno()))
    t.start()
    t.join()
    assert seen == [0]  # errno is per thread, as in C


# --- DataBuffer and QPEx.ind_table ----------------------------------------------------------------


def _connect(ctx: Context, a: QP, b: QP) -> None:
    gr = GlobalRoute(dgid=ctx.query_gid(1, 1), sgid_index=1)
    for me, peer in ((a, b), (b, a)):
        attr = QPAttr(port_num=1)
        attr.path_mtu = e.IBV_MTU_1024
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
        attr.dest_qp_num = peer.qp_num
        me.to_rts(attr)


def test_qpex_inline_data_list_with_data_buffers(ctx: Context) -> None:
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=2, max_inline_data=64)
    ex_attr = QPInitAttrEx(
        qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, pd=pd, cap=cap,
        comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        send_ops_flags=e.IBV_QP_EX_WITH_SEND,
    )  # fmt: skip
    sender = QPEx(ctx, ex_attr, QPAttr(port_num=1))
    assert sender.ind_table is None
    receiver = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap), QPAttr())
    _connect(ctx, sender, receiver)
    src = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    dst = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    src.write(b"hello, world", 12)
    receiver.post_recv(RecvWR(wr_id=9, num_sge=1, sg=[SGE(dst.buf, 64, dst.lkey)]))
    sender.wr_start()
    sender.wr_id = 5
    sender.wr_flags = e.IBV_SEND_SIGNALED
    sender.wr_send()
    sender.wr_set_inline_data_list(2, [DataBuffer(src.buf, 5), DataBuffer(src.buf + 5, 7)])
    sender.wr_complete()
    wcs = []
    for _ in range(100):
        wcs += cq.poll(2)[1]
        if len(wcs) == 2:
            break
    assert sorted(wc.wr_id for wc in wcs) == [5, 9]
    assert all(wc.status == e.IBV_WC_SUCCESS for wc in wcs)
    assert dst.read(12, 0) == b"hello, world"


# --- QPInitAttr's flattened capabilities ---------------------------------------------------------


@pytest.mark.parametrize("cls", [QPInitAttr, QPInitAttrEx])
def test_init_attr_reads_and_sets_its_cap_fields(cls: type[QPInitAttr | QPInitAttrEx]) -> None:
    """pyverbs' init attributes expose each QPCap field as their own: a read is
    the cap's, an assignment goes to the cap and is checked as a QPCap member."""
    attr = cls(cap=QPCap(5, 6, 2, 3, 64))
    fields = ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data")
    assert [getattr(attr, f) for f in fields] == [5, 6, 2, 3, 64]
    for i, f in enumerate(fields):
        setattr(attr, f, 100 + i)
        assert getattr(attr.cap, f) == getattr(attr, f) == 100 + i
        with pytest.raises(PyverbsUserError, match=rf"QPCap\.{f}=-1 does not fit"):
            setattr(attr, f, -1)
        assert getattr(attr, f) == 100 + i
    assert cls().max_recv_wr == 0  # no QPCap given: every capability is 0, as in pyverbs


def test_require_names_the_argument_and_takes_none_only_where_optional() -> None:
    from softverbs.verbs.base import require
    from softverbs.verbs.qp import QPCap, QPInitAttr

    require(QPCap(), QPCap, "cap")
    require(None, QPCap, "cap", optional=True)
    with pytest.raises(PyverbsUserError, match="cap must be a QPCap, got NoneType"):
        require(None, QPCap, "cap")
    with pytest.raises(PyverbsUserError, match="cap must be a QPCap, got str"):
        require("x", QPCap, "cap", optional=True)
    # a verb's optional argument: None is taken, anything else must be the type
    QPInitAttr(cap=None)
    with pytest.raises(PyverbsUserError, match="srq must be a SRQ, got int"):
        QPInitAttr(srq=1)
