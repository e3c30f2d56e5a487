"""Flow steering (pyverbs ``flow`` and ``spec``): ``ibv_create_flow``.

Flow steering matches raw Ethernet/IP/TCP/UDP headers of incoming packets
and steers them to a QP.  softverbs carries RDMA traffic only: it has no raw
packet QPs and does not parse the headers flows match on, so ``Flow``
creation fails with EOPNOTSUPP, as ``ibv_create_flow`` does on a device
without steering.  The spec and attribute objects are complete (they hold
and print the values a program sets), so building them works everywhere.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from softverbs.enums import (
    IBV_FLOW_ATTR_NORMAL,
    IBV_FLOW_SPEC_ETH,
    IBV_FLOW_SPEC_INNER,
    IBV_FLOW_SPEC_IPV4_EXT,
    IBV_FLOW_SPEC_IPV6,
    IBV_FLOW_SPEC_TCP,
    IBV_FLOW_SPEC_UDP,
)
from softverbs.errors import PyverbsError, PyverbsUserError, eopnotsupp
from softverbs.verbs.base import PyverbsCM, PyverbsObject, require
from softverbs.verbs.qp import QP

_TYPE_NAMES = {
    int(IBV_FLOW_SPEC_ETH): "IBV_FLOW_SPEC_ETH",
    int(IBV_FLOW_SPEC_IPV4_EXT): "IBV_FLOW_SPEC_IPV4_EXT",
    int(IBV_FLOW_SPEC_IPV6): "IBV_FLOW_SPEC_IPV6",
    int(IBV_FLOW_SPEC_TCP): "IBV_FLOW_SPEC_TCP",
    int(IBV_FLOW_SPEC_UDP): "IBV_FLOW_SPEC_UDP",
}


class Spec(PyverbsObject):
    """Base of the flow specs: a type, a size, and value/mask pairs."""

    spec_type: int = 0
    size: int = 0

    @staticmethod
    def type_to_str(spec_type: int) -> str:
        out = "IBV_FLOW_SPEC_INNER " if spec_type & IBV_FLOW_SPEC_INNER else ""
        base = spec_type & ~IBV_FLOW_SPEC_INNER
        if base not in _TYPE_NAMES:
            raise PyverbsError(f"This type {base} is not implemented yet")
        return out + _TYPE_NAMES[base]

    @staticmethod
    def _set_val_mask(default_mask: Any, val: Any = None, val_mask: Any = None) -> tuple[Any, Any]:
        """A value given without a mask gets ``default_mask``; no value: (0, 0)."""
        if val is None:
            return 0, 0
        return val, default_mask if val_mask is None else val_mask

    def _init(self, spec_type: int, size: int, is_inner: int) -> None:
        PyverbsObject.__init__(self)
        self.spec_type = spec_type | (IBV_FLOW_SPEC_INNER if is_inner else 0)
        self.size = size

    def __str__(self) -> str:
        return f"{'Spec type':<16}: {self.type_to_str(self.spec_type):<20}\n" \
               f"{'Size':<16}: {self.size:<20}\n"


def _mac(val: Any) -> str:
    if val in (0, None, ""):
        return "00:00:00:00:00:00"
    if not isinstance(val, str) or len(val.split(":")) != 6:
        raise PyverbsUserError(f"Invalid MAC address {val!r}: expected 'xx:xx:xx:xx:xx:xx'")
    try:
        return ":".join(f"{int(b, 16):02x}" for b in val.split(":"))
    except ValueError:
        raise PyverbsUserError(f"Invalid MAC address {val!r}") from None


def _ip(val: Any, version: int) -> str:
    if val in (0, None, ""):
        return "0.0.0.0" if version == 4 else "::"
    try:
        ip = ipaddress.ip_address(val)
    except ValueError:
        raise PyverbsUserError(f"Invalid IPv{version} address {val!r}") from None
    if ip.version != version:
        raise PyverbsUserError(f"{val!r} is not an IPv{version} address")
    return str(ip)


class EthSpec(Spec):
    """``ibv_flow_spec_eth``."""

    MAC_MASK = "ff:ff:ff:ff:ff:ff"

    def __init__(self, dst_mac: str | None = None, dst_mac_mask: str | None = None,
                 src_mac: str | None = None, src_mac_mask: str | None = None,
                 ether_type: int | None = None, ether_type_mask: int | None = None,
                 vlan_tag: int | None = None, vlan_tag_mask: int | None = None,
                 is_inner: int = 0) -> None:  # fmt: skip
        self._init(IBV_FLOW_SPEC_ETH, 40, is_inner)
        dm, dmm = self._set_val_mask(self.MAC_MASK, dst_mac, dst_mac_mask)
        sm, smm = self._set_val_mask(self.MAC_MASK, src_mac, src_mac_mask)
        self.dst_mac, self.dst_mac_mask = _mac(dm), _mac(dmm)
        self.src_mac, self.src_mac_mask = _mac(sm), _mac(smm)
        self.ether_type, self.ether_type_mask = self._set_val_mask(0xFFFF, ether_type,
                                                                   ether_type_mask)  # fmt: skip
        self.vlan_tag, self.vlan_tag_mask = self._set_val_mask(0xFFFF, vlan_tag, vlan_tag_mask)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("dst_mac", "dst_mac_mask", "src_mac", "src_mac_mask"):
            value = _mac(value)
        object.__setattr__(self, name, value)


class Ipv4ExtSpec(Spec):
    """``ibv_flow_spec_ipv4_ext``."""

    def __init__(self, dst_ip: str | None = None, dst_ip_mask: str | None = None,
                 src_ip: str | None = None, src_ip_mask: str | None = None,
                 proto: int | None = None, proto_mask: int | None = None,
                 tos: int | None = None, tos_mask: int | None = None,
                 ttl: int | None = None, ttl_mask: int | None = None,
                 flags: int | None = None, flags_mask: int | None = None,
                 is_inner: int = 0) -> None:  # fmt: skip
        self._init(IBV_FLOW_SPEC_IPV4_EXT, 24, is_inner)
        d, dm = self._set_val_mask("255.255.255.255", dst_ip, dst_ip_mask)
        s, sm = self._set_val_mask("255.255.255.255", src_ip, src_ip_mask)
        self.dst_ip, self.dst_ip_mask = _ip(d, 4), _ip(dm, 4)
        self.src_ip, self.src_ip_mask = _ip(s, 4), _ip(sm, 4)
        self.proto, self.proto_mask = self._set_val_mask(0xFF, proto, proto_mask)
        self.tos, self.tos_mask = self._set_val_mask(0xFF, tos, tos_mask)
        self.ttl, self.ttl_mask = self._set_val_mask(0xFF, ttl, ttl_mask)
        self.flags, self.flags_mask = self._set_val_mask(0xFF, flags, flags_mask)


class Ipv6Spec(Spec):
    """``ibv_flow_spec_ipv6``."""

    def __init__(self, dst_ip: str | None = None, dst_ip_mask: str | None = None,
                 src_ip: str | None = None, src_ip_mask: str | None = None,
                 flow_label: int | None = None, flow_label_mask: int | None = None,
                 next_hdr: int | None = None, next_hdr_mask: int | None = None,
                 traffic_class: int | None = None, traffic_class_mask: int | None = None,
                 hop_limit: int | None = None, hop_limit_mask: int | None = None,
                 is_inner: int = 0) -> None:  # fmt: skip
        self._init(IBV_FLOW_SPEC_IPV6, 88, is_inner)
        full = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        d, dm = self._set_val_mask(full, dst_ip, dst_ip_mask)
        s, sm = self._set_val_mask(full, src_ip, src_ip_mask)
        self.dst_ip, self.dst_ip_mask = _ip(d, 6), _ip(dm, 6)
        self.src_ip, self.src_ip_mask = _ip(s, 6), _ip(sm, 6)
        self.flow_label, self.flow_label_mask = self._set_val_mask(0xFFFFF, flow_label,
                                                                   flow_label_mask)  # fmt: skip
        self.next_hdr, self.next_hdr_mask = self._set_val_mask(0xFF, next_hdr, next_hdr_mask)
        self.traffic_class, self.traffic_class_mask = self._set_val_mask(
            0xFF, traffic_class, traffic_class_mask)  # fmt: skip
        self.hop_limit, self.hop_limit_mask = self._set_val_mask(0xFF, hop_limit, hop_limit_mask)


class TcpUdpSpec(Spec):
    """``ibv_flow_spec_tcp_udp``: ``TcpUdpSpec(IBV_FLOW_SPEC_TCP | _UDP, ...)``."""

    def __init__(self, spec_type: int, dst_port: int | None = None,
                 dst_port_mask: int | None = None, src_port: int | None = None,
                 src_port_mask: int | None = None, is_inner: int = 0) -> None:  # fmt: skip
        if spec_type not in (IBV_FLOW_SPEC_TCP, IBV_FLOW_SPEC_UDP):
            raise PyverbsError("Spec type must be IBV_FLOW_SPEC_TCP or IBV_FLOW_SPEC_UDP")
        self._init(spec_type, 16, is_inner)
        self.dst_port, self.dst_port_mask = self._set_val_mask(0xFFFF, dst_port, dst_port_mask)
        self.src_port, self.src_port_mask = self._set_val_mask(0xFFFF, src_port, src_port_mask)


class FlowAttr(PyverbsObject):
    """``ibv_flow_attr``; append specs to ``specs``."""

    def __init__(self, num_of_specs: int = 0, flow_type: int = IBV_FLOW_ATTR_NORMAL,
                 priority: int = 0, port: int = 1, flags: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.num_of_specs = num_of_specs
        self.type = flow_type
        self.priority = priority
        self.port = port
        self.flags = flags
        self.specs: list[Spec] = []


class FlowAction(PyverbsObject):
    """``ibv_flow_action``: base of the (vendor) flow actions."""


class Flow(PyverbsCM):
    """A steering flow: ``Flow(qp, FlowAttr(...))`` -- EOPNOTSUPP on softverbs."""

    def __init__(self, qp: Any, flow_attr: FlowAttr) -> None:
        super().__init__()
        require(qp, QP, "qp")
        require(flow_attr, FlowAttr, "flow_attr")
        raise eopnotsupp("Flow creation failed: softverbs devices do not steer raw packet "
                         "traffic (there are no raw packet QPs)")  # fmt: skip
