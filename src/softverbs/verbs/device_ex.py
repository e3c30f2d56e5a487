"""Extended device queries: ``ibv_query_device_ex`` and the GID table.

:func:`device_attr_ex` reports what a softverbs device really has, so that a
program (rdma-core's tests first of all) picks the paths it can take and
skips the others:

* on-demand paging (:data:`ODP_TRANSPORT_CAPS`): softverbs never pins
  memory.  Every access the device makes goes through the process's own page
  tables at the moment it happens, so a page dropped with ``madvise`` is
  simply faulted in again -- which is what ODP means.  RC, UD, UC and XRC
  report send, receive, write, read, atomic and SRQ receive; implicit ODP
  (one key for the whole address space) is supported too.
* device memory: ``max_dm_size`` bytes of memory owned by the device
  (:mod:`softverbs.verbs.dm`).
* no TSO, RSS, receive WQs, packet pacing, raw packet offloads, tag
  matching, CQ moderation or hardware clock: every cap for them is 0, as on a
  device without them, and the verbs that need them fail with EOPNOTSUPP.

GID entries follow ``struct ibv_gid_entry``: the GID's two 64-bit halves are
given as pyverbs gives them (the big-endian field read as a native integer,
see :mod:`softverbs.verbs.strings`), and ``gid_type`` is ``ibv_gid_type``
(RoCE v2 for every softverbs GID).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields

from softverbs.enums import (
    IBV_ODP_SUPPORT,
    IBV_ODP_SUPPORT_ATOMIC,
    IBV_ODP_SUPPORT_IMPLICIT,
    IBV_ODP_SUPPORT_READ,
    IBV_ODP_SUPPORT_RECV,
    IBV_ODP_SUPPORT_SEND,
    IBV_ODP_SUPPORT_SRQ_RECV,
    IBV_ODP_SUPPORT_WRITE,
)
from softverbs.verbs.base import PyverbsObject
from softverbs.verbs.strings import gid_str, str_from_flags

#: What an ODP MR supports on each transport (ibv_odp_transport_cap_bits).
ODP_TRANSPORT_CAPS = int(
    IBV_ODP_SUPPORT_SEND
    | IBV_ODP_SUPPORT_RECV
    | IBV_ODP_SUPPORT_WRITE
    | IBV_ODP_SUPPORT_READ
    | IBV_ODP_SUPPORT_ATOMIC
    | IBV_ODP_SUPPORT_SRQ_RECV
)
ODP_GENERAL_CAPS = int(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT)


def _fmt(obj: object) -> str:
    return "".join(f"{f.name:<28}: {getattr(obj, f.name)}\n" for f in fields(obj))  # type: ignore[arg-type]


class QueryDeviceExInput(PyverbsObject):
    """``ibv_query_device_ex_input``: a ``comp_mask`` for future extensions."""

    def __init__(self, comp_mask: int = 0) -> None:
        super().__init__()
        self.comp_mask = comp_mask


@dataclass(slots=True)
class ODPCaps:
    """``ibv_odp_caps`` (and the separate ``xrc_odp_caps``)."""

    general_caps: int = 0
    rc_odp_caps: int = 0
    uc_odp_caps: int = 0
    ud_odp_caps: int = 0
    xrc_odp_caps: int = 0

    def __str__(self) -> str:
        from softverbs.enums import ibv_odp_general_caps, ibv_odp_transport_cap_bits

        general = {int(m): str(m.name) for m in ibv_odp_general_caps}
        per = {int(m): str(m.name) for m in ibv_odp_transport_cap_bits}
        f = "{}: {}\n"
        return (f.format("ODP General caps", str_from_flags(self.general_caps, general))
                + f.format("RC ODP caps", str_from_flags(self.rc_odp_caps, per))
                + f.format("UD ODP caps", str_from_flags(self.ud_odp_caps, per))
                + f.format("UC ODP caps", str_from_flags(self.uc_odp_caps, per))
                + f.format("XRC ODP caps", str_from_flags(self.xrc_odp_caps, per)))  # fmt: skip


@dataclass(slots=True)
class PCIAtomicCaps:
    fetch_add: int = 0
    swap: int = 0
    compare_swap: int = 0


@dataclass(slots=True)
class TSOCaps:
    max_tso: int = 0
    supported_qpts: int = 0


@dataclass(slots=True)
class RSSCaps:
    supported_qpts: int = 0
    max_rwq_indirection_tables: int = 0
    rx_hash_fields_mask: int = 0
    rx_hash_function: int = 0
    max_rwq_indirection_table_size: int = 0


@dataclass(slots=True)
class PacketPacingCaps:
    qp_rate_limit_min: int = 0
    qp_rate_limit_max: int = 0
    supported_qpts: int = 0


@dataclass(slots=True)
class TMCaps:
    max_rndv_hdr_size: int = 0
    max_num_tags: int = 0
    flags: int = 0
    max_ops: int = 0
    max_sge: int = 0


@dataclass(slots=True)
class CQModerationCaps:
    max_cq_count: int = 0
    max_cq_period: int = 0


@dataclass(slots=True)
class DeviceAttrEx:
    """``ibv_device_attr_ex`` (``Context.query_device_ex``)."""

    orig_attr: object
    comp_mask: int = 0
    odp_caps: ODPCaps = field(default_factory=ODPCaps)
    completion_timestamp_mask: int = 0
    hca_core_clock: int = 0
    device_cap_flags_ex: int = 0
    tso_caps: TSOCaps = field(default_factory=TSOCaps)
    rss_caps: RSSCaps = field(default_factory=RSSCaps)
    max_wq_type_rq: int = 0
    packet_pacing_caps: PacketPacingCaps = field(default_factory=PacketPacingCaps)
    raw_packet_caps: int = 0
    tm_caps: TMCaps = field(default_factory=TMCaps)
    cq_mod_caps: CQModerationCaps = field(default_factory=CQModerationCaps)
    max_dm_size: int = 0
    pci_atomic_caps: PCIAtomicCaps = field(default_factory=PCIAtomicCaps)
    xrc_odp_caps: int = 0
    phys_port_cnt_ex: int = 1

    def __str__(self) -> str:
        return _fmt(self)


def soft_odp_caps() -> ODPCaps:
    caps = ODP_TRANSPORT_CAPS
    return ODPCaps(ODP_GENERAL_CAPS, caps, caps, caps, caps)


class GIDEntry(PyverbsObject):
    """``ibv_gid_entry``: a GID with its index, port, type and netdev."""

    def __init__(self, subnet_prefix: int = 0, interface_id: int = 0, gid_index: int = 0,
                 port_num: int = 0, gid_type: int = 0, ndev_ifindex: int = 0) -> None:  # fmt: skip
        super().__init__()
        self._subnet_prefix = subnet_prefix
        self._interface_id = interface_id
        self._gid_index = gid_index
        self._port_num = port_num
        self._gid_type = gid_type
        self._ndev_ifindex = ndev_ifindex

    @classmethod
    def from_raw(cls, raw: bytes, gid_index: int, port_num: int, gid_type: int,
                 ndev_ifindex: int) -> GIDEntry:  # fmt: skip
        """An entry for the 16 GID bytes ``raw``."""
        return cls(int.from_bytes(raw[:8], sys.byteorder), int.from_bytes(raw[8:16], sys.byteorder),
                   gid_index, port_num, gid_type, ndev_ifindex)  # fmt: skip

    @property
    def gid_subnet_prefix(self) -> int:
        return self._subnet_prefix

    @property
    def gid_interface_id(self) -> int:
        return self._interface_id

    @property
    def gid_index(self) -> int:
        return self._gid_index

    @property
    def port_num(self) -> int:
        return self._port_num

    @property
    def gid_type(self) -> int:
        return self._gid_type

    @property
    def ndev_ifindex(self) -> int:
        return self._ndev_ifindex

    def gid_str(self) -> str:
        return gid_str(self._subnet_prefix, self._interface_id)

    def __str__(self) -> str:
        from softverbs.verbs.strings import translate_gid_type

        f = "{:<24}: {:<20}\n"
        return (f.format("GID", self.gid_str()) + f.format("GID Index", self.gid_index)
                + f.format("Port number", self.port_num)
                + f.format("GID type", translate_gid_type(self.gid_type))
                + f.format("Ndev ifindex", self.ndev_ifindex))  # fmt: skip


class FdArr(PyverbsObject):
    """``ibv_fd_arr``: a list of file descriptors (for vendor context attributes)."""

    def __init__(self, arr: list[int] | None = None, count: int = 0) -> None:
        from softverbs.errors import PyverbsUserError
        from softverbs.verbs.base import as_int

        super().__init__()
        if arr is not None and not isinstance(arr, (list, tuple)):
            raise PyverbsUserError(f"arr must be a list of fds, got {type(arr).__name__}")
        fds = [as_int(fd, "fd") for fd in arr or []]
        if not 0 <= as_int(count, "count") <= len(fds):
            raise PyverbsUserError(f"count {count} does not fit the {len(fds)} descriptors given")
        self._fds = fds[:count]

    @property
    def arr(self) -> list[int]:
        return list(self._fds)

    def close(self) -> None:
        self._fds = []

    def __str__(self) -> str:
        f = "{:20}: {:<20}\n"
        return f.format("Number of fd in arr", len(self._fds)) + f.format("FDs in arr", self._fds)
