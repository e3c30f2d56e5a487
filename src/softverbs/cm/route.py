"""Addresses and routes for the CM: which device owns an IP, and how to reach one.

What the kernel's rdma_cm asks of the IP stack (``rdma_resolve_addr``,
``rdma_bind_addr``): a device's addresses come from its spec (a UDP link's
netdev, or the in-process device's identities) or, once it is open, from its
GID table; a destination's source address from the host's routing table
(``ip route get``).  :class:`Router` answers for one world of devices.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import subprocess
from collections.abc import Callable
from typing import Any, Protocol

from softverbs.errors import PyverbsRDMAError
from softverbs.wire.packet import IPV4_MAPPED_PREFIX


def cm_error(msg: str, code: int) -> PyverbsRDMAError:
    return PyverbsRDMAError(msg, code)


class World(Protocol):
    """The devices an agent serves: names, specs, and opening one."""

    def specs(self) -> list[Any]: ...
    def open(self, name: str) -> Any: ...


def gid_of(ip: bytes) -> bytes:
    return IPV4_MAPPED_PREFIX + ip if len(ip) == 4 else ip


def ip_of(gid: bytes) -> bytes:
    return gid[12:] if gid[:12] == IPV4_MAPPED_PREFIX else gid


def is_any(ip: bytes) -> bool:
    return not any(ip)


def is_wildcard(ip: bytes, dev: str | None) -> bool:
    """Does a CM ID bound to ``ip`` (on device ``dev``) stand for every address?

    The zero address does; so does a loopback address (127.0.0.0/8, ``::1``)
    that bound no device. The kernel's ``cma_any_addr`` counts loopback as
    "any": ``rdma_bind_addr(127.0.0.1)`` acquires no device, the listener
    listens on every device and takes a request for any address."""
    return is_any(ip) or (dev is None and ipaddress.ip_address(ip).is_loopback)


def host_owns(ip: bytes) -> bool:
    """Is ``ip`` an address of this host (can a socket bind it)?"""
    fam = socket.AF_INET if len(ip) == 4 else socket.AF_INET6
    with socket.socket(fam, socket.SOCK_DGRAM) as s:
        try:
            s.bind((str(ipaddress.ip_address(ip)), 0))
        except OSError:
            return False
    return True


def route_source(dst: bytes) -> bytes | None:
    """The source address the host's routing table picks for ``dst``."""
    try:
        out = subprocess.run(["ip", "-j", "route", "get", str(ipaddress.ip_address(dst))],
                             capture_output=True, text=True, check=True, timeout=10).stdout
        src = json.loads(out)[0].get("prefsrc")
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError):
        return None  # fmt: skip
    return ipaddress.ip_address(src).packed if src else None


def spec_ips(spec: Any) -> list[bytes]:
    """The IP addresses a device spec will have, without opening it."""
    from softverbs.fabric.udp import explicit_addresses, netdev_addresses

    try:
        if getattr(spec, "kind", "") == "udp" and spec.netdev:
            return [a.packed for a in netdev_addresses(spec.netdev)[1]]
        return [a.packed for a in explicit_addresses(list(spec.addrs))]
    except (PyverbsRDMAError, ValueError, OSError):
        return []


class Router:
    """Address and route lookups over ``world``'s devices.  ``gids_of(name)``
    gives an open device's GIDs (None if it is not open): they are its
    addresses once it exists."""

    def __init__(self, world: World, gids_of: Callable[[str], list[bytes] | None]) -> None:
        self.world = world
        self.gids_of = gids_of
        self._ip_cache: dict[str, list[bytes]] = {}

    def device_ips(self, spec: Any) -> list[bytes]:
        gids = self.gids_of(spec.name)
        if gids is not None:
            return [ip_of(g) for g in gids]
        cached = self._ip_cache.get(spec.name)
        if cached is None:
            cached = self._ip_cache[spec.name] = spec_ips(spec)
        return cached

    def owner_of(self, ip: bytes) -> str | None:
        """The device that has address ``ip``: UDP devices (bound to a real
        netdev) before in-process ones, whose addresses are only identities."""
        specs = sorted(self.world.specs(), key=lambda s: getattr(s, "kind", "") != "udp")
        for spec in specs:
            if ip in self.device_ips(spec):
                return str(spec.name)
        return None

    def kind(self, name: str) -> str:
        for spec in self.world.specs():
            if spec.name == name:
                return str(getattr(spec, "kind", ""))
        return ""

    def bind_device(self, ip: bytes) -> str | None:
        """The device ``rdma_bind_addr(ip)`` binds: the one whose GIDs hold
        ``ip``; none for a loopback address no device holds (the kernel binds
        loopback as the wildcard, see :func:`is_wildcard`); else an error."""
        dev = self.owner_of(ip)
        if dev is None:
            if ipaddress.ip_address(ip).is_loopback:
                return None
            if host_owns(ip):
                raise cm_error(f"{ipaddress.ip_address(ip)} belongs to no softverbs device "
                               "(see 'softverbs link')", errno.ENODEV)  # fmt: skip
            raise cm_error(f"{ipaddress.ip_address(ip)} is not a local address",
                           errno.EADDRNOTAVAIL)  # fmt: skip
        return dev

    def resolve(self, dev: str | None, src: bytes | None,
                 dst: bytes) -> tuple[int, str | None, bytes | None]:  # fmt: skip
        """(status, device, source IP) for reaching ``dst``; status is -errno.

        A multicast ``dst`` (a group to join) is reached from the bound device
        or, failing that, the device of the routing table's source address or
        the first device; its source is that device's address of the family."""
        group = not is_any(dst) and ipaddress.ip_address(dst).is_multicast
        if group and dev is None:
            prefsrc = route_source(dst)
            dev = self.owner_of(prefsrc) if prefsrc is not None else None
            if dev is not None and prefsrc is not None:
                return 0, dev, src or prefsrc
        if group or is_any(dst):  # a group, or rdma_cm's loopback: the device's own address
            if dev is None:
                names = [s.name for s in self.world.specs()]
                if not names:
                    return -errno.ENODEV, None, None
                dev = names[0]
            ips = [ip for ip in self.device_ips(self.spec(dev)) if len(ip) == len(dst)]
            if not ips:
                return -errno.EADDRNOTAVAIL, None, None
            return 0, dev, src or ips[0]
        owner = self.owner_of(dst)
        if dev is None:
            if owner is not None:
                return 0, owner, dst  # a local address: the route's source is itself
            prefsrc = route_source(dst)
            dev = self.owner_of(prefsrc) if prefsrc is not None else None
            if dev is None or prefsrc is None:
                return -errno.EHOSTUNREACH, None, None
            return 0, dev, prefsrc
        if src is None:
            ips = [ip for ip in self.device_ips(self.spec(dev)) if len(ip) == len(dst)]
            if not ips:
                return -errno.EADDRNOTAVAIL, dev, None
            src = dst if dst in ips else ips[0]
        kind = self.kind(dev)
        if owner is not None:
            same_fabric = owner == dev or (kind == "udp") == (self.kind(owner) == "udp")
            return (0, dev, src) if same_fabric else (-errno.EHOSTUNREACH, dev, src)
        if kind != "udp":
            return -errno.EHOSTUNREACH, dev, src  # the in-process fabric has no other hosts
        return 0, dev, src

    def spec(self, name: str) -> Any:
        for spec in self.world.specs():
            if spec.name == name:
                return spec
        raise cm_error(f"no device {name}", errno.ENODEV)
