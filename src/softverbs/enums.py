"""Verbs and RDMA CM enumerations, spelled exactly like pyverbs.

Every enum that pyverbs exposes from ``pyverbs.libibverbs_enums`` and
``pyverbs.librdmacm_enums`` exists here as a Python class with the same name,
the same member names and the same numeric values as the C definitions in
rdma-core's ``<infiniband/verbs.h>`` (and ``<rdma/rdma_cma.h>``), so numbers
can cross between softverbs, pyverbs, the kernel and the wire unchanged.
Values were taken from rdma-core v59.

* Enums used as bit masks (access flags, send flags, attribute masks,
  capability bits, ...) are :class:`enum.IntFlag` with ``boundary=KEEP``:
  ``|`` and ``&`` work as in C and bits this module does not name survive a
  round trip instead of raising.  All other enums are :class:`enum.IntEnum`.
* Every member is also a module attribute, as with pyverbs, so both
  spellings work::

      from softverbs import enums as e

      e.ibv_qp_type.IBV_QPT_RC is e.IBV_QPT_RC
      access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
      if wc.opcode & e.IBV_WC_RECV: ...

* Anonymous C enums and ``#define`` constants that pyverbs re-exports
  (``IBV_LINK_LAYER_*``, ``IBV_WC_STANDARD_FLAGS``, ``RAI_*``, ...) are plain
  ``int`` constants.  The ``_IBV_*`` names are pyverbs' own spelling of the
  ``#define`` constants and are kept as aliases.
* Only members that pyverbs exposes are defined; header-only members such as
  ``*_RESERVED`` sentinels and ``IBV_WC_DRIVER1`` are left out on purpose.
* The last section holds softverbs additions that are not part of verbs.h:
  :data:`IBV_SEND_DEFER`, the IBA RNR NAK timer table :data:`RNR_TIMER_US`
  and the MTU helpers :func:`mtu_to_bytes` / :func:`bytes_to_mtu`.
"""

from __future__ import annotations

import enum
from enum import IntEnum, IntFlag
from typing import Final

# -------------------------------------------------------------------------------------------------
# libibverbs: <infiniband/verbs.h>
# -------------------------------------------------------------------------------------------------


class ibv_transport_type(IntEnum):
    """Transport a device speaks (``ibv_device.transport_type``)."""

    IBV_TRANSPORT_UNKNOWN = -1
    IBV_TRANSPORT_IB = 0
    IBV_TRANSPORT_IWARP = 1
    IBV_TRANSPORT_USNIC = 2  #: Cisco usNIC
    IBV_TRANSPORT_USNIC_UDP = 3  #: Cisco usNIC over UDP


IBV_TRANSPORT_UNKNOWN = ibv_transport_type.IBV_TRANSPORT_UNKNOWN
IBV_TRANSPORT_IB = ibv_transport_type.IBV_TRANSPORT_IB
IBV_TRANSPORT_IWARP = ibv_transport_type.IBV_TRANSPORT_IWARP
IBV_TRANSPORT_USNIC = ibv_transport_type.IBV_TRANSPORT_USNIC
IBV_TRANSPORT_USNIC_UDP = ibv_transport_type.IBV_TRANSPORT_USNIC_UDP


class ibv_node_type(IntEnum):
    """Kind of node a device is (``ibv_device.node_type``)."""

    IBV_NODE_UNKNOWN = -1
    IBV_NODE_CA = 1  #: channel adapter: an HCA or RoCE NIC
    IBV_NODE_SWITCH = 2
    IBV_NODE_ROUTER = 3
    IBV_NODE_RNIC = 4  #: iWARP NIC
    IBV_NODE_USNIC = 5
    IBV_NODE_USNIC_UDP = 6
    IBV_NODE_UNSPECIFIED = 7  #: driver did not say what kind of node it is


IBV_NODE_UNKNOWN = ibv_node_type.IBV_NODE_UNKNOWN
IBV_NODE_CA = ibv_node_type.IBV_NODE_CA
IBV_NODE_SWITCH = ibv_node_type.IBV_NODE_SWITCH
IBV_NODE_ROUTER = ibv_node_type.IBV_NODE_ROUTER
IBV_NODE_RNIC = ibv_node_type.IBV_NODE_RNIC
IBV_NODE_USNIC = ibv_node_type.IBV_NODE_USNIC
IBV_NODE_USNIC_UDP = ibv_node_type.IBV_NODE_USNIC_UDP
IBV_NODE_UNSPECIFIED = ibv_node_type.IBV_NODE_UNSPECIFIED

IBV_LINK_LAYER_UNSPECIFIED: Final[int] = 0  #: old kernels that do not say; treat as InfiniBand
IBV_LINK_LAYER_INFINIBAND: Final[int] = 1
IBV_LINK_LAYER_ETHERNET: Final[int] = 2


class ibv_atomic_cap(IntEnum):
    """How far a device's atomic operations are atomic (``atomic_cap``)."""

    IBV_ATOMIC_NONE = 0
    IBV_ATOMIC_HCA = 1  #: atomic only against other atomics on the same device
    IBV_ATOMIC_GLOB = 2  #: atomic also against the CPU and other devices


IBV_ATOMIC_NONE = ibv_atomic_cap.IBV_ATOMIC_NONE
IBV_ATOMIC_HCA = ibv_atomic_cap.IBV_ATOMIC_HCA
IBV_ATOMIC_GLOB = ibv_atomic_cap.IBV_ATOMIC_GLOB


class ibv_port_state(IntEnum):
    """Logical port state (``ibv_port_attr.state``)."""

    IBV_PORT_NOP = 0  #: reserved; "no state change" in the IBA encoding
    IBV_PORT_DOWN = 1
    IBV_PORT_INIT = 2
    IBV_PORT_ARMED = 3
    IBV_PORT_ACTIVE = 4
    IBV_PORT_ACTIVE_DEFER = 5  #: active, but a link problem may soon take it down


IBV_PORT_NOP = ibv_port_state.IBV_PORT_NOP
IBV_PORT_DOWN = ibv_port_state.IBV_PORT_DOWN
IBV_PORT_INIT = ibv_port_state.IBV_PORT_INIT
IBV_PORT_ARMED = ibv_port_state.IBV_PORT_ARMED
IBV_PORT_ACTIVE = ibv_port_state.IBV_PORT_ACTIVE
IBV_PORT_ACTIVE_DEFER = ibv_port_state.IBV_PORT_ACTIVE_DEFER


class ibv_port_cap_flags(IntFlag, boundary=enum.KEEP):
    """Port capability bits (``ibv_port_attr.port_cap_flags``)."""

    IBV_PORT_SM = 1 << 1  #: a subnet manager runs on this port
    IBV_PORT_NOTICE_SUP = 1 << 2
    IBV_PORT_TRAP_SUP = 1 << 3
    IBV_PORT_OPT_IPD_SUP = 1 << 4  #: optional inter-packet delay is supported
    IBV_PORT_AUTO_MIGR_SUP = 1 << 5
    IBV_PORT_SL_MAP_SUP = 1 << 6
    IBV_PORT_MKEY_NVRAM = 1 << 7  #: the M_Key survives a reboot
    IBV_PORT_PKEY_NVRAM = 1 << 8  #: the P_Key table survives a reboot
    IBV_PORT_LED_INFO_SUP = 1 << 9
    IBV_PORT_SYS_IMAGE_GUID_SUP = 1 << 11
    IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP = 1 << 12
    IBV_PORT_EXTENDED_SPEEDS_SUP = 1 << 14
    IBV_PORT_CAP_MASK2_SUP = 1 << 15  #: port_cap_flags2 is valid
    IBV_PORT_CM_SUP = 1 << 16
    IBV_PORT_SNMP_TUNNEL_SUP = 1 << 17
    IBV_PORT_REINIT_SUP = 1 << 18
    IBV_PORT_DEVICE_MGMT_SUP = 1 << 19
    IBV_PORT_VENDOR_CLASS_SUP = 1 << 20
    IBV_PORT_DR_NOTICE_SUP = 1 << 21
    IBV_PORT_CAP_MASK_NOTICE_SUP = 1 << 22
    IBV_PORT_BOOT_MGMT_SUP = 1 << 23
    IBV_PORT_LINK_LATENCY_SUP = 1 << 24
    IBV_PORT_CLIENT_REG_SUP = 1 << 25
    IBV_PORT_IP_BASED_GIDS = 1 << 26  #: GIDs are derived from IP addresses (RoCE)


IBV_PORT_SM = ibv_port_cap_flags.IBV_PORT_SM
IBV_PORT_NOTICE_SUP = ibv_port_cap_flags.IBV_PORT_NOTICE_SUP
IBV_PORT_TRAP_SUP = ibv_port_cap_flags.IBV_PORT_TRAP_SUP
IBV_PORT_OPT_IPD_SUP = ibv_port_cap_flags.IBV_PORT_OPT_IPD_SUP
IBV_PORT_AUTO_MIGR_SUP = ibv_port_cap_flags.IBV_PORT_AUTO_MIGR_SUP
IBV_PORT_SL_MAP_SUP = ibv_port_cap_flags.IBV_PORT_SL_MAP_SUP
IBV_PORT_MKEY_NVRAM = ibv_port_cap_flags.IBV_PORT_MKEY_NVRAM
IBV_PORT_PKEY_NVRAM = ibv_port_cap_flags.IBV_PORT_PKEY_NVRAM
IBV_PORT_LED_INFO_SUP = ibv_port_cap_flags.IBV_PORT_LED_INFO_SUP
IBV_PORT_SYS_IMAGE_GUID_SUP = ibv_port_cap_flags.IBV_PORT_SYS_IMAGE_GUID_SUP
IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP = ibv_port_cap_flags.IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP
IBV_PORT_EXTENDED_SPEEDS_SUP = ibv_port_cap_flags.IBV_PORT_EXTENDED_SPEEDS_SUP
IBV_PORT_CAP_MASK2_SUP = ibv_port_cap_flags.IBV_PORT_CAP_MASK2_SUP
IBV_PORT_CM_SUP = ibv_port_cap_flags.IBV_PORT_CM_SUP
IBV_PORT_SNMP_TUNNEL_SUP = ibv_port_cap_flags.IBV_PORT_SNMP_TUNNEL_SUP
IBV_PORT_REINIT_SUP = ibv_port_cap_flags.IBV_PORT_REINIT_SUP
IBV_PORT_DEVICE_MGMT_SUP = ibv_port_cap_flags.IBV_PORT_DEVICE_MGMT_SUP
IBV_PORT_VENDOR_CLASS_SUP = ibv_port_cap_flags.IBV_PORT_VENDOR_CLASS_SUP
IBV_PORT_DR_NOTICE_SUP = ibv_port_cap_flags.IBV_PORT_DR_NOTICE_SUP
IBV_PORT_CAP_MASK_NOTICE_SUP = ibv_port_cap_flags.IBV_PORT_CAP_MASK_NOTICE_SUP
IBV_PORT_BOOT_MGMT_SUP = ibv_port_cap_flags.IBV_PORT_BOOT_MGMT_SUP
IBV_PORT_LINK_LATENCY_SUP = ibv_port_cap_flags.IBV_PORT_LINK_LATENCY_SUP
IBV_PORT_CLIENT_REG_SUP = ibv_port_cap_flags.IBV_PORT_CLIENT_REG_SUP
IBV_PORT_IP_BASED_GIDS = ibv_port_cap_flags.IBV_PORT_IP_BASED_GIDS


class ibv_port_cap_flags2(IntFlag, boundary=enum.KEEP):
    """Second word of port capability bits (``port_cap_flags2``)."""

    IBV_PORT_SET_NODE_DESC_SUP = 1 << 0
    IBV_PORT_INFO_EXT_SUP = 1 << 1
    IBV_PORT_VIRT_SUP = 1 << 2
    IBV_PORT_SWITCH_PORT_STATE_TABLE_SUP = 1 << 3
    IBV_PORT_LINK_WIDTH_2X_SUP = 1 << 4
    IBV_PORT_LINK_SPEED_HDR_SUP = 1 << 5  #: HDR, 50 Gb/s per lane
    IBV_PORT_LINK_SPEED_NDR_SUP = 1 << 10  #: NDR, 100 Gb/s per lane


IBV_PORT_SET_NODE_DESC_SUP = ibv_port_cap_flags2.IBV_PORT_SET_NODE_DESC_SUP
IBV_PORT_INFO_EXT_SUP = ibv_port_cap_flags2.IBV_PORT_INFO_EXT_SUP
IBV_PORT_VIRT_SUP = ibv_port_cap_flags2.IBV_PORT_VIRT_SUP
IBV_PORT_SWITCH_PORT_STATE_TABLE_SUP = ibv_port_cap_flags2.IBV_PORT_SWITCH_PORT_STATE_TABLE_SUP
IBV_PORT_LINK_WIDTH_2X_SUP = ibv_port_cap_flags2.IBV_PORT_LINK_WIDTH_2X_SUP
IBV_PORT_LINK_SPEED_HDR_SUP = ibv_port_cap_flags2.IBV_PORT_LINK_SPEED_HDR_SUP
IBV_PORT_LINK_SPEED_NDR_SUP = ibv_port_cap_flags2.IBV_PORT_LINK_SPEED_NDR_SUP


class ibv_mtu(IntEnum):
    """Path MTU code; :func:`mtu_to_bytes` turns it into a byte count."""

    IBV_MTU_256 = 1
    IBV_MTU_512 = 2
    IBV_MTU_1024 = 3
    IBV_MTU_2048 = 4
    IBV_MTU_4096 = 5


IBV_MTU_256 = ibv_mtu.IBV_MTU_256
IBV_MTU_512 = ibv_mtu.IBV_MTU_512
IBV_MTU_1024 = ibv_mtu.IBV_MTU_1024
IBV_MTU_2048 = ibv_mtu.IBV_MTU_2048
IBV_MTU_4096 = ibv_mtu.IBV_MTU_4096


class ibv_event_type(IntEnum):
    """Asynchronous event kinds delivered by ``ibv_get_async_event``."""

    IBV_EVENT_CQ_ERR = 0  #: CQ overrun or other CQ failure
    IBV_EVENT_QP_FATAL = 1  #: catastrophic QP error; the QP is now in the error state
    IBV_EVENT_QP_REQ_ERR = 2  #: responder saw a request violating the transport protocol
    IBV_EVENT_QP_ACCESS_ERR = 3  #: responder saw a request violating memory access rights
    IBV_EVENT_COMM_EST = 4  #: first packet arrived on a QP still in RTR
    IBV_EVENT_SQ_DRAINED = 5  #: QP in SQD has no send WRs in flight any more
    IBV_EVENT_PATH_MIG = 6  #: QP switched to its alternate path
    IBV_EVENT_PATH_MIG_ERR = 7  #: switching to the alternate path failed
    IBV_EVENT_DEVICE_FATAL = 8  #: the device is dead; close and reopen it
    IBV_EVENT_PORT_ACTIVE = 9
    IBV_EVENT_PORT_ERR = 10
    IBV_EVENT_LID_CHANGE = 11
    IBV_EVENT_PKEY_CHANGE = 12
    IBV_EVENT_SM_CHANGE = 13
    IBV_EVENT_SRQ_ERR = 14
    IBV_EVENT_SRQ_LIMIT_REACHED = 15  #: SRQ fill level fell below its armed srq_limit
    IBV_EVENT_QP_LAST_WQE_REACHED = 16  #: errored QP on an SRQ will consume no more receive WQEs
    IBV_EVENT_CLIENT_REREGISTER = 17  #: SM asks clients to re-register their subscriptions
    IBV_EVENT_GID_CHANGE = 18
    IBV_EVENT_WQ_FATAL = 19


IBV_EVENT_CQ_ERR = ibv_event_type.IBV_EVENT_CQ_ERR
IBV_EVENT_QP_FATAL = ibv_event_type.IBV_EVENT_QP_FATAL
IBV_EVENT_QP_REQ_ERR = ibv_event_type.IBV_EVENT_QP_REQ_ERR
IBV_EVENT_QP_ACCESS_ERR = ibv_event_type.IBV_EVENT_QP_ACCESS_ERR
IBV_EVENT_COMM_EST = ibv_event_type.IBV_EVENT_COMM_EST
IBV_EVENT_SQ_DRAINED = ibv_event_type.IBV_EVENT_SQ_DRAINED
IBV_EVENT_PATH_MIG = ibv_event_type.IBV_EVENT_PATH_MIG
IBV_EVENT_PATH_MIG_ERR = ibv_event_type.IBV_EVENT_PATH_MIG_ERR
IBV_EVENT_DEVICE_FATAL = ibv_event_type.IBV_EVENT_DEVICE_FATAL
IBV_EVENT_PORT_ACTIVE = ibv_event_type.IBV_EVENT_PORT_ACTIVE
IBV_EVENT_PORT_ERR = ibv_event_type.IBV_EVENT_PORT_ERR
IBV_EVENT_LID_CHANGE = ibv_event_type.IBV_EVENT_LID_CHANGE
IBV_EVENT_PKEY_CHANGE = ibv_event_type.IBV_EVENT_PKEY_CHANGE
IBV_EVENT_SM_CHANGE = ibv_event_type.IBV_EVENT_SM_CHANGE
IBV_EVENT_SRQ_ERR = ibv_event_type.IBV_EVENT_SRQ_ERR
IBV_EVENT_SRQ_LIMIT_REACHED = ibv_event_type.IBV_EVENT_SRQ_LIMIT_REACHED
IBV_EVENT_QP_LAST_WQE_REACHED = ibv_event_type.IBV_EVENT_QP_LAST_WQE_REACHED
IBV_EVENT_CLIENT_REREGISTER = ibv_event_type.IBV_EVENT_CLIENT_REREGISTER
IBV_EVENT_GID_CHANGE = ibv_event_type.IBV_EVENT_GID_CHANGE
IBV_EVENT_WQ_FATAL = ibv_event_type.IBV_EVENT_WQ_FATAL


class ibv_access_flags(IntFlag, boundary=enum.KEEP):
    """Memory access rights for MRs, MWs and QPs."""

    IBV_ACCESS_LOCAL_WRITE = 1 << 0
    IBV_ACCESS_REMOTE_WRITE = 1 << 1
    IBV_ACCESS_REMOTE_READ = 1 << 2
    IBV_ACCESS_REMOTE_ATOMIC = 1 << 3
    IBV_ACCESS_MW_BIND = 1 << 4  #: memory windows may be bound to this MR
    IBV_ACCESS_ZERO_BASED = 1 << 5  #: remote addresses are offsets from the start of the MR
    IBV_ACCESS_ON_DEMAND = 1 << 6  #: on-demand paging: pages are faulted in as accessed
    IBV_ACCESS_HUGETLB = 1 << 7  #: the buffer is backed by huge pages
    IBV_ACCESS_FLUSH_GLOBAL = 1 << 8  #: may be the target of a FLUSH to global visibility
    IBV_ACCESS_FLUSH_PERSISTENT = 1 << 9  #: may be the target of a FLUSH to persistence
    IBV_ACCESS_RELAXED_ORDERING = 1 << 20  #: first "optional" bit: ignored where unsupported


IBV_ACCESS_LOCAL_WRITE = ibv_access_flags.IBV_ACCESS_LOCAL_WRITE
IBV_ACCESS_REMOTE_WRITE = ibv_access_flags.IBV_ACCESS_REMOTE_WRITE
IBV_ACCESS_REMOTE_READ = ibv_access_flags.IBV_ACCESS_REMOTE_READ
IBV_ACCESS_REMOTE_ATOMIC = ibv_access_flags.IBV_ACCESS_REMOTE_ATOMIC
IBV_ACCESS_MW_BIND = ibv_access_flags.IBV_ACCESS_MW_BIND
IBV_ACCESS_ZERO_BASED = ibv_access_flags.IBV_ACCESS_ZERO_BASED
IBV_ACCESS_ON_DEMAND = ibv_access_flags.IBV_ACCESS_ON_DEMAND
IBV_ACCESS_HUGETLB = ibv_access_flags.IBV_ACCESS_HUGETLB
IBV_ACCESS_FLUSH_GLOBAL = ibv_access_flags.IBV_ACCESS_FLUSH_GLOBAL
IBV_ACCESS_FLUSH_PERSISTENT = ibv_access_flags.IBV_ACCESS_FLUSH_PERSISTENT
IBV_ACCESS_RELAXED_ORDERING = ibv_access_flags.IBV_ACCESS_RELAXED_ORDERING


class ibv_rereg_mr_flags(IntFlag, boundary=enum.KEEP):
    """What ``ibv_rereg_mr`` should change."""

    IBV_REREG_MR_CHANGE_TRANSLATION = 1 << 0  #: new address and length
    IBV_REREG_MR_CHANGE_PD = 1 << 1
    IBV_REREG_MR_CHANGE_ACCESS = 1 << 2


IBV_REREG_MR_CHANGE_TRANSLATION = ibv_rereg_mr_flags.IBV_REREG_MR_CHANGE_TRANSLATION
IBV_REREG_MR_CHANGE_PD = ibv_rereg_mr_flags.IBV_REREG_MR_CHANGE_PD
IBV_REREG_MR_CHANGE_ACCESS = ibv_rereg_mr_flags.IBV_REREG_MR_CHANGE_ACCESS


class ibv_rereg_mr_err_code(IntEnum):
    """Negative return codes of ``ibv_rereg_mr``."""

    IBV_REREG_MR_ERR_INPUT = -1  #: bad arguments; the old MR is still valid
    IBV_REREG_MR_ERR_DONT_FORK_NEW = -2  #: fork protection of the new range failed; old MR valid
    IBV_REREG_MR_ERR_DO_FORK_OLD = -3  #: fork unprotection of the old range failed; new MR valid
    IBV_REREG_MR_ERR_CMD = -4  #: kernel command failed; the MR must not be used
    #: command failed and the new range is left fork-protected
    IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW = -5


IBV_REREG_MR_ERR_INPUT = ibv_rereg_mr_err_code.IBV_REREG_MR_ERR_INPUT
IBV_REREG_MR_ERR_DONT_FORK_NEW = ibv_rereg_mr_err_code.IBV_REREG_MR_ERR_DONT_FORK_NEW
IBV_REREG_MR_ERR_DO_FORK_OLD = ibv_rereg_mr_err_code.IBV_REREG_MR_ERR_DO_FORK_OLD
IBV_REREG_MR_ERR_CMD = ibv_rereg_mr_err_code.IBV_REREG_MR_ERR_CMD
IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW = ibv_rereg_mr_err_code.IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW


class ibv_wr_opcode(IntEnum):
    """Send work request opcodes (``ibv_send_wr.opcode``)."""

    IBV_WR_RDMA_WRITE = 0
    IBV_WR_RDMA_WRITE_WITH_IMM = 1
    IBV_WR_SEND = 2
    IBV_WR_SEND_WITH_IMM = 3
    IBV_WR_RDMA_READ = 4
    IBV_WR_ATOMIC_CMP_AND_SWP = 5
    IBV_WR_ATOMIC_FETCH_AND_ADD = 6
    IBV_WR_LOCAL_INV = 7  #: invalidate a local rkey/lkey
    IBV_WR_BIND_MW = 8  #: bind a type 2 memory window
    IBV_WR_SEND_WITH_INV = 9  #: send that also invalidates an rkey at the responder
    IBV_WR_TSO = 10  #: raw packet send with TCP segmentation offload
    IBV_WR_FLUSH = 14  #: make earlier writes to remote memory visible or persistent
    IBV_WR_ATOMIC_WRITE = 15  #: 8-byte write that is atomic at the responder


IBV_WR_RDMA_WRITE = ibv_wr_opcode.IBV_WR_RDMA_WRITE
IBV_WR_RDMA_WRITE_WITH_IMM = ibv_wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM
IBV_WR_SEND = ibv_wr_opcode.IBV_WR_SEND
IBV_WR_SEND_WITH_IMM = ibv_wr_opcode.IBV_WR_SEND_WITH_IMM
IBV_WR_RDMA_READ = ibv_wr_opcode.IBV_WR_RDMA_READ
IBV_WR_ATOMIC_CMP_AND_SWP = ibv_wr_opcode.IBV_WR_ATOMIC_CMP_AND_SWP
IBV_WR_ATOMIC_FETCH_AND_ADD = ibv_wr_opcode.IBV_WR_ATOMIC_FETCH_AND_ADD
IBV_WR_LOCAL_INV = ibv_wr_opcode.IBV_WR_LOCAL_INV
IBV_WR_BIND_MW = ibv_wr_opcode.IBV_WR_BIND_MW
IBV_WR_SEND_WITH_INV = ibv_wr_opcode.IBV_WR_SEND_WITH_INV
IBV_WR_TSO = ibv_wr_opcode.IBV_WR_TSO
IBV_WR_FLUSH = ibv_wr_opcode.IBV_WR_FLUSH
IBV_WR_ATOMIC_WRITE = ibv_wr_opcode.IBV_WR_ATOMIC_WRITE


class ibv_ops_wr_opcode(IntEnum):
    """Tag-matching list operations posted with ``ibv_post_srq_ops``."""

    IBV_WR_TAG_ADD = 0
    IBV_WR_TAG_DEL = 1
    IBV_WR_TAG_SYNC = 2  #: resynchronise the tag list with the device


IBV_WR_TAG_ADD = ibv_ops_wr_opcode.IBV_WR_TAG_ADD
IBV_WR_TAG_DEL = ibv_ops_wr_opcode.IBV_WR_TAG_DEL
IBV_WR_TAG_SYNC = ibv_ops_wr_opcode.IBV_WR_TAG_SYNC


class ibv_ops_flags(IntFlag, boundary=enum.KEEP):
    """Flags of a tag-matching list operation."""

    IBV_OPS_SIGNALED = 1 << 0
    IBV_OPS_TM_SYNC = 1 << 1  #: also resynchronise the tag list


IBV_OPS_SIGNALED = ibv_ops_flags.IBV_OPS_SIGNALED
IBV_OPS_TM_SYNC = ibv_ops_flags.IBV_OPS_TM_SYNC


class ibv_send_flags(IntFlag, boundary=enum.KEEP):
    """Per-WR send flags (``ibv_send_wr.send_flags``)."""

    IBV_SEND_FENCE = 1 << 0  #: wait for earlier RDMA reads and atomics to finish first
    IBV_SEND_SIGNALED = 1 << 1  #: generate a completion even if sq_sig_all is off
    IBV_SEND_SOLICITED = 1 << 2  #: set the solicited-event bit in the last packet
    IBV_SEND_INLINE = 1 << 3  #: copy the payload into the WQE at post time
    IBV_SEND_IP_CSUM = 1 << 4  #: offload IP/L4 checksum (UD and raw packet QPs)


IBV_SEND_FENCE = ibv_send_flags.IBV_SEND_FENCE
IBV_SEND_SIGNALED = ibv_send_flags.IBV_SEND_SIGNALED
IBV_SEND_SOLICITED = ibv_send_flags.IBV_SEND_SOLICITED
IBV_SEND_INLINE = ibv_send_flags.IBV_SEND_INLINE
IBV_SEND_IP_CSUM = ibv_send_flags.IBV_SEND_IP_CSUM


class ibv_tm_cap_flags(IntFlag, boundary=enum.KEEP):
    """Transports on which hardware tag matching is available."""

    IBV_TM_CAP_RC = 1 << 0


IBV_TM_CAP_RC = ibv_tm_cap_flags.IBV_TM_CAP_RC


class ibv_qp_type(IntEnum):
    """Queue pair transport service types."""

    IBV_QPT_RC = 2
    IBV_QPT_UC = 3
    IBV_QPT_UD = 4
    IBV_QPT_RAW_PACKET = 8  #: Ethernet frames built by the application
    IBV_QPT_XRC_SEND = 9  #: XRC initiator QP
    IBV_QPT_XRC_RECV = 10  #: XRC target QP
    IBV_QPT_DRIVER = 0xFF  #: vendor-specific QP type created through a provider


IBV_QPT_RC = ibv_qp_type.IBV_QPT_RC
IBV_QPT_UC = ibv_qp_type.IBV_QPT_UC
IBV_QPT_UD = ibv_qp_type.IBV_QPT_UD
IBV_QPT_RAW_PACKET = ibv_qp_type.IBV_QPT_RAW_PACKET
IBV_QPT_XRC_SEND = ibv_qp_type.IBV_QPT_XRC_SEND
IBV_QPT_XRC_RECV = ibv_qp_type.IBV_QPT_XRC_RECV
IBV_QPT_DRIVER = ibv_qp_type.IBV_QPT_DRIVER


class ibv_qp_state(IntEnum):
    """Queue pair states of the IBA QP state machine."""

    IBV_QPS_RESET = 0
    IBV_QPS_INIT = 1
    IBV_QPS_RTR = 2  #: ready to receive
    IBV_QPS_RTS = 3  #: ready to send
    IBV_QPS_SQD = 4  #: send queue drain(ing/ed)
    IBV_QPS_SQE = 5  #: send queue error (UC/UD): receives still work
    IBV_QPS_ERR = 6
    IBV_QPS_UNKNOWN = 7  #: state could not be determined


IBV_QPS_RESET = ibv_qp_state.IBV_QPS_RESET
IBV_QPS_INIT = ibv_qp_state.IBV_QPS_INIT
IBV_QPS_RTR = ibv_qp_state.IBV_QPS_RTR
IBV_QPS_RTS = ibv_qp_state.IBV_QPS_RTS
IBV_QPS_SQD = ibv_qp_state.IBV_QPS_SQD
IBV_QPS_SQE = ibv_qp_state.IBV_QPS_SQE
IBV_QPS_ERR = ibv_qp_state.IBV_QPS_ERR
IBV_QPS_UNKNOWN = ibv_qp_state.IBV_QPS_UNKNOWN


class ibv_mw_type(IntEnum):
    """Memory window types."""

    IBV_MW_TYPE_1 = 1
    IBV_MW_TYPE_2 = 2


IBV_MW_TYPE_1 = ibv_mw_type.IBV_MW_TYPE_1
IBV_MW_TYPE_2 = ibv_mw_type.IBV_MW_TYPE_2


class ibv_wc_status(IntEnum):
    """Work completion status codes (``ibv_wc.status``)."""

    IBV_WC_SUCCESS = 0
    IBV_WC_LOC_LEN_ERR = 1  #: local length error, e.g. receive buffer too small
    IBV_WC_LOC_QP_OP_ERR = 2  #: local QP operation error, e.g. malformed WQE
    IBV_WC_LOC_EEC_OP_ERR = 3  #: local EE context error (RD only, unused)
    IBV_WC_LOC_PROT_ERR = 4  #: local protection error: bad lkey or access rights
    IBV_WC_WR_FLUSH_ERR = 5  #: WR flushed because the QP is in the error state
    IBV_WC_MW_BIND_ERR = 6  #: memory window bind failed
    IBV_WC_BAD_RESP_ERR = 7  #: unexpected response opcode from the responder
    IBV_WC_LOC_ACCESS_ERR = 8  #: access violation on a local buffer while responding
    IBV_WC_REM_INV_REQ_ERR = 9  #: responder rejected the request as invalid (NAK)
    IBV_WC_REM_ACCESS_ERR = 10  #: responder reported a remote access violation (NAK)
    IBV_WC_REM_OP_ERR = 11  #: responder could not complete the operation (NAK)
    IBV_WC_RETRY_EXC_ERR = 12  #: transport retries (retry_cnt) exhausted
    IBV_WC_RNR_RETRY_EXC_ERR = 13  #: receiver-not-ready retries (rnr_retry) exhausted
    IBV_WC_LOC_RDD_VIOL_ERR = 14  #: RD domain violation (RD only, unused)
    IBV_WC_REM_INV_RD_REQ_ERR = 15  #: invalid RD request (RD only, unused)
    IBV_WC_REM_ABORT_ERR = 16  #: responder aborted the operation
    IBV_WC_INV_EECN_ERR = 17  #: invalid EE context number (RD only, unused)
    IBV_WC_INV_EEC_STATE_ERR = 18  #: invalid EE context state (RD only, unused)
    IBV_WC_FATAL_ERR = 19  #: fatal device or transport error
    IBV_WC_RESP_TIMEOUT_ERR = 20  #: response timed out
    IBV_WC_GENERAL_ERR = 21
    IBV_WC_TM_ERR = 22  #: tag-matching operation failed
    IBV_WC_TM_RNDV_INCOMPLETE = 23  #: rendezvous matched; software must finish the transfer


IBV_WC_SUCCESS = ibv_wc_status.IBV_WC_SUCCESS
IBV_WC_LOC_LEN_ERR = ibv_wc_status.IBV_WC_LOC_LEN_ERR
IBV_WC_LOC_QP_OP_ERR = ibv_wc_status.IBV_WC_LOC_QP_OP_ERR
IBV_WC_LOC_EEC_OP_ERR = ibv_wc_status.IBV_WC_LOC_EEC_OP_ERR
IBV_WC_LOC_PROT_ERR = ibv_wc_status.IBV_WC_LOC_PROT_ERR
IBV_WC_WR_FLUSH_ERR = ibv_wc_status.IBV_WC_WR_FLUSH_ERR
IBV_WC_MW_BIND_ERR = ibv_wc_status.IBV_WC_MW_BIND_ERR
IBV_WC_BAD_RESP_ERR = ibv_wc_status.IBV_WC_BAD_RESP_ERR
IBV_WC_LOC_ACCESS_ERR = ibv_wc_status.IBV_WC_LOC_ACCESS_ERR
IBV_WC_REM_INV_REQ_ERR = ibv_wc_status.IBV_WC_REM_INV_REQ_ERR
IBV_WC_REM_ACCESS_ERR = ibv_wc_status.IBV_WC_REM_ACCESS_ERR
IBV_WC_REM_OP_ERR = ibv_wc_status.IBV_WC_REM_OP_ERR
IBV_WC_RETRY_EXC_ERR = ibv_wc_status.IBV_WC_RETRY_EXC_ERR
IBV_WC_RNR_RETRY_EXC_ERR = ibv_wc_status.IBV_WC_RNR_RETRY_EXC_ERR
IBV_WC_LOC_RDD_VIOL_ERR = ibv_wc_status.IBV_WC_LOC_RDD_VIOL_ERR
IBV_WC_REM_INV_RD_REQ_ERR = ibv_wc_status.IBV_WC_REM_INV_RD_REQ_ERR
IBV_WC_REM_ABORT_ERR = ibv_wc_status.IBV_WC_REM_ABORT_ERR
IBV_WC_INV_EECN_ERR = ibv_wc_status.IBV_WC_INV_EECN_ERR
IBV_WC_INV_EEC_STATE_ERR = ibv_wc_status.IBV_WC_INV_EEC_STATE_ERR
IBV_WC_FATAL_ERR = ibv_wc_status.IBV_WC_FATAL_ERR
IBV_WC_RESP_TIMEOUT_ERR = ibv_wc_status.IBV_WC_RESP_TIMEOUT_ERR
IBV_WC_GENERAL_ERR = ibv_wc_status.IBV_WC_GENERAL_ERR
IBV_WC_TM_ERR = ibv_wc_status.IBV_WC_TM_ERR
IBV_WC_TM_RNDV_INCOMPLETE = ibv_wc_status.IBV_WC_TM_RNDV_INCOMPLETE


class ibv_wc_opcode(IntEnum):
    """Work completion opcodes (``ibv_wc.opcode``)."""

    IBV_WC_SEND = 0
    IBV_WC_RDMA_WRITE = 1
    IBV_WC_RDMA_READ = 2
    IBV_WC_COMP_SWAP = 3  #: atomic compare-and-swap
    IBV_WC_FETCH_ADD = 4  #: atomic fetch-and-add
    IBV_WC_BIND_MW = 5
    IBV_WC_LOCAL_INV = 6
    IBV_WC_TSO = 7
    IBV_WC_FLUSH = 8
    IBV_WC_ATOMIC_WRITE = 9
    IBV_WC_RECV = 1 << 7  #: bit 7 is set in every receive-side completion opcode
    IBV_WC_RECV_RDMA_WITH_IMM = 129  #: responder side of an RDMA write with immediate
    IBV_WC_TM_ADD = 130
    IBV_WC_TM_DEL = 131
    IBV_WC_TM_SYNC = 132
    IBV_WC_TM_RECV = 133
    IBV_WC_TM_NO_TAG = 134  #: tag-matching receive that carried no tag
    IBV_WC_DRIVER2 = 136  #: provider-specific
    IBV_WC_DRIVER3 = 137  #: provider-specific


IBV_WC_SEND = ibv_wc_opcode.IBV_WC_SEND
IBV_WC_RDMA_WRITE = ibv_wc_opcode.IBV_WC_RDMA_WRITE
IBV_WC_RDMA_READ = ibv_wc_opcode.IBV_WC_RDMA_READ
IBV_WC_COMP_SWAP = ibv_wc_opcode.IBV_WC_COMP_SWAP
IBV_WC_FETCH_ADD = ibv_wc_opcode.IBV_WC_FETCH_ADD
IBV_WC_BIND_MW = ibv_wc_opcode.IBV_WC_BIND_MW
IBV_WC_LOCAL_INV = ibv_wc_opcode.IBV_WC_LOCAL_INV
IBV_WC_TSO = ibv_wc_opcode.IBV_WC_TSO
IBV_WC_FLUSH = ibv_wc_opcode.IBV_WC_FLUSH
IBV_WC_ATOMIC_WRITE = ibv_wc_opcode.IBV_WC_ATOMIC_WRITE
IBV_WC_RECV = ibv_wc_opcode.IBV_WC_RECV
IBV_WC_RECV_RDMA_WITH_IMM = ibv_wc_opcode.IBV_WC_RECV_RDMA_WITH_IMM
IBV_WC_TM_ADD = ibv_wc_opcode.IBV_WC_TM_ADD
IBV_WC_TM_DEL = ibv_wc_opcode.IBV_WC_TM_DEL
IBV_WC_TM_SYNC = ibv_wc_opcode.IBV_WC_TM_SYNC
IBV_WC_TM_RECV = ibv_wc_opcode.IBV_WC_TM_RECV
IBV_WC_TM_NO_TAG = ibv_wc_opcode.IBV_WC_TM_NO_TAG
IBV_WC_DRIVER2 = ibv_wc_opcode.IBV_WC_DRIVER2
IBV_WC_DRIVER3 = ibv_wc_opcode.IBV_WC_DRIVER3


class ibv_create_cq_wc_flags(IntFlag, boundary=enum.KEEP):
    """Which optional fields an extended CQ reports (``wc_flags``)."""

    IBV_WC_EX_WITH_BYTE_LEN = 1 << 0
    IBV_WC_EX_WITH_IMM = 1 << 1
    IBV_WC_EX_WITH_QP_NUM = 1 << 2
    IBV_WC_EX_WITH_SRC_QP = 1 << 3
    IBV_WC_EX_WITH_SLID = 1 << 4
    IBV_WC_EX_WITH_SL = 1 << 5
    IBV_WC_EX_WITH_DLID_PATH_BITS = 1 << 6  #: low LID bits used for multipath
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = 1 << 7  #: device clock timestamp
    IBV_WC_EX_WITH_CVLAN = 1 << 8  #: stripped customer VLAN tag
    IBV_WC_EX_WITH_FLOW_TAG = 1 << 9
    IBV_WC_EX_WITH_TM_INFO = 1 << 10
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK = 1 << 11  #: timestamp converted to wall-clock ns


IBV_WC_EX_WITH_BYTE_LEN = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_BYTE_LEN
IBV_WC_EX_WITH_IMM = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_IMM
IBV_WC_EX_WITH_QP_NUM = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_QP_NUM
IBV_WC_EX_WITH_SRC_QP = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_SRC_QP
IBV_WC_EX_WITH_SLID = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_SLID
IBV_WC_EX_WITH_SL = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_SL
IBV_WC_EX_WITH_DLID_PATH_BITS = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_DLID_PATH_BITS
IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
IBV_WC_EX_WITH_CVLAN = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_CVLAN
IBV_WC_EX_WITH_FLOW_TAG = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_FLOW_TAG
IBV_WC_EX_WITH_TM_INFO = ibv_create_cq_wc_flags.IBV_WC_EX_WITH_TM_INFO
IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK = (
    ibv_create_cq_wc_flags.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
)


class ibv_wc_flags(IntFlag, boundary=enum.KEEP):
    """Flags carried by a completion (``ibv_wc.wc_flags``)."""

    IBV_WC_GRH = 1 << 0  #: a GRH occupies the first 40 bytes of the receive buffer
    IBV_WC_WITH_IMM = 1 << 1  #: completion carries immediate data
    IBV_WC_IP_CSUM_OK = 1 << 2  #: hardware verified the IP/L4 checksum
    IBV_WC_WITH_INV = 1 << 3  #: completion carries an invalidated rkey
    IBV_WC_TM_SYNC_REQ = 1 << 4  #: device asks for a tag-list sync
    IBV_WC_TM_MATCH = 1 << 5
    IBV_WC_TM_DATA_VALID = 1 << 6  #: tag-matched data landed in the user buffer


IBV_WC_GRH = ibv_wc_flags.IBV_WC_GRH
IBV_WC_WITH_IMM = ibv_wc_flags.IBV_WC_WITH_IMM
IBV_WC_IP_CSUM_OK = ibv_wc_flags.IBV_WC_IP_CSUM_OK
IBV_WC_WITH_INV = ibv_wc_flags.IBV_WC_WITH_INV
IBV_WC_TM_SYNC_REQ = ibv_wc_flags.IBV_WC_TM_SYNC_REQ
IBV_WC_TM_MATCH = ibv_wc_flags.IBV_WC_TM_MATCH
IBV_WC_TM_DATA_VALID = ibv_wc_flags.IBV_WC_TM_DATA_VALID


class ibv_srq_attr_mask(IntFlag, boundary=enum.KEEP):
    """Which SRQ attributes ``ibv_modify_srq`` sets."""

    IBV_SRQ_MAX_WR = 1 << 0  #: resize the SRQ
    IBV_SRQ_LIMIT = 1 << 1  #: arm the SRQ limit event


IBV_SRQ_MAX_WR = ibv_srq_attr_mask.IBV_SRQ_MAX_WR
IBV_SRQ_LIMIT = ibv_srq_attr_mask.IBV_SRQ_LIMIT


class ibv_srq_type(IntEnum):
    """Shared receive queue types."""

    IBV_SRQT_BASIC = 0
    IBV_SRQT_XRC = 1
    IBV_SRQT_TM = 2  #: SRQ with hardware tag matching


IBV_SRQT_BASIC = ibv_srq_type.IBV_SRQT_BASIC
IBV_SRQT_XRC = ibv_srq_type.IBV_SRQT_XRC
IBV_SRQT_TM = ibv_srq_type.IBV_SRQT_TM


class ibv_srq_init_attr_mask(IntFlag, boundary=enum.KEEP):
    """Valid fields of ``ibv_srq_init_attr_ex``."""

    IBV_SRQ_INIT_ATTR_TYPE = 1 << 0
    IBV_SRQ_INIT_ATTR_PD = 1 << 1
    IBV_SRQ_INIT_ATTR_XRCD = 1 << 2
    IBV_SRQ_INIT_ATTR_CQ = 1 << 3
    IBV_SRQ_INIT_ATTR_TM = 1 << 4


IBV_SRQ_INIT_ATTR_TYPE = ibv_srq_init_attr_mask.IBV_SRQ_INIT_ATTR_TYPE
IBV_SRQ_INIT_ATTR_PD = ibv_srq_init_attr_mask.IBV_SRQ_INIT_ATTR_PD
IBV_SRQ_INIT_ATTR_XRCD = ibv_srq_init_attr_mask.IBV_SRQ_INIT_ATTR_XRCD
IBV_SRQ_INIT_ATTR_CQ = ibv_srq_init_attr_mask.IBV_SRQ_INIT_ATTR_CQ
IBV_SRQ_INIT_ATTR_TM = ibv_srq_init_attr_mask.IBV_SRQ_INIT_ATTR_TM


class ibv_mig_state(IntEnum):
    """Automatic path migration state."""

    IBV_MIG_MIGRATED = 0  #: no alternate path loaded
    IBV_MIG_REARM = 1  #: alternate path loaded, waiting to be armed
    IBV_MIG_ARMED = 2  #: ready to migrate to the alternate path


IBV_MIG_MIGRATED = ibv_mig_state.IBV_MIG_MIGRATED
IBV_MIG_REARM = ibv_mig_state.IBV_MIG_REARM
IBV_MIG_ARMED = ibv_mig_state.IBV_MIG_ARMED


class ibv_qp_init_attr_mask(IntFlag, boundary=enum.KEEP):
    """Valid fields of ``ibv_qp_init_attr_ex``."""

    IBV_QP_INIT_ATTR_PD = 1 << 0
    IBV_QP_INIT_ATTR_XRCD = 1 << 1
    IBV_QP_INIT_ATTR_CREATE_FLAGS = 1 << 2
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER = 1 << 3
    IBV_QP_INIT_ATTR_IND_TABLE = 1 << 4  #: RSS indirection table
    IBV_QP_INIT_ATTR_RX_HASH = 1 << 5
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = 1 << 6


IBV_QP_INIT_ATTR_PD = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_PD
IBV_QP_INIT_ATTR_XRCD = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_XRCD
IBV_QP_INIT_ATTR_CREATE_FLAGS = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_CREATE_FLAGS
IBV_QP_INIT_ATTR_MAX_TSO_HEADER = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_MAX_TSO_HEADER
IBV_QP_INIT_ATTR_IND_TABLE = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_IND_TABLE
IBV_QP_INIT_ATTR_RX_HASH = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_RX_HASH
IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS


class ibv_qp_create_flags(IntFlag, boundary=enum.KEEP):
    """Optional QP creation behaviours (``create_flags``)."""

    IBV_QP_CREATE_BLOCK_SELF_MCAST_LB = 1 << 1  #: do not loop back our own multicast sends
    IBV_QP_CREATE_SCATTER_FCS = 1 << 8  #: keep the Ethernet FCS in received frames
    IBV_QP_CREATE_CVLAN_STRIPPING = 1 << 9  #: strip the customer VLAN tag on receive
    IBV_QP_CREATE_SOURCE_QPN = 1 << 10  #: send with a caller-chosen source QPN
    IBV_QP_CREATE_PCI_WRITE_END_PADDING = 1 << 11  #: pad receive writes to a full cache line


IBV_QP_CREATE_BLOCK_SELF_MCAST_LB = ibv_qp_create_flags.IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
IBV_QP_CREATE_SCATTER_FCS = ibv_qp_create_flags.IBV_QP_CREATE_SCATTER_FCS
IBV_QP_CREATE_CVLAN_STRIPPING = ibv_qp_create_flags.IBV_QP_CREATE_CVLAN_STRIPPING
IBV_QP_CREATE_SOURCE_QPN = ibv_qp_create_flags.IBV_QP_CREATE_SOURCE_QPN
IBV_QP_CREATE_PCI_WRITE_END_PADDING = ibv_qp_create_flags.IBV_QP_CREATE_PCI_WRITE_END_PADDING


class ibv_qp_attr_mask(IntFlag, boundary=enum.KEEP):
    """Which ``ibv_qp_attr`` fields a modify/query call uses."""

    IBV_QP_STATE = 1 << 0
    IBV_QP_CUR_STATE = 1 << 1  #: the cur_qp_state field is a hint of the current state
    IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2  #: raise IBV_EVENT_SQ_DRAINED when SQD is reached
    IBV_QP_ACCESS_FLAGS = 1 << 3
    IBV_QP_PKEY_INDEX = 1 << 4
    IBV_QP_PORT = 1 << 5
    IBV_QP_QKEY = 1 << 6
    IBV_QP_AV = 1 << 7  #: primary path address vector (ah_attr)
    IBV_QP_PATH_MTU = 1 << 8
    IBV_QP_TIMEOUT = 1 << 9  #: local ACK timeout exponent
    IBV_QP_RETRY_CNT = 1 << 10  #: transport retry count
    IBV_QP_RNR_RETRY = 1 << 11  #: RNR retry count (7 means infinite)
    IBV_QP_RQ_PSN = 1 << 12
    IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13  #: outstanding reads/atomics as initiator
    IBV_QP_ALT_PATH = 1 << 14  #: alternate path fields
    IBV_QP_MIN_RNR_TIMER = 1 << 15  #: RNR NAK timer code sent to requesters (see RNR_TIMER_US)
    IBV_QP_SQ_PSN = 1 << 16
    IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17  #: outstanding reads/atomics as responder
    IBV_QP_PATH_MIG_STATE = 1 << 18
    IBV_QP_CAP = 1 << 19  #: queue sizes (cap)
    IBV_QP_DEST_QPN = 1 << 20  #: remote QP number
    IBV_QP_RATE_LIMIT = 1 << 25  #: packet pacing rate (bits 21-24 are reserved)


IBV_QP_STATE = ibv_qp_attr_mask.IBV_QP_STATE
IBV_QP_CUR_STATE = ibv_qp_attr_mask.IBV_QP_CUR_STATE
IBV_QP_EN_SQD_ASYNC_NOTIFY = ibv_qp_attr_mask.IBV_QP_EN_SQD_ASYNC_NOTIFY
IBV_QP_ACCESS_FLAGS = ibv_qp_attr_mask.IBV_QP_ACCESS_FLAGS
IBV_QP_PKEY_INDEX = ibv_qp_attr_mask.IBV_QP_PKEY_INDEX
IBV_QP_PORT = ibv_qp_attr_mask.IBV_QP_PORT
IBV_QP_QKEY = ibv_qp_attr_mask.IBV_QP_QKEY
IBV_QP_AV = ibv_qp_attr_mask.IBV_QP_AV
IBV_QP_PATH_MTU = ibv_qp_attr_mask.IBV_QP_PATH_MTU
IBV_QP_TIMEOUT = ibv_qp_attr_mask.IBV_QP_TIMEOUT
IBV_QP_RETRY_CNT = ibv_qp_attr_mask.IBV_QP_RETRY_CNT
IBV_QP_RNR_RETRY = ibv_qp_attr_mask.IBV_QP_RNR_RETRY
IBV_QP_RQ_PSN = ibv_qp_attr_mask.IBV_QP_RQ_PSN
IBV_QP_MAX_QP_RD_ATOMIC = ibv_qp_attr_mask.IBV_QP_MAX_QP_RD_ATOMIC
IBV_QP_ALT_PATH = ibv_qp_attr_mask.IBV_QP_ALT_PATH
IBV_QP_MIN_RNR_TIMER = ibv_qp_attr_mask.IBV_QP_MIN_RNR_TIMER
IBV_QP_SQ_PSN = ibv_qp_attr_mask.IBV_QP_SQ_PSN
IBV_QP_MAX_DEST_RD_ATOMIC = ibv_qp_attr_mask.IBV_QP_MAX_DEST_RD_ATOMIC
IBV_QP_PATH_MIG_STATE = ibv_qp_attr_mask.IBV_QP_PATH_MIG_STATE
IBV_QP_CAP = ibv_qp_attr_mask.IBV_QP_CAP
IBV_QP_DEST_QPN = ibv_qp_attr_mask.IBV_QP_DEST_QPN
IBV_QP_RATE_LIMIT = ibv_qp_attr_mask.IBV_QP_RATE_LIMIT


class ibv_query_qp_data_in_order_flags(IntFlag, boundary=enum.KEEP):
    """Flags of ``ibv_query_qp_data_in_order``."""

    IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS = 1 << 0  #: return the capability bits instead of 0/1


IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS = (
    ibv_query_qp_data_in_order_flags.IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS
)


class ibv_query_qp_data_in_order_caps(IntFlag, boundary=enum.KEEP):
    """Data placement ordering guarantees of a QP."""

    IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG = 1 << 0  #: a whole message is written in order
    IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES = 1 << 1  #: in order in aligned 128-byte units


IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG = (
    ibv_query_qp_data_in_order_caps.IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG
)
IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES = (
    ibv_query_qp_data_in_order_caps.IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES
)


class ibv_wq_type(IntEnum):
    """Work queue types."""

    IBV_WQT_RQ = 0  #: receive work queue


IBV_WQT_RQ = ibv_wq_type.IBV_WQT_RQ


class ibv_wq_init_attr_mask(IntFlag, boundary=enum.KEEP):
    """Valid fields of ``ibv_wq_init_attr``."""

    IBV_WQ_INIT_ATTR_FLAGS = 1 << 0


IBV_WQ_INIT_ATTR_FLAGS = ibv_wq_init_attr_mask.IBV_WQ_INIT_ATTR_FLAGS


class ibv_wq_flags(IntFlag, boundary=enum.KEEP):
    """Optional work queue behaviours."""

    IBV_WQ_FLAGS_CVLAN_STRIPPING = 1 << 0
    IBV_WQ_FLAGS_SCATTER_FCS = 1 << 1
    IBV_WQ_FLAGS_DELAY_DROP = 1 << 2  #: hold packets briefly instead of dropping when empty
    IBV_WQ_FLAGS_PCI_WRITE_END_PADDING = 1 << 3


IBV_WQ_FLAGS_CVLAN_STRIPPING = ibv_wq_flags.IBV_WQ_FLAGS_CVLAN_STRIPPING
IBV_WQ_FLAGS_SCATTER_FCS = ibv_wq_flags.IBV_WQ_FLAGS_SCATTER_FCS
IBV_WQ_FLAGS_DELAY_DROP = ibv_wq_flags.IBV_WQ_FLAGS_DELAY_DROP
IBV_WQ_FLAGS_PCI_WRITE_END_PADDING = ibv_wq_flags.IBV_WQ_FLAGS_PCI_WRITE_END_PADDING


class ibv_wq_state(IntEnum):
    """Work queue states."""

    IBV_WQS_RESET = 0
    IBV_WQS_RDY = 1  #: ready
    IBV_WQS_ERR = 2
    IBV_WQS_UNKNOWN = 3


IBV_WQS_RESET = ibv_wq_state.IBV_WQS_RESET
IBV_WQS_RDY = ibv_wq_state.IBV_WQS_RDY
IBV_WQS_ERR = ibv_wq_state.IBV_WQS_ERR
IBV_WQS_UNKNOWN = ibv_wq_state.IBV_WQS_UNKNOWN


class ibv_wq_attr_mask(IntFlag, boundary=enum.KEEP):
    """Which ``ibv_wq_attr`` fields ``ibv_modify_wq`` sets."""

    IBV_WQ_ATTR_STATE = 1 << 0
    IBV_WQ_ATTR_CURR_STATE = 1 << 1  #: the curr_wq_state field is a hint of the current state
    IBV_WQ_ATTR_FLAGS = 1 << 2


IBV_WQ_ATTR_STATE = ibv_wq_attr_mask.IBV_WQ_ATTR_STATE
IBV_WQ_ATTR_CURR_STATE = ibv_wq_attr_mask.IBV_WQ_ATTR_CURR_STATE
IBV_WQ_ATTR_FLAGS = ibv_wq_attr_mask.IBV_WQ_ATTR_FLAGS


class ibv_rx_hash_function_flags(IntFlag, boundary=enum.KEEP):
    """Receive-side-scaling hash functions."""

    IBV_RX_HASH_FUNC_TOEPLITZ = 1 << 0  #: Toeplitz hash, as in Microsoft RSS


IBV_RX_HASH_FUNC_TOEPLITZ = ibv_rx_hash_function_flags.IBV_RX_HASH_FUNC_TOEPLITZ


class ibv_rx_hash_fields(IntFlag, boundary=enum.KEEP):
    """Packet fields fed into the RSS hash."""

    IBV_RX_HASH_SRC_IPV4 = 1 << 0
    IBV_RX_HASH_DST_IPV4 = 1 << 1
    IBV_RX_HASH_SRC_IPV6 = 1 << 2
    IBV_RX_HASH_DST_IPV6 = 1 << 3
    IBV_RX_HASH_SRC_PORT_TCP = 1 << 4
    IBV_RX_HASH_DST_PORT_TCP = 1 << 5
    IBV_RX_HASH_SRC_PORT_UDP = 1 << 6
    IBV_RX_HASH_DST_PORT_UDP = 1 << 7


IBV_RX_HASH_SRC_IPV4 = ibv_rx_hash_fields.IBV_RX_HASH_SRC_IPV4
IBV_RX_HASH_DST_IPV4 = ibv_rx_hash_fields.IBV_RX_HASH_DST_IPV4
IBV_RX_HASH_SRC_IPV6 = ibv_rx_hash_fields.IBV_RX_HASH_SRC_IPV6
IBV_RX_HASH_DST_IPV6 = ibv_rx_hash_fields.IBV_RX_HASH_DST_IPV6
IBV_RX_HASH_SRC_PORT_TCP = ibv_rx_hash_fields.IBV_RX_HASH_SRC_PORT_TCP
IBV_RX_HASH_DST_PORT_TCP = ibv_rx_hash_fields.IBV_RX_HASH_DST_PORT_TCP
IBV_RX_HASH_SRC_PORT_UDP = ibv_rx_hash_fields.IBV_RX_HASH_SRC_PORT_UDP
IBV_RX_HASH_DST_PORT_UDP = ibv_rx_hash_fields.IBV_RX_HASH_DST_PORT_UDP


class ibv_flow_flags(IntFlag, boundary=enum.KEEP):
    """Flow steering rule flags."""

    IBV_FLOW_ATTR_FLAGS_DONT_TRAP = 1 << 1  #: matching packets also reach the normal receive path
    IBV_FLOW_ATTR_FLAGS_EGRESS = 1 << 2  #: rule applies to transmitted packets


IBV_FLOW_ATTR_FLAGS_DONT_TRAP = ibv_flow_flags.IBV_FLOW_ATTR_FLAGS_DONT_TRAP
IBV_FLOW_ATTR_FLAGS_EGRESS = ibv_flow_flags.IBV_FLOW_ATTR_FLAGS_EGRESS


class ibv_flow_attr_type(IntEnum):
    """Flow steering rule kinds."""

    IBV_FLOW_ATTR_NORMAL = 0  #: match by the specs that follow
    IBV_FLOW_ATTR_ALL_DEFAULT = 1  #: catch traffic no other rule took
    IBV_FLOW_ATTR_MC_DEFAULT = 2  #: catch multicast traffic no other rule took
    IBV_FLOW_ATTR_SNIFFER = 3  #: copy all traffic


IBV_FLOW_ATTR_NORMAL = ibv_flow_attr_type.IBV_FLOW_ATTR_NORMAL
IBV_FLOW_ATTR_ALL_DEFAULT = ibv_flow_attr_type.IBV_FLOW_ATTR_ALL_DEFAULT
IBV_FLOW_ATTR_MC_DEFAULT = ibv_flow_attr_type.IBV_FLOW_ATTR_MC_DEFAULT
IBV_FLOW_ATTR_SNIFFER = ibv_flow_attr_type.IBV_FLOW_ATTR_SNIFFER


class ibv_flow_spec_type(IntEnum):
    """Flow steering specification kinds."""

    IBV_FLOW_SPEC_ETH = 0x0020
    IBV_FLOW_SPEC_IPV4 = 0x0030
    IBV_FLOW_SPEC_IPV6 = 0x0031
    IBV_FLOW_SPEC_IPV4_EXT = 0x0032  #: IPv4 with ToS/TTL/protocol/flags
    IBV_FLOW_SPEC_ESP = 0x0034  #: IPsec ESP
    IBV_FLOW_SPEC_TCP = 0x0040
    IBV_FLOW_SPEC_UDP = 0x0041
    IBV_FLOW_SPEC_VXLAN_TUNNEL = 0x0050
    IBV_FLOW_SPEC_GRE = 0x0051
    IBV_FLOW_SPEC_MPLS = 0x0060
    IBV_FLOW_SPEC_INNER = 0x0100  #: OR into a spec type to match inside the tunnel
    IBV_FLOW_SPEC_ACTION_TAG = 0x1000  #: mark matched packets with a flow tag
    IBV_FLOW_SPEC_ACTION_DROP = 0x1001
    IBV_FLOW_SPEC_ACTION_HANDLE = 0x1002  #: apply a flow action object
    IBV_FLOW_SPEC_ACTION_COUNT = 0x1003  #: count matched packets


IBV_FLOW_SPEC_ETH = ibv_flow_spec_type.IBV_FLOW_SPEC_ETH
IBV_FLOW_SPEC_IPV4 = ibv_flow_spec_type.IBV_FLOW_SPEC_IPV4
IBV_FLOW_SPEC_IPV6 = ibv_flow_spec_type.IBV_FLOW_SPEC_IPV6
IBV_FLOW_SPEC_IPV4_EXT = ibv_flow_spec_type.IBV_FLOW_SPEC_IPV4_EXT
IBV_FLOW_SPEC_ESP = ibv_flow_spec_type.IBV_FLOW_SPEC_ESP
IBV_FLOW_SPEC_TCP = ibv_flow_spec_type.IBV_FLOW_SPEC_TCP
IBV_FLOW_SPEC_UDP = ibv_flow_spec_type.IBV_FLOW_SPEC_UDP
IBV_FLOW_SPEC_VXLAN_TUNNEL = ibv_flow_spec_type.IBV_FLOW_SPEC_VXLAN_TUNNEL
IBV_FLOW_SPEC_GRE = ibv_flow_spec_type.IBV_FLOW_SPEC_GRE
IBV_FLOW_SPEC_MPLS = ibv_flow_spec_type.IBV_FLOW_SPEC_MPLS
IBV_FLOW_SPEC_INNER = ibv_flow_spec_type.IBV_FLOW_SPEC_INNER
IBV_FLOW_SPEC_ACTION_TAG = ibv_flow_spec_type.IBV_FLOW_SPEC_ACTION_TAG
IBV_FLOW_SPEC_ACTION_DROP = ibv_flow_spec_type.IBV_FLOW_SPEC_ACTION_DROP
IBV_FLOW_SPEC_ACTION_HANDLE = ibv_flow_spec_type.IBV_FLOW_SPEC_ACTION_HANDLE
IBV_FLOW_SPEC_ACTION_COUNT = ibv_flow_spec_type.IBV_FLOW_SPEC_ACTION_COUNT

IBV_QPF_GRH_REQUIRED: Final[int] = 1  #: ibv_port_attr.flags bit: this port needs a GRH on every AH


class ibv_counter_description(IntEnum):
    """What a counters-object entry counts."""

    IBV_COUNTER_PACKETS = 0
    IBV_COUNTER_BYTES = 1


IBV_COUNTER_PACKETS = ibv_counter_description.IBV_COUNTER_PACKETS
IBV_COUNTER_BYTES = ibv_counter_description.IBV_COUNTER_BYTES


class ibv_read_counters_flags(IntFlag, boundary=enum.KEEP):
    """Flags of ``ibv_read_counters``."""

    IBV_READ_COUNTERS_ATTR_PREFER_CACHED = 1 << 0  #: accept cached values instead of a device read


IBV_READ_COUNTERS_ATTR_PREFER_CACHED = ibv_read_counters_flags.IBV_READ_COUNTERS_ATTR_PREFER_CACHED


class ibv_cq_init_attr_mask(IntFlag, boundary=enum.KEEP):
    """Valid fields of ``ibv_cq_init_attr_ex``."""

    IBV_CQ_INIT_ATTR_MASK_FLAGS = 1 << 0
    IBV_CQ_INIT_ATTR_MASK_PD = 1 << 1


IBV_CQ_INIT_ATTR_MASK_FLAGS = ibv_cq_init_attr_mask.IBV_CQ_INIT_ATTR_MASK_FLAGS
IBV_CQ_INIT_ATTR_MASK_PD = ibv_cq_init_attr_mask.IBV_CQ_INIT_ATTR_MASK_PD


class ibv_create_cq_attr_flags(IntFlag, boundary=enum.KEEP):
    """Optional CQ creation behaviours."""

    IBV_CREATE_CQ_ATTR_SINGLE_THREADED = 1 << 0  #: caller serialises access; no CQ locking
    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN = 1 << 1  #: do not move the CQ to error on overrun


IBV_CREATE_CQ_ATTR_SINGLE_THREADED = ibv_create_cq_attr_flags.IBV_CREATE_CQ_ATTR_SINGLE_THREADED
IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN = ibv_create_cq_attr_flags.IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN


class ibv_odp_general_caps(IntFlag, boundary=enum.KEEP):
    """General on-demand-paging capabilities."""

    IBV_ODP_SUPPORT = 1 << 0
    IBV_ODP_SUPPORT_IMPLICIT = 1 << 1  #: a whole-address-space implicit ODP MR is possible


IBV_ODP_SUPPORT = ibv_odp_general_caps.IBV_ODP_SUPPORT
IBV_ODP_SUPPORT_IMPLICIT = ibv_odp_general_caps.IBV_ODP_SUPPORT_IMPLICIT


class ibv_odp_transport_cap_bits(IntFlag, boundary=enum.KEEP):
    """Operations that may target ODP memory, per transport."""

    IBV_ODP_SUPPORT_SEND = 1 << 0
    IBV_ODP_SUPPORT_RECV = 1 << 1
    IBV_ODP_SUPPORT_WRITE = 1 << 2
    IBV_ODP_SUPPORT_READ = 1 << 3
    IBV_ODP_SUPPORT_ATOMIC = 1 << 4
    IBV_ODP_SUPPORT_SRQ_RECV = 1 << 5
    IBV_ODP_SUPPORT_FLUSH = 1 << 6
    IBV_ODP_SUPPORT_ATOMIC_WRITE = 1 << 7


IBV_ODP_SUPPORT_SEND = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_SEND
IBV_ODP_SUPPORT_RECV = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_RECV
IBV_ODP_SUPPORT_WRITE = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_WRITE
IBV_ODP_SUPPORT_READ = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_READ
IBV_ODP_SUPPORT_ATOMIC = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_ATOMIC
IBV_ODP_SUPPORT_SRQ_RECV = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_SRQ_RECV
IBV_ODP_SUPPORT_FLUSH = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_FLUSH
IBV_ODP_SUPPORT_ATOMIC_WRITE = ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_ATOMIC_WRITE


class ibv_device_cap_flags(IntFlag, boundary=enum.KEEP):
    """Device capability bits (``ibv_device_attr.device_cap_flags``)."""

    IBV_DEVICE_RESIZE_MAX_WR = 1 << 0  #: queues can be resized
    IBV_DEVICE_BAD_PKEY_CNTR = 1 << 1
    IBV_DEVICE_BAD_QKEY_CNTR = 1 << 2
    IBV_DEVICE_RAW_MULTI = 1 << 3  #: raw multicast
    IBV_DEVICE_AUTO_PATH_MIG = 1 << 4  #: automatic path migration
    IBV_DEVICE_CHANGE_PHY_PORT = 1 << 5
    IBV_DEVICE_UD_AV_PORT_ENFORCE = 1 << 6  #: UD address handle port must match the QP's port
    IBV_DEVICE_CURR_QP_STATE_MOD = 1 << 7  #: modify QP honours cur_qp_state
    IBV_DEVICE_SHUTDOWN_PORT = 1 << 8
    IBV_DEVICE_INIT_TYPE = 1 << 9  #: InitType of PortInfo is supported
    IBV_DEVICE_PORT_ACTIVE_EVENT = 1 << 10
    IBV_DEVICE_SYS_IMAGE_GUID = 1 << 11
    IBV_DEVICE_RC_RNR_NAK_GEN = 1 << 12  #: RC responder generates RNR NAKs
    IBV_DEVICE_SRQ_RESIZE = 1 << 13
    IBV_DEVICE_N_NOTIFY_CQ = 1 << 14
    IBV_DEVICE_MEM_WINDOW = 1 << 17  #: memory windows
    IBV_DEVICE_UD_IP_CSUM = 1 << 18  #: checksum offload on UD QPs
    IBV_DEVICE_XRC = 1 << 20  #: extended reliable connection
    IBV_DEVICE_MEM_MGT_EXTENSIONS = 1 << 21  #: fast registration and local invalidate
    IBV_DEVICE_MEM_WINDOW_TYPE_2A = 1 << 23
    IBV_DEVICE_MEM_WINDOW_TYPE_2B = 1 << 24
    IBV_DEVICE_RC_IP_CSUM = 1 << 25
    IBV_DEVICE_RAW_IP_CSUM = 1 << 26
    IBV_DEVICE_MANAGED_FLOW_STEERING = 1 << 29  #: flow steering rules


IBV_DEVICE_RESIZE_MAX_WR = ibv_device_cap_flags.IBV_DEVICE_RESIZE_MAX_WR
IBV_DEVICE_BAD_PKEY_CNTR = ibv_device_cap_flags.IBV_DEVICE_BAD_PKEY_CNTR
IBV_DEVICE_BAD_QKEY_CNTR = ibv_device_cap_flags.IBV_DEVICE_BAD_QKEY_CNTR
IBV_DEVICE_RAW_MULTI = ibv_device_cap_flags.IBV_DEVICE_RAW_MULTI
IBV_DEVICE_AUTO_PATH_MIG = ibv_device_cap_flags.IBV_DEVICE_AUTO_PATH_MIG
IBV_DEVICE_CHANGE_PHY_PORT = ibv_device_cap_flags.IBV_DEVICE_CHANGE_PHY_PORT
IBV_DEVICE_UD_AV_PORT_ENFORCE = ibv_device_cap_flags.IBV_DEVICE_UD_AV_PORT_ENFORCE
IBV_DEVICE_CURR_QP_STATE_MOD = ibv_device_cap_flags.IBV_DEVICE_CURR_QP_STATE_MOD
IBV_DEVICE_SHUTDOWN_PORT = ibv_device_cap_flags.IBV_DEVICE_SHUTDOWN_PORT
IBV_DEVICE_INIT_TYPE = ibv_device_cap_flags.IBV_DEVICE_INIT_TYPE
IBV_DEVICE_PORT_ACTIVE_EVENT = ibv_device_cap_flags.IBV_DEVICE_PORT_ACTIVE_EVENT
IBV_DEVICE_SYS_IMAGE_GUID = ibv_device_cap_flags.IBV_DEVICE_SYS_IMAGE_GUID
IBV_DEVICE_RC_RNR_NAK_GEN = ibv_device_cap_flags.IBV_DEVICE_RC_RNR_NAK_GEN
IBV_DEVICE_SRQ_RESIZE = ibv_device_cap_flags.IBV_DEVICE_SRQ_RESIZE
IBV_DEVICE_N_NOTIFY_CQ = ibv_device_cap_flags.IBV_DEVICE_N_NOTIFY_CQ
IBV_DEVICE_MEM_WINDOW = ibv_device_cap_flags.IBV_DEVICE_MEM_WINDOW
IBV_DEVICE_UD_IP_CSUM = ibv_device_cap_flags.IBV_DEVICE_UD_IP_CSUM
IBV_DEVICE_XRC = ibv_device_cap_flags.IBV_DEVICE_XRC
IBV_DEVICE_MEM_MGT_EXTENSIONS = ibv_device_cap_flags.IBV_DEVICE_MEM_MGT_EXTENSIONS
IBV_DEVICE_MEM_WINDOW_TYPE_2A = ibv_device_cap_flags.IBV_DEVICE_MEM_WINDOW_TYPE_2A
IBV_DEVICE_MEM_WINDOW_TYPE_2B = ibv_device_cap_flags.IBV_DEVICE_MEM_WINDOW_TYPE_2B
IBV_DEVICE_RC_IP_CSUM = ibv_device_cap_flags.IBV_DEVICE_RC_IP_CSUM
IBV_DEVICE_RAW_IP_CSUM = ibv_device_cap_flags.IBV_DEVICE_RAW_IP_CSUM
IBV_DEVICE_MANAGED_FLOW_STEERING = ibv_device_cap_flags.IBV_DEVICE_MANAGED_FLOW_STEERING


class ibv_raw_packet_caps(IntFlag, boundary=enum.KEEP):
    """Capabilities of raw packet QPs."""

    IBV_RAW_PACKET_CAP_CVLAN_STRIPPING = 1 << 0
    IBV_RAW_PACKET_CAP_SCATTER_FCS = 1 << 1
    IBV_RAW_PACKET_CAP_IP_CSUM = 1 << 2
    IBV_RAW_PACKET_CAP_DELAY_DROP = 1 << 3  #: see IBV_WQ_FLAGS_DELAY_DROP


IBV_RAW_PACKET_CAP_CVLAN_STRIPPING = ibv_raw_packet_caps.IBV_RAW_PACKET_CAP_CVLAN_STRIPPING
IBV_RAW_PACKET_CAP_SCATTER_FCS = ibv_raw_packet_caps.IBV_RAW_PACKET_CAP_SCATTER_FCS
IBV_RAW_PACKET_CAP_IP_CSUM = ibv_raw_packet_caps.IBV_RAW_PACKET_CAP_IP_CSUM
IBV_RAW_PACKET_CAP_DELAY_DROP = ibv_raw_packet_caps.IBV_RAW_PACKET_CAP_DELAY_DROP


class ibv_xrcd_init_attr_mask(IntFlag, boundary=enum.KEEP):
    """Valid fields of ``ibv_xrcd_init_attr``."""

    IBV_XRCD_INIT_ATTR_FD = 1 << 0  #: fd of a file naming a shared XRC domain
    IBV_XRCD_INIT_ATTR_OFLAGS = 1 << 1  #: open(2)-style flags for that file
    IBV_XRCD_INIT_ATTR_RESERVED = 1 << 2  #: first unused bit


IBV_XRCD_INIT_ATTR_FD = ibv_xrcd_init_attr_mask.IBV_XRCD_INIT_ATTR_FD
IBV_XRCD_INIT_ATTR_OFLAGS = ibv_xrcd_init_attr_mask.IBV_XRCD_INIT_ATTR_OFLAGS
IBV_XRCD_INIT_ATTR_RESERVED = ibv_xrcd_init_attr_mask.IBV_XRCD_INIT_ATTR_RESERVED

#: the fields every extended CQ can report
IBV_WC_STANDARD_FLAGS: Final[int] = int(
    IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS
)


class ibv_values_mask(IntFlag, boundary=enum.KEEP):
    """Which values ``ibv_query_rt_values_ex`` returns."""

    IBV_VALUES_MASK_RAW_CLOCK = 1 << 0  #: device free-running clock


IBV_VALUES_MASK_RAW_CLOCK = ibv_values_mask.IBV_VALUES_MASK_RAW_CLOCK


class ibv_qp_create_send_ops_flags(IntFlag, boundary=enum.KEEP):
    """Operations an extended QP may post (``send_ops_flags``)."""

    IBV_QP_EX_WITH_RDMA_WRITE = 1 << 0
    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = 1 << 1
    IBV_QP_EX_WITH_SEND = 1 << 2
    IBV_QP_EX_WITH_SEND_WITH_IMM = 1 << 3
    IBV_QP_EX_WITH_RDMA_READ = 1 << 4
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = 1 << 5
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD = 1 << 6
    IBV_QP_EX_WITH_LOCAL_INV = 1 << 7
    IBV_QP_EX_WITH_BIND_MW = 1 << 8
    IBV_QP_EX_WITH_SEND_WITH_INV = 1 << 9
    IBV_QP_EX_WITH_TSO = 1 << 10
    IBV_QP_EX_WITH_FLUSH = 1 << 11
    IBV_QP_EX_WITH_ATOMIC_WRITE = 1 << 12


IBV_QP_EX_WITH_RDMA_WRITE = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_RDMA_WRITE
IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
IBV_QP_EX_WITH_SEND = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_SEND
IBV_QP_EX_WITH_SEND_WITH_IMM = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_SEND_WITH_IMM
IBV_QP_EX_WITH_RDMA_READ = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_RDMA_READ
IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD = (
    ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
)
IBV_QP_EX_WITH_LOCAL_INV = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_LOCAL_INV
IBV_QP_EX_WITH_BIND_MW = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_BIND_MW
IBV_QP_EX_WITH_SEND_WITH_INV = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_SEND_WITH_INV
IBV_QP_EX_WITH_TSO = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_TSO
IBV_QP_EX_WITH_FLUSH = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_FLUSH
IBV_QP_EX_WITH_ATOMIC_WRITE = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_ATOMIC_WRITE

IBV_DEVICE_RAW_SCATTER_FCS: Final[int] = 1 << 34  #: device_cap_flags_ex bit beyond the 32-bit enum
_IBV_DEVICE_RAW_SCATTER_FCS: Final[int] = IBV_DEVICE_RAW_SCATTER_FCS  #: pyverbs spelling

#: device_cap_flags_ex bit beyond the 32-bit enum
IBV_DEVICE_PCI_WRITE_END_PADDING: Final[int] = 1 << 36
#: pyverbs spelling
_IBV_DEVICE_PCI_WRITE_END_PADDING: Final[int] = IBV_DEVICE_PCI_WRITE_END_PADDING


class ibv_parent_domain_init_attr_mask(IntFlag, boundary=enum.KEEP):
    """Valid fields of ``ibv_parent_domain_init_attr``."""

    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS = 1 << 0  #: custom buffer allocation callbacks
    IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT = 1 << 1  #: opaque context passed to those callbacks


IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS = (
    ibv_parent_domain_init_attr_mask.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
)
IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT = (
    ibv_parent_domain_init_attr_mask.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT
)

#: parent-domain allocator result meaning "use the default" ((void *)-1)
IBV_ALLOCATOR_USE_DEFAULT: Final[int] = 0xFFFF_FFFF_FFFF_FFFF
_IBV_ALLOCATOR_USE_DEFAULT: Final[int] = IBV_ALLOCATOR_USE_DEFAULT  #: pyverbs spelling


class ibv_gid_type(IntEnum):
    """GID types as reported by ``ibv_query_gid_ex``."""

    IBV_GID_TYPE_IB = 0
    IBV_GID_TYPE_ROCE_V1 = 1  #: RoCE v1: GRH directly over Ethernet
    IBV_GID_TYPE_ROCE_V2 = 2  #: RoCE v2: over UDP/IP, port 4791


IBV_GID_TYPE_IB = ibv_gid_type.IBV_GID_TYPE_IB
IBV_GID_TYPE_ROCE_V1 = ibv_gid_type.IBV_GID_TYPE_ROCE_V1
IBV_GID_TYPE_ROCE_V2 = ibv_gid_type.IBV_GID_TYPE_ROCE_V2


class ibv_fork_status(IntEnum):
    """Fork-safety state of the library (``ibv_is_fork_initialized``)."""

    IBV_FORK_DISABLED = 0
    IBV_FORK_ENABLED = 1
    IBV_FORK_UNNEEDED = 2  #: the kernel makes fork() safe without help


IBV_FORK_DISABLED = ibv_fork_status.IBV_FORK_DISABLED
IBV_FORK_ENABLED = ibv_fork_status.IBV_FORK_ENABLED
IBV_FORK_UNNEEDED = ibv_fork_status.IBV_FORK_UNNEEDED


class ibv_placement_type(IntFlag, boundary=enum.KEEP):
    """Where a FLUSH makes data visible; bits may be combined."""

    IBV_FLUSH_GLOBAL = 1 << 0  #: make data visible to all observers
    IBV_FLUSH_PERSISTENT = 1 << 1  #: make data persistent


IBV_FLUSH_GLOBAL = ibv_placement_type.IBV_FLUSH_GLOBAL
IBV_FLUSH_PERSISTENT = ibv_placement_type.IBV_FLUSH_PERSISTENT


class ibv_selectivity_level(IntEnum):
    """What range a FLUSH covers."""

    IBV_FLUSH_RANGE = 0  #: only the given address range
    IBV_FLUSH_MR = 1  #: the whole memory region


IBV_FLUSH_RANGE = ibv_selectivity_level.IBV_FLUSH_RANGE
IBV_FLUSH_MR = ibv_selectivity_level.IBV_FLUSH_MR


# -------------------------------------------------------------------------------------------------
# libibverbs: <infiniband/verbs_api.h> (#defines backed by the kernel uAPI)
# -------------------------------------------------------------------------------------------------

IBV_ADVISE_MR_ADVICE_PREFETCH: Final[int] = 0  #: ibv_advise_mr: prefetch for reading
_IBV_ADVISE_MR_ADVICE_PREFETCH: Final[int] = IBV_ADVISE_MR_ADVICE_PREFETCH  #: pyverbs spelling

IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: Final[int] = 1  #: ibv_advise_mr: prefetch for writing
#: pyverbs spelling
_IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: Final[int] = IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE

IBV_ADVISE_MR_FLAG_FLUSH: Final[int] = 1  #: ibv_advise_mr flag: wait until the advice is done
_IBV_ADVISE_MR_FLAG_FLUSH: Final[int] = IBV_ADVISE_MR_FLAG_FLUSH  #: pyverbs spelling

#: ibv_advise_mr: map only pages already present
IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: Final[int] = 2
#: pyverbs spelling
_IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: Final[int] = IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT


# -------------------------------------------------------------------------------------------------
# libibverbs: <infiniband/driver.h>
# -------------------------------------------------------------------------------------------------


class ibv_gid_type_sysfs(IntEnum):
    """GID types as spelled by the sysfs ``gid_attrs/types`` files."""

    IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0  #: "IB/RoCE v1" in sysfs
    IBV_GID_TYPE_SYSFS_ROCE_V2 = 1  #: "RoCE v2" in sysfs


IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = ibv_gid_type_sysfs.IBV_GID_TYPE_SYSFS_IB_ROCE_V1
IBV_GID_TYPE_SYSFS_ROCE_V2 = ibv_gid_type_sysfs.IBV_GID_TYPE_SYSFS_ROCE_V2


# -------------------------------------------------------------------------------------------------
# libibverbs: <infiniband/tm_types.h> (tag matching)
# -------------------------------------------------------------------------------------------------


class ibv_tmh_op(IntEnum):
    """Opcode of a tag-matching header."""

    IBV_TMH_NO_TAG = 0  #: message bypasses tag matching
    IBV_TMH_RNDV = 1  #: rendezvous: the receiver will RDMA-read the data
    IBV_TMH_FIN = 2  #: rendezvous finished
    IBV_TMH_EAGER = 3  #: data is in the message itself


IBV_TMH_NO_TAG = ibv_tmh_op.IBV_TMH_NO_TAG
IBV_TMH_RNDV = ibv_tmh_op.IBV_TMH_RNDV
IBV_TMH_FIN = ibv_tmh_op.IBV_TMH_FIN
IBV_TMH_EAGER = ibv_tmh_op.IBV_TMH_EAGER


# -------------------------------------------------------------------------------------------------
# librdmacm: <rdma/rdma_cma.h>
# -------------------------------------------------------------------------------------------------


class rdma_cm_event_type(IntEnum):
    """Connection manager event kinds."""

    RDMA_CM_EVENT_ADDR_RESOLVED = 0
    RDMA_CM_EVENT_ADDR_ERROR = 1
    RDMA_CM_EVENT_ROUTE_RESOLVED = 2
    RDMA_CM_EVENT_ROUTE_ERROR = 3
    RDMA_CM_EVENT_CONNECT_REQUEST = 4  #: passive side: a peer wants to connect
    RDMA_CM_EVENT_CONNECT_RESPONSE = 5  #: active side without a QP: the peer accepted
    RDMA_CM_EVENT_CONNECT_ERROR = 6
    RDMA_CM_EVENT_UNREACHABLE = 7  #: remote side did not answer
    RDMA_CM_EVENT_REJECTED = 8
    RDMA_CM_EVENT_ESTABLISHED = 9
    RDMA_CM_EVENT_DISCONNECTED = 10
    RDMA_CM_EVENT_DEVICE_REMOVAL = 11
    RDMA_CM_EVENT_MULTICAST_JOIN = 12
    RDMA_CM_EVENT_MULTICAST_ERROR = 13
    RDMA_CM_EVENT_ADDR_CHANGE = 14
    RDMA_CM_EVENT_TIMEWAIT_EXIT = 15  #: QP left timewait and may be reused


RDMA_CM_EVENT_ADDR_RESOLVED = rdma_cm_event_type.RDMA_CM_EVENT_ADDR_RESOLVED
RDMA_CM_EVENT_ADDR_ERROR = rdma_cm_event_type.RDMA_CM_EVENT_ADDR_ERROR
RDMA_CM_EVENT_ROUTE_RESOLVED = rdma_cm_event_type.RDMA_CM_EVENT_ROUTE_RESOLVED
RDMA_CM_EVENT_ROUTE_ERROR = rdma_cm_event_type.RDMA_CM_EVENT_ROUTE_ERROR
RDMA_CM_EVENT_CONNECT_REQUEST = rdma_cm_event_type.RDMA_CM_EVENT_CONNECT_REQUEST
RDMA_CM_EVENT_CONNECT_RESPONSE = rdma_cm_event_type.RDMA_CM_EVENT_CONNECT_RESPONSE
RDMA_CM_EVENT_CONNECT_ERROR = rdma_cm_event_type.RDMA_CM_EVENT_CONNECT_ERROR
RDMA_CM_EVENT_UNREACHABLE = rdma_cm_event_type.RDMA_CM_EVENT_UNREACHABLE
RDMA_CM_EVENT_REJECTED = rdma_cm_event_type.RDMA_CM_EVENT_REJECTED
RDMA_CM_EVENT_ESTABLISHED = rdma_cm_event_type.RDMA_CM_EVENT_ESTABLISHED
RDMA_CM_EVENT_DISCONNECTED = rdma_cm_event_type.RDMA_CM_EVENT_DISCONNECTED
RDMA_CM_EVENT_DEVICE_REMOVAL = rdma_cm_event_type.RDMA_CM_EVENT_DEVICE_REMOVAL
RDMA_CM_EVENT_MULTICAST_JOIN = rdma_cm_event_type.RDMA_CM_EVENT_MULTICAST_JOIN
RDMA_CM_EVENT_MULTICAST_ERROR = rdma_cm_event_type.RDMA_CM_EVENT_MULTICAST_ERROR
RDMA_CM_EVENT_ADDR_CHANGE = rdma_cm_event_type.RDMA_CM_EVENT_ADDR_CHANGE
RDMA_CM_EVENT_TIMEWAIT_EXIT = rdma_cm_event_type.RDMA_CM_EVENT_TIMEWAIT_EXIT


class rdma_port_space(IntEnum):
    """RDMA CM port spaces; the value is what rdma_cm sends on the wire."""

    RDMA_PS_IPOIB = 0x0002  #: IPoIB (kernel only)
    RDMA_PS_TCP = 0x0106  #: reliable connected, TCP-like; value is IPPROTO_TCP + 0x100
    RDMA_PS_UDP = 0x0111  #: datagram, UDP-like; value is IPPROTO_UDP + 0x100
    RDMA_PS_IB = 0x013F  #: any IB QP type


RDMA_PS_IPOIB = rdma_port_space.RDMA_PS_IPOIB
RDMA_PS_TCP = rdma_port_space.RDMA_PS_TCP
RDMA_PS_UDP = rdma_port_space.RDMA_PS_UDP
RDMA_PS_IB = rdma_port_space.RDMA_PS_IB

RAI_PASSIVE: Final[int] = 1  #: address is for listening
RAI_NUMERICHOST: Final[int] = 2  #: node is a numeric address; no name lookup
RAI_NOROUTE: Final[int] = 4  #: resolve the address only, not the route
RAI_FAMILY: Final[int] = 8  #: honour ai_family from the hints


class rdma_cm_join_mc_attr_mask(IntFlag, boundary=enum.KEEP):
    """Valid fields of ``rdma_cm_join_mc_attr_ex``."""

    RDMA_CM_JOIN_MC_ATTR_ADDRESS = 1 << 0
    RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS = 1 << 1


RDMA_CM_JOIN_MC_ATTR_ADDRESS = rdma_cm_join_mc_attr_mask.RDMA_CM_JOIN_MC_ATTR_ADDRESS
RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS = rdma_cm_join_mc_attr_mask.RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS


class rdma_cm_mc_join_flags(IntEnum):
    """Multicast join type; a choice, not a bit mask, despite the name."""

    RDMA_MC_JOIN_FLAG_FULLMEMBER = 0
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER = 1  #: join to send only; receive nothing


RDMA_MC_JOIN_FLAG_FULLMEMBER = rdma_cm_mc_join_flags.RDMA_MC_JOIN_FLAG_FULLMEMBER
RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER = rdma_cm_mc_join_flags.RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER

RDMA_OPTION_ID: Final[int] = 0  #: option level: the rdma_cm_id itself
RDMA_OPTION_IB: Final[int] = 1  #: option level: InfiniBand paths

RDMA_OPTION_ID_TOS: Final[int] = 0  #: option name: the type of service (uint8, RFC 2474)
RDMA_OPTION_ID_REUSEADDR: Final[int] = 1  #: option name: share a bound port (int)
RDMA_OPTION_ID_AFONLY: Final[int] = 2  #: option name: a wildcard bind is one family's (int)
RDMA_OPTION_ID_ACK_TIMEOUT: Final[int] = 3  #: option name: QP ACK timeout exponent (uint8)
RDMA_OPTION_IB_PATH: Final[int] = 1  #: option name (level IB): path records


# -------------------------------------------------------------------------------------------------
# softverbs extensions (not in verbs.h)
# -------------------------------------------------------------------------------------------------


class sv_send_flags(IntFlag, boundary=enum.KEEP):
    """softverbs-only send flags.

    They live far above every :class:`ibv_send_flags` bit, so they can be OR-ed
    into ``send_flags`` next to the standard ones without colliding.
    """

    #: write the WQE but do not ring the doorbell; softverbs' analogue of
    #: NDK_OP_FLAG_DEFER in Windows Network Direct Kernel
    IBV_SEND_DEFER = 1 << 30


IBV_SEND_DEFER = sv_send_flags.IBV_SEND_DEFER

#: IBA RNR NAK timer encoding: index = 5-bit code from ``min_rnr_timer`` or an
#: RNR NAK's AETH, value = minimum wait in microseconds.  Code 0 is the longest
#: delay (655.36 ms); codes 1..31 grow from 0.01 ms to 491.52 ms.
# fmt: off
RNR_TIMER_US: Final[tuple[float, ...]] = (
    655360.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 120.0,  # codes 0-7
    160.0, 240.0, 320.0, 480.0, 640.0, 960.0, 1280.0, 1920.0,  # codes 8-15
    2560.0, 3840.0, 5120.0, 7680.0, 10240.0, 15360.0, 20480.0, 30720.0,  # codes 16-23
    40960.0, 61440.0, 81920.0, 122880.0, 163840.0, 245760.0, 327680.0, 491520.0,  # codes 24-31
)
# fmt: on

#: The ``struct ibv_qp_attr`` field each ``ibv_qp_attr_mask`` bit names, for the
#: bits that name one field (``IBV_QP_ALT_PATH`` and ``IBV_QP_CAP`` name groups):
#: what a modify sends, a query reports and a CM answer carries, spelled once.
QP_ATTR_MASK: Final[dict[str, ibv_qp_attr_mask]] = {
    "qp_state": IBV_QP_STATE, "cur_qp_state": IBV_QP_CUR_STATE,
    "en_sqd_async_notify": IBV_QP_EN_SQD_ASYNC_NOTIFY, "qp_access_flags": IBV_QP_ACCESS_FLAGS,
    "pkey_index": IBV_QP_PKEY_INDEX, "port_num": IBV_QP_PORT, "qkey": IBV_QP_QKEY,
    "ah_attr": IBV_QP_AV, "path_mtu": IBV_QP_PATH_MTU, "timeout": IBV_QP_TIMEOUT,
    "retry_cnt": IBV_QP_RETRY_CNT, "rnr_retry": IBV_QP_RNR_RETRY, "rq_psn": IBV_QP_RQ_PSN,
    "max_rd_atomic": IBV_QP_MAX_QP_RD_ATOMIC, "min_rnr_timer": IBV_QP_MIN_RNR_TIMER,
    "sq_psn": IBV_QP_SQ_PSN, "max_dest_rd_atomic": IBV_QP_MAX_DEST_RD_ATOMIC,
    "path_mig_state": IBV_QP_PATH_MIG_STATE, "dest_qp_num": IBV_QP_DEST_QPN,
    "rate_limit": IBV_QP_RATE_LIMIT,
}  # fmt: skip

_MTU_BYTES: Final[dict[ibv_mtu, int]] = {m: 128 << m.value for m in ibv_mtu}
_BYTES_MTU: Final[dict[int, ibv_mtu]] = {n: m for m, n in _MTU_BYTES.items()}


def mtu_to_bytes(mtu: int) -> int:
    """Return the size in bytes of an :class:`ibv_mtu` code (``IBV_MTU_1024`` -> 1024).

    Raises :class:`ValueError` for anything that is not one of the five codes.
    """
    if isinstance(mtu, bool) or not isinstance(mtu, int) or mtu not in _MTU_BYTES:
        raise ValueError(f"not an ibv_mtu code: {mtu!r}")
    return _MTU_BYTES[ibv_mtu(mtu)]


def bytes_to_mtu(n: int) -> ibv_mtu:
    """Return the :class:`ibv_mtu` code for exactly 256, 512, 1024, 2048 or 4096 bytes.

    Other sizes raise :class:`ValueError`; no rounding is done.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n not in _BYTES_MTU:
        raise ValueError(f"not an IB MTU size in bytes: {n!r} (want 256..4096, a power of two)")
    return _BYTES_MTU[n]
