"""Verbs values as text, the way pyverbs prints them.

pyverbs programs print device, port, QP and completion attributes through a
family of small helpers: ``translate_mtu`` and ``speed_to_str`` in
``pyverbs.device``, ``cqe_status_to_str`` in ``pyverbs.cq``,
``qp_state_to_str`` and ``gid_str`` in ``pyverbs.utils``, and so on.
softverbs keeps all of them in this one module, and
``softverbs.compat.pyverbs`` re-exports each one from the module where
pyverbs has it. The texts, including the fallbacks for unknown values
("Invalid ...", "Unknown ..."), are pyverbs' own, so output compares equal.
There are two exceptions:

* :func:`translate_event_type` returns the plain member name for every
  event. pyverbs puts a stray leading dot in front of one of them.
* :func:`qp_state_to_str` names the unknown value in its fallback.

Flag helpers list the set bits in the order the enum defines them, which is
the order of verbs.h.

Byte order. Some ``ibv_*`` fields are big-endian (``__be64``). pyverbs hands
them out exactly as a native integer read of those bytes would give them.
:func:`be64toh` turns such a value back into the natural number, and
:func:`gid_str` and :func:`guid_format` expect values in that raw form.
(:func:`softverbs.verbs.addr.gid_str`, in contrast, takes the 16 GID bytes.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from enum import Enum

from softverbs.enums import (
    IBV_WC_BAD_RESP_ERR,
    IBV_WC_FATAL_ERR,
    IBV_WC_GENERAL_ERR,
    IBV_WC_INV_EEC_STATE_ERR,
    IBV_WC_INV_EECN_ERR,
    IBV_WC_LOC_ACCESS_ERR,
    IBV_WC_LOC_EEC_OP_ERR,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_LOC_RDD_VIOL_ERR,
    IBV_WC_MW_BIND_ERR,
    IBV_WC_REM_ABORT_ERR,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_INV_RD_REQ_ERR,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_REM_OP_ERR,
    IBV_WC_RESP_TIMEOUT_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
    ibv_create_cq_wc_flags,
    ibv_device_cap_flags,
    ibv_event_type,
    ibv_gid_type,
    ibv_port_cap_flags,
    ibv_port_cap_flags2,
    ibv_rereg_mr_err_code,
)
from softverbs.errors import PyverbsUserError

# --- byte order and GIDs (pyverbs.utils) ---------------------------------------------------------


def be64toh(num: int) -> int:
    """The natural value of a ``__be64`` field that was read as a native integer."""
    return int.from_bytes(num.to_bytes(8, sys.byteorder), "big")


def _words(hex32: str) -> str:
    return ":".join(hex32[i : i + 4] for i in range(0, len(hex32), 4))


def gid_str(subnet_prefix: int, interface_id: int) -> str:
    """The 8-word text of a GID, given its two raw ``__be64`` halves."""
    return _words(f"{be64toh(subnet_prefix):016x}{be64toh(interface_id):016x}")


def gid_str_to_array(val: str) -> list[str]:
    """Split 'xxxx:...:xxxx' (8 words) into its 16 bytes as 2-digit hex strings."""
    words = val.split(":")
    if len(words) != 8 or any(len(w) != 4 for w in words):
        raise PyverbsUserError(f"Invalid GID value ({words})")
    int("".join(words), 16)  # reject non-hex digits with ValueError, as pyverbs does
    return [w[i : i + 2] for w in words for i in (0, 2)]


def guid_format(num: int) -> str:
    """A raw ``__be64`` GUID as 'xxxx:xxxx:xxxx:xxxx'."""
    return _words(f"{be64toh(num):016x}")


def guid_to_hex(node_guid: int) -> str:
    """A GUID as bare hex digits, without the '0x'."""
    return f"{node_guid:x}"


# --- generic flag and table helpers --------------------------------------------------------------


def flags_to_str(flags: int, dictionary: Mapping[int, str]) -> str:
    """The names of the set bits, each followed by a space."""
    return "".join(name + " " for bit, name in dictionary.items() if flags & bit)


def str_from_flags(flags: int, dictionary: Mapping[int, str]) -> str:
    """The names of the set bits as an indented list, one per line."""
    return "\n  " + "".join(name + "\n  " for bit, name in dictionary.items() if flags & bit)


def _member_names(members: Iterable[Enum]) -> dict[int, str]:
    return {int(m.value): m.name for m in members}


def _lookup(table: Mapping[int, str], value: int, fallback: str) -> str:
    return table.get(value, fallback)


def _numbered(table: Mapping[int, str], value: int, invalid: str) -> str:
    """'<text> (<value>)', the form pyverbs uses for port attributes."""
    text = table.get(value)
    return invalid if text is None else f"{text} ({value})"


# --- device and port (pyverbs.device) ------------------------------------------------------------

_GID_TYPES: dict[int, str] = {
    ibv_gid_type.IBV_GID_TYPE_IB: "IB",
    ibv_gid_type.IBV_GID_TYPE_ROCE_V1: "RoCEv1",
    ibv_gid_type.IBV_GID_TYPE_ROCE_V2: "RoCEv2",
}
_TRANSPORTS = {0: "IB", 1: "IWARP", 2: "USNIC", 3: "USNIC UDP"}
_NODE_TYPES = {1: "CA", 2: "Switch", 3: "Router", 4: "RNIC", 5: "USNIC", 6: "USNIC UDP"}
_PORT_STATES = {0: "NOP", 1: "Down", 2: "Init", 3: "Armed", 4: "Active", 5: "Defer"}
_MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
_LINK_LAYERS = {0: "Unspecified", 1: "InfiniBand", 2: "Ethernet"}
_PHYS_STATES = {
    1: "Sleep", 2: "Polling", 3: "Disabled", 4: "Port configuration training",
    5: "Link up", 6: "Link error recovery", 7: "Phy test",
}  # fmt: skip
_WIDTHS = {1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
#: IBA PortInfo ActiveSpeed codes (ActiveSpeedEx when that is non-zero), per lane
_SPEEDS = {
    0: "0.0 Gbps", 1: "2.5 Gbps", 2: "5.0 Gbps", 4: "5.0 Gbps", 8: "10.0 Gbps",
    16: "14.0 Gbps", 32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps", 256: "200.0 Gbps",
}  # fmt: skip


def translate_gid_type(gid_type: int) -> str:
    return _lookup(_GID_TYPES, gid_type, f"Unknown gid_type ({gid_type})")


def translate_transport_type(transport_type: int) -> str:
    return _lookup(_TRANSPORTS, transport_type, "Unknown")


def translate_node_type(node_type: int) -> str:
    return _lookup(_NODE_TYPES, node_type, "Unknown")


def port_state_to_str(port_state: int) -> str:
    return _numbered(_PORT_STATES, port_state, f"Invalid state ({port_state})")


def translate_mtu(mtu: int) -> str:
    text = _MTU_BYTES.get(mtu)
    return f"Invalid MTU ({mtu})" if text is None else f"{text} ({mtu})"


def translate_link_layer(ll: int) -> str:
    return _lookup(_LINK_LAYERS, ll, f"Invalid link layer ({ll})")


def translate_port_cap_flags(flags: int) -> str:
    return str_from_flags(flags, _member_names(ibv_port_cap_flags.__members__.values()))


def translate_port_cap_flags2(flags: int) -> str:
    return str_from_flags(flags, _member_names(ibv_port_cap_flags2.__members__.values()))


def translate_device_caps(flags: int) -> str:
    return str_from_flags(flags, _member_names(ibv_device_cap_flags.__members__.values()))


def phys_state_to_str(phys: int) -> str:
    return _numbered(_PHYS_STATES, phys, "Invalid physical state")


def width_to_str(width: int) -> str:
    return _numbered(_WIDTHS, width, "Invalid width")


def speed_to_str(active_speed: int, active_speed_ex: int = 0) -> str:
    # pyverbs 59 takes both codes, rdma-core 44's pyverbs only active_speed;
    # a port that reports an extended speed code means that one
    speed = active_speed_ex or active_speed
    return _numbered(_SPEEDS, speed, "Invalid speed")


def translate_event_type(event_type: int) -> str:
    names = _member_names(ibv_event_type.__members__.values())
    return _lookup(names, event_type, f"Unknown event_type ({event_type})")


# --- completions (pyverbs.cq) --------------------------------------------------------------------

#: pyverbs' CQE status texts (they differ from libibverbs' ibv_wc_status_str)
_CQE_STATUS: dict[int, str] = {
    IBV_WC_SUCCESS: "success",
    IBV_WC_LOC_LEN_ERR: "local length error",
    IBV_WC_LOC_QP_OP_ERR: "local QP op error",
    IBV_WC_LOC_EEC_OP_ERR: "local EEC op error",
    IBV_WC_LOC_PROT_ERR: "local protection error",
    IBV_WC_WR_FLUSH_ERR: "WR flush error",
    IBV_WC_MW_BIND_ERR: "memory window bind error",
    IBV_WC_BAD_RESP_ERR: "bad response error",
    IBV_WC_LOC_ACCESS_ERR: "local access error",
    IBV_WC_REM_INV_REQ_ERR: "remote invalidate request error",
    IBV_WC_REM_ACCESS_ERR: "remote access error",
    IBV_WC_REM_OP_ERR: "remote op error",
    IBV_WC_RETRY_EXC_ERR: "retry exceeded error",
    IBV_WC_RNR_RETRY_EXC_ERR: "RNR retry exceeded",
    IBV_WC_LOC_RDD_VIOL_ERR: "local RDD violation error",
    IBV_WC_REM_INV_RD_REQ_ERR: "remote invalidate RD request error",
    IBV_WC_REM_ABORT_ERR: "remote abort error",
    IBV_WC_INV_EECN_ERR: "invalidate EECN error",
    IBV_WC_INV_EEC_STATE_ERR: "invalidate EEC state error",
    IBV_WC_FATAL_ERR: "WC fatal error",
    IBV_WC_RESP_TIMEOUT_ERR: "response timeout error",
    IBV_WC_GENERAL_ERR: "general error",
}
_CQE_OPCODES = {
    0x0: "Send", 0x1: "RDMA write", 0x2: "RDMA read", 0x3: "Compare and swap",
    0x4: "Fetch and add", 0x5: "Bind Memory window", 0x6: "Local invalidate", 0x7: "TSO",
    0x80: "Receive", 0x81: "Receive RDMA with immediate", 0x82: "Tag matching - add",
    0x83: "Tag matching - delete", 0x84: "Tag matching - sync", 0x85: "Tag matching - receive",
    0x86: "Tag matching - no tag", 0x87: "Driver WR",
}  # fmt: skip
_CQE_FLAGS = {
    1: "GRH", 2: "With immediate", 4: "IP csum OK", 8: "With invalidate",
    16: "TM sync request", 32: "TM match", 64: "TM data valid",
}  # fmt: skip


def cqe_status_to_str(status: int) -> str:
    return _lookup(_CQE_STATUS, status, "Unknown CQE status")


def cqe_opcode_to_str(opcode: int) -> str:
    return _lookup(_CQE_OPCODES, opcode, f"Unknown CQE opcode {opcode}")


def cqe_flags_to_str(flags: int) -> str:
    return flags_to_str(flags, _CQE_FLAGS)


def create_wc_flags_to_str(flags: int) -> str:
    return flags_to_str(flags, _member_names(ibv_create_cq_wc_flags.__members__.values()))


# --- memory windows (pyverbs.mr) -----------------------------------------------------------------


def mwtype2str(mw_type: int) -> str:
    return _lookup({1: "IBV_MW_TYPE_1", 2: "IBV_MW_TYPE_2"}, mw_type,
                   f"Unknown MW type ({mw_type})")  # fmt: skip


# --- QPs and MRs (pyverbs.utils) -----------------------------------------------------------------

_QP_TYPES = {2: "RC", 3: "UC", 4: "UD", 8: "Raw Packet", 9: "XRCD_SEND", 10: "XRCD_RECV",
             0xFF: "Driver QP"}  # fmt: skip
_QP_STATES = {0: "Reset", 1: "Init", 2: "RTR", 3: "RTS", 4: "SQD", 5: "SQE", 6: "Error",
              7: "Unknown"}  # fmt: skip
_ACCESS = {1: "Local write", 2: "Remote write", 4: "Remote read", 8: "Remote atomic",
           16: "MW bind", 32: "Zero based", 64: "On demand"}  # fmt: skip
_MIG_STATES = {0: "Migrated", 1: "Re-arm", 2: "Armed"}


def qp_type_to_str(qp_type: int) -> str:
    return _lookup(_QP_TYPES, qp_type, f"Unknown ({qp_type})")


def qp_state_to_str(qp_state: int) -> str:
    return _lookup(_QP_STATES, qp_state, f"Unknown ({qp_state})")


def mtu_to_str(mtu: int) -> int:
    """The MTU in bytes, 0 if ``mtu`` is not an ``ibv_mtu`` code.

    Despite its name it returns a number, as pyverbs' helper does.
    """
    return _MTU_BYTES.get(mtu, 0)


def access_flags_to_str(flags: int) -> str:
    return flags_to_str(flags, _ACCESS)


def mig_state_to_str(mig: int) -> str:
    return _lookup(_MIG_STATES, mig, f"Unknown ({mig})")


def rereg_error_to_str(error: int) -> str:
    names = _member_names(ibv_rereg_mr_err_code.__members__.values())
    return _lookup(names, error, f"Unknown error ({error})")
