"""Checks for softverbs.enums: values match rdma-core's verbs.h, names match pyverbs.

The expected data below was frozen from rdma-core v59 (``libibverbs/verbs.h``,
``librdmacm/rdma_cma.h`` and pyverbs' ``libibverbs_enums.pxd`` /
``librdmacm_enums.pxd``); nothing here reads those files at test time.
"""

from __future__ import annotations

from enum import KEEP, Enum, IntEnum, IntFlag
from functools import reduce
from itertools import pairwise
from operator import or_

import pytest

from softverbs import enums as e

# --- hand-checked against verbs.h / rdma_cma.h ---------------------------------------------------

SPOT_VALUES: list[tuple[str, int]] = [
    ("IBV_QPT_RC", 2),
    ("IBV_QPT_UC", 3),
    ("IBV_QPT_UD", 4),
    ("IBV_QPT_RAW_PACKET", 8),
    ("IBV_QPT_XRC_SEND", 9),
    ("IBV_QPT_XRC_RECV", 10),
    ("IBV_QPT_DRIVER", 0xFF),
    ("IBV_QPS_RESET", 0),
    ("IBV_QPS_RTS", 3),
    ("IBV_QPS_ERR", 6),
    ("IBV_WC_SUCCESS", 0),
    ("IBV_WC_LOC_PROT_ERR", 4),
    ("IBV_WC_WR_FLUSH_ERR", 5),
    ("IBV_WC_REM_ACCESS_ERR", 10),
    ("IBV_WC_RETRY_EXC_ERR", 12),
    ("IBV_WC_RNR_RETRY_EXC_ERR", 13),
    ("IBV_WC_GENERAL_ERR", 21),
    ("IBV_WR_RDMA_WRITE", 0),
    ("IBV_WR_RDMA_WRITE_WITH_IMM", 1),
    ("IBV_WR_SEND", 2),
    ("IBV_WR_SEND_WITH_IMM", 3),
    ("IBV_WR_RDMA_READ", 4),
    ("IBV_WR_ATOMIC_CMP_AND_SWP", 5),
    ("IBV_WR_ATOMIC_FETCH_AND_ADD", 6),
    ("IBV_WR_LOCAL_INV", 7),
    ("IBV_WR_BIND_MW", 8),
    ("IBV_WR_SEND_WITH_INV", 9),
    ("IBV_WR_TSO", 10),
    ("IBV_WR_FLUSH", 14),
    ("IBV_WR_ATOMIC_WRITE", 15),
    ("IBV_WC_SEND", 0),
    ("IBV_WC_RDMA_READ", 2),
    ("IBV_WC_ATOMIC_WRITE", 9),
    ("IBV_WC_RECV", 1 << 7),
    ("IBV_WC_RECV_RDMA_WITH_IMM", 129),
    ("IBV_WC_DRIVER2", 136),
    ("IBV_QP_STATE", 1),
    ("IBV_QP_ACCESS_FLAGS", 1 << 3),
    ("IBV_QP_AV", 1 << 7),
    ("IBV_QP_PATH_MTU", 1 << 8),
    ("IBV_QP_MIN_RNR_TIMER", 1 << 15),
    ("IBV_QP_DEST_QPN", 1 << 20),
    ("IBV_QP_RATE_LIMIT", 1 << 25),
    ("IBV_EVENT_CQ_ERR", 0),
    ("IBV_EVENT_QP_FATAL", 1),
    ("IBV_EVENT_COMM_EST", 4),
    ("IBV_EVENT_SQ_DRAINED", 5),
    ("IBV_EVENT_DEVICE_FATAL", 8),
    ("IBV_EVENT_PORT_ACTIVE", 9),
    ("IBV_EVENT_SRQ_LIMIT_REACHED", 15),
    ("IBV_EVENT_QP_LAST_WQE_REACHED", 16),
    ("IBV_EVENT_WQ_FATAL", 19),
    ("IBV_MTU_256", 1),
    ("IBV_MTU_1024", 3),
    ("IBV_MTU_4096", 5),
    ("IBV_ACCESS_LOCAL_WRITE", 1),
    ("IBV_ACCESS_REMOTE_WRITE", 2),
    ("IBV_ACCESS_REMOTE_READ", 4),
    ("IBV_ACCESS_REMOTE_ATOMIC", 8),
    ("IBV_ACCESS_MW_BIND", 16),
    ("IBV_ACCESS_RELAXED_ORDERING", 1 << 20),
    ("IBV_SEND_FENCE", 1),
    ("IBV_SEND_SIGNALED", 2),
    ("IBV_SEND_SOLICITED", 4),
    ("IBV_SEND_INLINE", 8),
    ("IBV_SEND_IP_CSUM", 16),
    ("IBV_WC_GRH", 1),
    ("IBV_WC_WITH_IMM", 2),
    ("IBV_WC_WITH_INV", 8),
    ("IBV_PORT_ACTIVE", 4),
    ("IBV_PORT_ACTIVE_DEFER", 5),
    ("IBV_PORT_SM", 1 << 1),
    ("IBV_PORT_IP_BASED_GIDS", 1 << 26),
    ("IBV_PORT_LINK_SPEED_NDR_SUP", 1 << 10),
    ("IBV_DEVICE_RESIZE_MAX_WR", 1),
    ("IBV_DEVICE_MEM_WINDOW", 1 << 17),
    ("IBV_DEVICE_XRC", 1 << 20),
    ("IBV_DEVICE_MEM_MGT_EXTENSIONS", 1 << 21),
    ("IBV_DEVICE_MANAGED_FLOW_STEERING", 1 << 29),
    ("IBV_NODE_UNKNOWN", -1),
    ("IBV_NODE_CA", 1),
    ("IBV_TRANSPORT_UNKNOWN", -1),
    ("IBV_TRANSPORT_IB", 0),
    ("IBV_TRANSPORT_IWARP", 1),
    ("IBV_REREG_MR_ERR_INPUT", -1),
    ("IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW", -5),
    ("IBV_SRQ_MAX_WR", 1),
    ("IBV_SRQ_LIMIT", 2),
    ("IBV_SRQT_XRC", 1),
    ("IBV_MW_TYPE_1", 1),
    ("IBV_MW_TYPE_2", 2),
    ("IBV_GID_TYPE_ROCE_V2", 2),
    ("IBV_FLOW_SPEC_ETH", 0x20),
    ("IBV_FLOW_SPEC_INNER", 0x100),
    ("IBV_FLOW_SPEC_ACTION_COUNT", 0x1003),
    ("IBV_FLUSH_RANGE", 0),
    ("IBV_FLUSH_MR", 1),
    ("IBV_FLUSH_GLOBAL", 1),
    ("IBV_FLUSH_PERSISTENT", 2),
    ("IBV_QP_EX_WITH_ATOMIC_WRITE", 1 << 12),
    ("IBV_TMH_EAGER", 3),
    ("RDMA_CM_EVENT_ADDR_RESOLVED", 0),
    ("RDMA_CM_EVENT_CONNECT_REQUEST", 4),
    ("RDMA_CM_EVENT_ESTABLISHED", 9),
    ("RDMA_CM_EVENT_DISCONNECTED", 10),
    ("RDMA_CM_EVENT_TIMEWAIT_EXIT", 15),
    ("RDMA_PS_IPOIB", 0x0002),
    ("RDMA_PS_TCP", 0x0106),
    ("RDMA_PS_UDP", 0x0111),
    ("RDMA_PS_IB", 0x013F),
    ("RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER", 1),
]

# plain int constants (anonymous enums and #defines), including pyverbs' "_" spellings
PLAIN_CONSTANTS: dict[str, int] = {
    "IBV_LINK_LAYER_UNSPECIFIED": 0,
    "IBV_LINK_LAYER_INFINIBAND": 1,
    "IBV_LINK_LAYER_ETHERNET": 2,
    "IBV_QPF_GRH_REQUIRED": 1,
    "IBV_WC_STANDARD_FLAGS": 0x7F,
    "IBV_DEVICE_RAW_SCATTER_FCS": 1 << 34,
    "IBV_DEVICE_PCI_WRITE_END_PADDING": 1 << 36,
    "IBV_ALLOCATOR_USE_DEFAULT": 2**64 - 1,
    "IBV_ADVISE_MR_ADVICE_PREFETCH": 0,
    "IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE": 1,
    "IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT": 2,
    "IBV_ADVISE_MR_FLAG_FLUSH": 1,
    "RAI_PASSIVE": 1,
    "RAI_NUMERICHOST": 2,
    "RAI_NOROUTE": 4,
    "RAI_FAMILY": 8,
    "RDMA_OPTION_ID": 0,
    "RDMA_OPTION_IB": 1,
    "RDMA_OPTION_ID_TOS": 0,
    "RDMA_OPTION_ID_REUSEADDR": 1,
    "RDMA_OPTION_ID_AFONLY": 2,
    "RDMA_OPTION_ID_ACK_TIMEOUT": 3,
    "RDMA_OPTION_IB_PATH": 1,
}
PYVERBS_UNDERSCORE = [
    "IBV_DEVICE_RAW_SCATTER_FCS",
    "IBV_DEVICE_PCI_WRITE_END_PADDING",
    "IBV_ALLOCATOR_USE_DEFAULT",
    "IBV_ADVISE_MR_ADVICE_PREFETCH",
    "IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE",
    "IBV_ADVISE_MR_FLAG_FLUSH",
    "IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT",
]

# --- frozen from pyverbs' enum .pxd files -------------------------------------------------------

#: every named enum pyverbs declares, with its number of members
ENUM_MEMBER_COUNTS: dict[str, int] = {
    "ibv_transport_type": 5,
    "ibv_node_type": 8,
    "ibv_atomic_cap": 3,
    "ibv_port_state": 6,
    "ibv_port_cap_flags": 24,
    "ibv_port_cap_flags2": 7,
    "ibv_mtu": 5,
    "ibv_event_type": 20,
    "ibv_access_flags": 11,
    "ibv_rereg_mr_flags": 3,
    "ibv_rereg_mr_err_code": 5,
    "ibv_wr_opcode": 13,
    "ibv_ops_wr_opcode": 3,
    "ibv_ops_flags": 2,
    "ibv_send_flags": 5,
    "ibv_tm_cap_flags": 1,
    "ibv_qp_type": 7,
    "ibv_qp_state": 8,
    "ibv_mw_type": 2,
    "ibv_wc_status": 24,
    "ibv_wc_opcode": 19,
    "ibv_create_cq_wc_flags": 12,
    "ibv_wc_flags": 7,
    "ibv_srq_attr_mask": 2,
    "ibv_srq_type": 3,
    "ibv_srq_init_attr_mask": 5,
    "ibv_mig_state": 3,
    "ibv_qp_init_attr_mask": 7,
    "ibv_qp_create_flags": 5,
    "ibv_qp_attr_mask": 22,
    "ibv_query_qp_data_in_order_flags": 1,
    "ibv_query_qp_data_in_order_caps": 2,
    "ibv_wq_type": 1,
    "ibv_wq_init_attr_mask": 1,
    "ibv_wq_flags": 4,
    "ibv_wq_state": 4,
    "ibv_wq_attr_mask": 3,
    "ibv_rx_hash_function_flags": 1,
    "ibv_rx_hash_fields": 8,
    "ibv_flow_flags": 2,
    "ibv_flow_attr_type": 4,
    "ibv_flow_spec_type": 15,
    "ibv_counter_description": 2,
    "ibv_read_counters_flags": 1,
    "ibv_cq_init_attr_mask": 2,
    "ibv_create_cq_attr_flags": 2,
    "ibv_odp_general_caps": 2,
    "ibv_odp_transport_cap_bits": 8,
    "ibv_device_cap_flags": 24,
    "ibv_raw_packet_caps": 4,
    "ibv_xrcd_init_attr_mask": 3,
    "ibv_values_mask": 1,
    "ibv_qp_create_send_ops_flags": 13,
    "ibv_parent_domain_init_attr_mask": 2,
    "ibv_gid_type": 3,
    "ibv_fork_status": 3,
    "ibv_placement_type": 2,
    "ibv_selectivity_level": 2,
    "ibv_gid_type_sysfs": 2,
    "ibv_tmh_op": 4,
    "rdma_cm_event_type": 16,
    "rdma_port_space": 4,
    "rdma_cm_join_mc_attr_mask": 2,
    "rdma_cm_mc_join_flags": 2,
}

FLAG_ENUMS: set[str] = {
    "ibv_access_flags",
    "ibv_cq_init_attr_mask",
    "ibv_create_cq_attr_flags",
    "ibv_create_cq_wc_flags",
    "ibv_device_cap_flags",
    "ibv_flow_flags",
    "ibv_odp_general_caps",
    "ibv_odp_transport_cap_bits",
    "ibv_ops_flags",
    "ibv_parent_domain_init_attr_mask",
    "ibv_placement_type",
    "ibv_port_cap_flags",
    "ibv_port_cap_flags2",
    "ibv_qp_attr_mask",
    "ibv_qp_create_flags",
    "ibv_qp_create_send_ops_flags",
    "ibv_qp_init_attr_mask",
    "ibv_query_qp_data_in_order_caps",
    "ibv_query_qp_data_in_order_flags",
    "ibv_raw_packet_caps",
    "ibv_read_counters_flags",
    "ibv_rereg_mr_flags",
    "ibv_rx_hash_fields",
    "ibv_rx_hash_function_flags",
    "ibv_send_flags",
    "ibv_srq_attr_mask",
    "ibv_srq_init_attr_mask",
    "ibv_tm_cap_flags",
    "ibv_values_mask",
    "ibv_wc_flags",
    "ibv_wq_attr_mask",
    "ibv_wq_flags",
    "ibv_wq_init_attr_mask",
    "ibv_xrcd_init_attr_mask",
    "rdma_cm_join_mc_attr_mask",
}

#: 15 enums checked member by member: "NAME=value ..." in declaration order
FULL_ENUMS: dict[str, str] = {
    "ibv_qp_type": (
        "IBV_QPT_RC=2 IBV_QPT_UC=3 IBV_QPT_UD=4 IBV_QPT_RAW_PACKET=8 IBV_QPT_XRC_SEND=9 "
        "IBV_QPT_XRC_RECV=10 IBV_QPT_DRIVER=255"
    ),
    "ibv_qp_state": (
        "IBV_QPS_RESET=0 IBV_QPS_INIT=1 IBV_QPS_RTR=2 IBV_QPS_RTS=3 IBV_QPS_SQD=4 "
        "IBV_QPS_SQE=5 IBV_QPS_ERR=6 IBV_QPS_UNKNOWN=7"
    ),
    "ibv_wr_opcode": (
        "IBV_WR_RDMA_WRITE=0 IBV_WR_RDMA_WRITE_WITH_IMM=1 IBV_WR_SEND=2 "
        "IBV_WR_SEND_WITH_IMM=3 IBV_WR_RDMA_READ=4 IBV_WR_ATOMIC_CMP_AND_SWP=5 "
        "IBV_WR_ATOMIC_FETCH_AND_ADD=6 IBV_WR_LOCAL_INV=7 IBV_WR_BIND_MW=8 "
        "IBV_WR_SEND_WITH_INV=9 IBV_WR_TSO=10 IBV_WR_FLUSH=14 IBV_WR_ATOMIC_WRITE=15"
    ),
    "ibv_wc_status": (
        "IBV_WC_SUCCESS=0 IBV_WC_LOC_LEN_ERR=1 IBV_WC_LOC_QP_OP_ERR=2 IBV_WC_LOC_EEC_OP_ERR=3 "
        "IBV_WC_LOC_PROT_ERR=4 IBV_WC_WR_FLUSH_ERR=5 IBV_WC_MW_BIND_ERR=6 "
        "IBV_WC_BAD_RESP_ERR=7 IBV_WC_LOC_ACCESS_ERR=8 IBV_WC_REM_INV_REQ_ERR=9 "
        "IBV_WC_REM_ACCESS_ERR=10 IBV_WC_REM_OP_ERR=11 IBV_WC_RETRY_EXC_ERR=12 "
        "IBV_WC_RNR_RETRY_EXC_ERR=13 IBV_WC_LOC_RDD_VIOL_ERR=14 IBV_WC_REM_INV_RD_REQ_ERR=15 "
        "IBV_WC_REM_ABORT_ERR=16 IBV_WC_INV_EECN_ERR=17 IBV_WC_INV_EEC_STATE_ERR=18 "
        "IBV_WC_FATAL_ERR=19 IBV_WC_RESP_TIMEOUT_ERR=20 IBV_WC_GENERAL_ERR=21 "
        "IBV_WC_TM_ERR=22 IBV_WC_TM_RNDV_INCOMPLETE=23"
    ),
    "ibv_wc_opcode": (
        "IBV_WC_SEND=0 IBV_WC_RDMA_WRITE=1 IBV_WC_RDMA_READ=2 IBV_WC_COMP_SWAP=3 "
        "IBV_WC_FETCH_ADD=4 IBV_WC_BIND_MW=5 IBV_WC_LOCAL_INV=6 IBV_WC_TSO=7 IBV_WC_FLUSH=8 "
        "IBV_WC_ATOMIC_WRITE=9 IBV_WC_RECV=128 IBV_WC_RECV_RDMA_WITH_IMM=129 "
        "IBV_WC_TM_ADD=130 IBV_WC_TM_DEL=131 IBV_WC_TM_SYNC=132 IBV_WC_TM_RECV=133 "
        "IBV_WC_TM_NO_TAG=134 IBV_WC_DRIVER2=136 IBV_WC_DRIVER3=137"
    ),
    "ibv_send_flags": (
        "IBV_SEND_FENCE=1 IBV_SEND_SIGNALED=2 IBV_SEND_SOLICITED=4 IBV_SEND_INLINE=8 "
        "IBV_SEND_IP_CSUM=16"
    ),
    "ibv_access_flags": (
        "IBV_ACCESS_LOCAL_WRITE=1 IBV_ACCESS_REMOTE_WRITE=2 IBV_ACCESS_REMOTE_READ=4 "
        "IBV_ACCESS_REMOTE_ATOMIC=8 IBV_ACCESS_MW_BIND=16 IBV_ACCESS_ZERO_BASED=32 "
        "IBV_ACCESS_ON_DEMAND=64 IBV_ACCESS_HUGETLB=128 IBV_ACCESS_FLUSH_GLOBAL=256 "
        "IBV_ACCESS_FLUSH_PERSISTENT=512 IBV_ACCESS_RELAXED_ORDERING=1048576"
    ),
    "ibv_qp_attr_mask": (
        "IBV_QP_STATE=1 IBV_QP_CUR_STATE=2 IBV_QP_EN_SQD_ASYNC_NOTIFY=4 IBV_QP_ACCESS_FLAGS=8 "
        "IBV_QP_PKEY_INDEX=16 IBV_QP_PORT=32 IBV_QP_QKEY=64 IBV_QP_AV=128 IBV_QP_PATH_MTU=256 "
        "IBV_QP_TIMEOUT=512 IBV_QP_RETRY_CNT=1024 IBV_QP_RNR_RETRY=2048 IBV_QP_RQ_PSN=4096 "
        "IBV_QP_MAX_QP_RD_ATOMIC=8192 IBV_QP_ALT_PATH=16384 IBV_QP_MIN_RNR_TIMER=32768 "
        "IBV_QP_SQ_PSN=65536 IBV_QP_MAX_DEST_RD_ATOMIC=131072 IBV_QP_PATH_MIG_STATE=262144 "
        "IBV_QP_CAP=524288 IBV_QP_DEST_QPN=1048576 IBV_QP_RATE_LIMIT=33554432"
    ),
    "ibv_event_type": (
        "IBV_EVENT_CQ_ERR=0 IBV_EVENT_QP_FATAL=1 IBV_EVENT_QP_REQ_ERR=2 "
        "IBV_EVENT_QP_ACCESS_ERR=3 IBV_EVENT_COMM_EST=4 IBV_EVENT_SQ_DRAINED=5 "
        "IBV_EVENT_PATH_MIG=6 IBV_EVENT_PATH_MIG_ERR=7 IBV_EVENT_DEVICE_FATAL=8 "
        "IBV_EVENT_PORT_ACTIVE=9 IBV_EVENT_PORT_ERR=10 IBV_EVENT_LID_CHANGE=11 "
        "IBV_EVENT_PKEY_CHANGE=12 IBV_EVENT_SM_CHANGE=13 IBV_EVENT_SRQ_ERR=14 "
        "IBV_EVENT_SRQ_LIMIT_REACHED=15 IBV_EVENT_QP_LAST_WQE_REACHED=16 "
        "IBV_EVENT_CLIENT_REREGISTER=17 IBV_EVENT_GID_CHANGE=18 IBV_EVENT_WQ_FATAL=19"
    ),
    "ibv_mtu": ("IBV_MTU_256=1 IBV_MTU_512=2 IBV_MTU_1024=3 IBV_MTU_2048=4 IBV_MTU_4096=5"),
    "ibv_port_state": (
        "IBV_PORT_NOP=0 IBV_PORT_DOWN=1 IBV_PORT_INIT=2 IBV_PORT_ARMED=3 IBV_PORT_ACTIVE=4 "
        "IBV_PORT_ACTIVE_DEFER=5"
    ),
    "ibv_srq_attr_mask": ("IBV_SRQ_MAX_WR=1 IBV_SRQ_LIMIT=2"),
    "ibv_wc_flags": (
        "IBV_WC_GRH=1 IBV_WC_WITH_IMM=2 IBV_WC_IP_CSUM_OK=4 IBV_WC_WITH_INV=8 "
        "IBV_WC_TM_SYNC_REQ=16 IBV_WC_TM_MATCH=32 IBV_WC_TM_DATA_VALID=64"
    ),
    "rdma_cm_event_type": (
        "RDMA_CM_EVENT_ADDR_RESOLVED=0 RDMA_CM_EVENT_ADDR_ERROR=1 "
        "RDMA_CM_EVENT_ROUTE_RESOLVED=2 RDMA_CM_EVENT_ROUTE_ERROR=3 "
        "RDMA_CM_EVENT_CONNECT_REQUEST=4 RDMA_CM_EVENT_CONNECT_RESPONSE=5 "
        "RDMA_CM_EVENT_CONNECT_ERROR=6 RDMA_CM_EVENT_UNREACHABLE=7 RDMA_CM_EVENT_REJECTED=8 "
        "RDMA_CM_EVENT_ESTABLISHED=9 RDMA_CM_EVENT_DISCONNECTED=10 "
        "RDMA_CM_EVENT_DEVICE_REMOVAL=11 RDMA_CM_EVENT_MULTICAST_JOIN=12 "
        "RDMA_CM_EVENT_MULTICAST_ERROR=13 RDMA_CM_EVENT_ADDR_CHANGE=14 "
        "RDMA_CM_EVENT_TIMEWAIT_EXIT=15"
    ),
    "rdma_port_space": ("RDMA_PS_IPOIB=2 RDMA_PS_TCP=262 RDMA_PS_UDP=273 RDMA_PS_IB=319"),
}


def _classes() -> dict[str, type[Enum]]:
    return {
        name: obj
        for name, obj in vars(e).items()
        if isinstance(obj, type) and issubclass(obj, Enum) and obj.__module__ == e.__name__
    }


def test_spot_values() -> None:
    assert len(SPOT_VALUES) >= 40
    for name, value in SPOT_VALUES:
        assert getattr(e, name) == value, name


def test_every_pyverbs_enum_exists_with_all_members() -> None:
    classes = _classes()
    assert set(ENUM_MEMBER_COUNTS) <= set(classes)
    assert set(classes) - set(ENUM_MEMBER_COUNTS) == {"sv_send_flags"}
    for name, count in ENUM_MEMBER_COUNTS.items():
        assert len(classes[name].__members__) == count, name
    assert len(ENUM_MEMBER_COUNTS) == 64


@pytest.mark.parametrize("enum_name", sorted(FULL_ENUMS))
def test_full_enum(enum_name: str) -> None:
    cls = getattr(e, enum_name)
    expected = dict(item.split("=") for item in FULL_ENUMS[enum_name].split())
    assert list(cls.__members__) == list(expected)
    for member, value in expected.items():
        assert int(cls.__members__[member]) == int(value), member


def test_flag_or_enum_kind() -> None:
    for name, cls in _classes().items():
        if name in FLAG_ENUMS or name == "sv_send_flags":
            assert issubclass(cls, IntFlag), name
            assert cls._boundary_ is KEEP, name  # type: ignore[attr-defined]
        else:
            assert issubclass(cls, IntEnum) and not issubclass(cls, IntFlag), name


def test_flag_members_are_single_bits() -> None:
    for name in FLAG_ENUMS:
        for member in getattr(e, name).__members__.values():
            assert member > 0 and member & (member - 1) == 0, member


def test_module_exports_equal_class_members() -> None:
    members: dict[str, Enum] = {}
    for cls in _classes().values():
        for name, member in cls.__members__.items():
            assert name not in members, f"{name} defined twice"
            members[name] = member
            assert getattr(e, name) is member, name
    # nothing upper-case at module level that is neither a member nor a known constant
    extras = {"RNR_TIMER_US", "QP_ATTR_MASK"} | set(PLAIN_CONSTANTS)
    extras |= {f"_{name}" for name in PYVERBS_UNDERSCORE}
    for name in vars(e):
        if name.lstrip("_").isupper() and not name.startswith("__"):
            if name in ("_MTU_BYTES", "_BYTES_MTU"):
                continue
            assert name in members or name in extras, name


def test_plain_constants() -> None:
    for name, value in PLAIN_CONSTANTS.items():
        obj = getattr(e, name)
        assert type(obj) is int and obj == value, name
    for name in PYVERBS_UNDERSCORE:
        assert getattr(e, "_" + name) == getattr(e, name)
    standard = reduce(
        or_,
        [
            e.IBV_WC_EX_WITH_BYTE_LEN,
            e.IBV_WC_EX_WITH_IMM,
            e.IBV_WC_EX_WITH_QP_NUM,
            e.IBV_WC_EX_WITH_SRC_QP,
            e.IBV_WC_EX_WITH_SLID,
            e.IBV_WC_EX_WITH_SL,
            e.IBV_WC_EX_WITH_DLID_PATH_BITS,
        ],
    )
    assert standard == e.IBV_WC_STANDARD_FLAGS


def test_flags_combine_and_keep_unknown_bits() -> None:
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    assert isinstance(access, e.ibv_access_flags) and access == 7
    assert access & e.IBV_ACCESS_REMOTE_WRITE
    unknown = e.ibv_access_flags(1 << 27 | 1)
    assert unknown == (1 << 27) | 1 and unknown & e.IBV_ACCESS_LOCAL_WRITE
    mask = e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_DEST_QPN
    assert mask == 1 | 1 << 7 | 1 << 20


def test_receive_completions_have_bit_7() -> None:
    for member in e.ibv_wc_opcode:
        is_recv = member >= e.IBV_WC_RECV
        assert bool(member & e.IBV_WC_RECV) == is_recv, member


def test_send_defer_does_not_collide() -> None:
    assert e.IBV_SEND_DEFER == 1 << 30
    assert e.IBV_SEND_DEFER is e.sv_send_flags.IBV_SEND_DEFER
    all_std = reduce(or_, e.ibv_send_flags.__members__.values())
    assert not all_std & e.IBV_SEND_DEFER
    flags = e.IBV_SEND_SIGNALED | e.IBV_SEND_DEFER
    assert flags == 2 | 1 << 30
    assert e.ibv_send_flags(flags) & e.IBV_SEND_SIGNALED
    assert int(flags) & e.IBV_SEND_DEFER


def test_rnr_timer_table() -> None:
    # IBA "Encoding for RNR NAK Timer Field", in milliseconds as the spec lists it
    spec_ms = [
        655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12,
        0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92,
        2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
        40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
    ]  # fmt: skip
    t = e.RNR_TIMER_US
    assert len(t) == 32 and all(type(x) is float for x in t)
    assert list(t) == pytest.approx([ms * 1000 for ms in spec_ms])
    assert t[0] == 655360.0 and t[1] == 10.0 and t[31] == 491520.0
    assert all(a < b for a, b in pairwise(t[1:]))


def test_mtu_helpers() -> None:
    expected = {
        e.IBV_MTU_256: 256,
        e.IBV_MTU_512: 512,
        e.IBV_MTU_1024: 1024,
        e.IBV_MTU_2048: 2048,
        e.IBV_MTU_4096: 4096,
    }
    for mtu, size in expected.items():
        assert e.mtu_to_bytes(mtu) == size
        assert e.mtu_to_bytes(int(mtu)) == size
        back = e.bytes_to_mtu(size)
        assert back is mtu and isinstance(back, e.ibv_mtu)
    for bad in (0, 6, -1, 255, True):
        with pytest.raises(ValueError):
            e.mtu_to_bytes(bad)
    for bad in (0, 128, 1500, 4095, 8192, 9000):
        with pytest.raises(ValueError):
            e.bytes_to_mtu(bad)


def test_qp_attr_mask_names_each_single_field_bit_once() -> None:
    bits = list(e.QP_ATTR_MASK.values())
    assert len(set(bits)) == len(bits)
    groups = {e.IBV_QP_ALT_PATH, e.IBV_QP_CAP}
    assert set(bits) | groups == set(e.ibv_qp_attr_mask.__members__.values())
