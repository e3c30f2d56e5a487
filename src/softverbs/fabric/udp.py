"""The UDP fabric: RoCEv2 over ordinary UDP sockets.

A UDP device is bound to a network interface (or to explicit addresses),
as rxe is bound to a netdev.  Its GID table is built the way rxe builds
one: the interface's IPv6 link-local address first, then each IPv4 address
as an IPv4-mapped GID, then other IPv6 addresses -- all RoCEv2 GIDs.

Sending
    One UDP socket per local address is bound to port 4791 and receives.
    Packets leave with the UDP source port rxe would use for the QP pair
    (:func:`~softverbs.wire.packet.udp_sport`): a small pool of send-only
    sockets bound to those ports on the same address.  If a port cannot be
    bound (something else holds it) the packet leaves from 4791 instead --
    the ICRC is computed for whichever port is used, so it stays valid.
    Sockets are unconnected with ``IP_PMTUDISC_DO``, so Linux sends IPv4
    datagrams with DF and IP ID 0, which the ICRC covers (see
    :mod:`softverbs.wire.codec`).  The UDP checksum is 0 (``SO_NO_CHECK``,
    ``UDP_NO_CHECK6_TX``), as rxe sends it; zero-checksum IPv6 is accepted
    (``UDP_NO_CHECK6_RX``).

Segmentation offload (GSO and GRO)
    The engine hands the fabric a message's packets as one burst.  The UDP
    fabric encodes each packet (its own headers and ICRC) and sends runs of
    equal-sized datagrams with one ``sendmsg`` and ``UDP_SEGMENT``: the
    kernel cuts the run into datagrams (on loopback it may keep it whole to a
    ``UDP_GRO`` socket).  Receive sockets ask for ``UDP_GRO``, and a
    coalesced buffer is cut back into its datagrams with the segment size the
    kernel reports; each is checked on its own (headers, length, ICRC), so a
    truncated or corrupted one is dropped and counted, and its neighbours are
    not touched.  Consecutive packets of one message go to the engine merged
    into a burst again, as a NIC's LRO hands its host one large receive.
    The kernel gives a run's segments the IPv4 IDs 0, 1, 2 ..., which the ICRC
    covers: segment k is sealed for ID k.
    A GSO send needs a UDP checksum (the kernel refuses GSO on a socket with
    ``SO_NO_CHECK``), so a socket that sends a run computes checksums from
    then on; single packets keep rxe's zero checksum until then.  RoCEv2
    receivers, rxe included, accept either.  ``SOFTVERBS_UDP_GSO=0`` turns
    both offloads off: a datagram per ``sendto``, zero checksums throughout.
    Where the kernel refuses GSO or GRO, the fabric falls back to a datagram
    at a time and counts ``gso_fallback``.

Receiving and progress
    Datagrams are decoded (ICRC checked) and handed to the engine.  A
    malformed datagram is dropped and counted under ``drop_<reason>``; it
    never raises.  An epoll set of the receiving sockets, asked without
    waiting, says which hold datagrams, so a receive is made only where one
    waits: a receive that finds its socket empty fails with EAGAIN, and Python
    raises for it, which made an empty drain 2.5 times the cost of the
    epoll_wait (a busy poller pays one on every empty poll, and every drain
    ended with one).  A progress thread waits on the sockets and the next timer
    deadline, so ACKs, READ responses and atomics are answered while the
    application is busy elsewhere.  It waits in that same epoll set, which holds
    the wake pipe too, and its drain starts with the sockets the wait reported,
    not with an epoll_wait of its own; so does a thread blocked in
    ``get_cq_event``.  A poll drains the sockets too, so a
    polling loop sees its completions without a thread hop, and so does a
    thread blocked in ``get_cq_event`` (it waits on the sockets itself);
    meanwhile the progress thread stands back, away from the sockets.  A
    post does not drain them: it only sends what it made (``posted``).  All
    run the same loop under the runtime's one lock.

Multicast
    A UD SEND to a multicast GID (destination QP 0xFFFFFF) leaves as a
    datagram to the group's IP address on port 4791, as rxe sends it: an
    IPv4-mapped GID ``::ffff:224.0.0.0/100`` to the IPv4 group, an ``ff00::/8``
    GID to the IPv6 group, from the device's own address
    (``IP_MULTICAST_IF``), with the address vector's hop limit as its TTL.
    When a QP of the device attaches to a group first, the device joins the
    IP group on its interface (``IP_ADD_MEMBERSHIP``, ``IPV6_JOIN_GROUP``)
    with a socket bound to the group address and port 4791 that receives
    what is sent there; the last detach leaves it and closes the socket.
    The kernel loops a group's datagrams back to the sockets of this host
    that joined it (``IP_MULTICAST_LOOP``), so devices on one host -- the
    sender's own included -- hear each other as rxe devices do.

Path MTU
    ``active_mtu`` follows the interface MTU as in rxe: the largest IB MTU
    not above (netdev MTU - 80 bytes of headers).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import ipaddress
import json
import logging
import os
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from softverbs.engine.hca import HCA
from softverbs.engine.memory import new_pass
from softverbs.errors import PyverbsRDMAError, WireError
from softverbs.fabric.runtime import Clock, Runtime, flip_bit
from softverbs.wire.codec import (
    BurstMerger,
    Parts,
    encode_udp_burst,
    encode_udp_payload,
    seal_udp_datagrams,
)
from softverbs.wire.opcodes import ROCEV2_PORT
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet, is_multicast_gid

log = logging.getLogger(__name__)

#: rxe's allowance for headers when deriving the IB MTU from the netdev MTU.
ROCE_HEADER_ALLOWANCE = 80
IB_MTUS = (4096, 2048, 1024, 512, 256)

# Linux socket options Python does not name.
SO_NO_CHECK = 11
UDP_NO_CHECK6_TX = 101
UDP_NO_CHECK6_RX = 102
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IPV6_MTU_DISCOVER = getattr(socket, "IPV6_MTU_DISCOVER", 23)
IPV6_PMTUDISC_DO = 2
IPV6_FREEBIND = 78

RECV_BUFFER = 8 << 20  #: asked for; the kernel grants it up to net.core.rmem_max
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
MAX_DATAGRAM = 65536

# UDP segmentation offload (linux/udp.h)
SOL_UDP = 17
UDP_SEGMENT = 103  #: a GSO send's segment size (a cmsg of sendmsg)
UDP_GRO = 104  #: coalesce received datagrams; a cmsg gives their size
UDP_MAX_SEGMENTS = 64  #: the kernel's limit of segments per GSO send
GSO_MAX_BYTES = 65000  #: one GSO send stays below 64 KiB of IP payload
#: room for the ancillary data a receive asks for: UDP_GRO's segment size and
#: the TOS (IPv4, IP_RECVTOS) or traffic class (IPv6, IPV6_RECVTCLASS)
_GRO_CMSG = socket.CMSG_SPACE(4) * 2
IP_TOS = socket.IP_TOS
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)
IPV6_RECVTCLASS = getattr(socket, "IPV6_RECVTCLASS", 66)
ECN_MASK, ECN_CE = 3, 3
GSO_ENV = "SOFTVERBS_UDP_GSO"
#: A drain sends the ACKs it owes after this many packets, not only at its end.
ACK_FLUSH_PACKETS = 64


def _set_rcvbuf(sock: socket.socket, size: int) -> None:
    """Ask for a receive buffer of ``size`` bytes: beyond net.core.rmem_max where
    the process may (SO_RCVBUFFORCE, CAP_NET_ADMIN), else up to it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def gso_wanted() -> bool:
    """``SOFTVERBS_UDP_GSO``: segmentation offload unless it is ``0``."""
    return os.environ.get(GSO_ENV, "1").strip() != "0"


def gso_runs(sizes: list[int]) -> list[tuple[int, int]]:
    """Cut datagrams of ``sizes`` into GSO sends: (first, count) each.

    In a run every datagram but the last has the same size and the last is
    not longer (what ``UDP_SEGMENT`` cuts), with at most
    :data:`UDP_MAX_SEGMENTS` datagrams and :data:`GSO_MAX_BYTES` bytes."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(sizes)
    while i < n:
        seg, j, total = sizes[i], i + 1, sizes[i]
        while j < n and j - i < UDP_MAX_SEGMENTS and total + sizes[j] <= GSO_MAX_BYTES:
            if sizes[j] == seg:
                total += sizes[j]
                j += 1
                continue
            if sizes[j] < seg and (j + 1 == n or sizes[j + 1] != sizes[j]):
                j += 1  # a shorter tail ends the run (a message's LAST)
            break  # else a new size starts a run of its own (a FIRST's RETH)
        runs.append((i, j - i))
        i = j
    return runs


def _alone(parts: Parts, addr: tuple[bytes, bytes, int]) -> bytearray:
    """A datagram of a GSO run, to be sent alone: joined, and sealed again for
    IPv4 ID 0 (``addr``: source IP, destination IP, source port)."""
    data = bytearray(b"".join(parts))
    seal_udp_datagrams(data, 0, [len(data)], *addr)
    return data


def ib_mtu_for(netdev_mtu: int) -> int:
    """The active IB MTU rxe derives from a netdev MTU."""
    room = netdev_mtu - ROCE_HEADER_ALLOWANCE
    for mtu in IB_MTUS:
        if mtu <= room:
            return mtu
    return IB_MTUS[-1]


@dataclass
class LocalAddr:
    """One address of the device: text, packed bytes, scope (IPv6 link-local)."""

    text: str
    packed: bytes
    scope_id: int = 0
    tentative: bool = False  #: IPv6 duplicate address detection has not finished

    @property
    def gid(self) -> bytes:
        return IPV4_MAPPED_PREFIX + self.packed if len(self.packed) == 4 else self.packed

    @property
    def family(self) -> int:
        return socket.AF_INET if len(self.packed) == 4 else socket.AF_INET6


def netdev_addresses(ifname: str) -> tuple[int, list[LocalAddr]]:
    """(MTU, addresses in rxe GID order) of an interface."""
    try:
        out = subprocess.run(
            ["ip", "-j", "addr", "show", "dev", ifname],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout  # fmt: skip
        info = json.loads(out)[0]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise PyverbsRDMAError(f"cannot read the addresses of netdev {ifname!r}: {exc}") from None
    mtu = int(info.get("mtu", 1500))
    index = int(info.get("ifindex", 0))
    link_local: list[LocalAddr] = []
    v4: list[LocalAddr] = []
    v6: list[LocalAddr] = []
    for a in info.get("addr_info", []):
        ip = ipaddress.ip_address(a["local"])
        tentative = bool(a.get("tentative") or a.get("dadfailed"))
        if ip.version == 4:
            v4.append(LocalAddr(str(ip), ip.packed))
        elif ip.is_link_local:
            link_local.append(LocalAddr(str(ip), ip.packed, index, tentative))
        else:
            v6.append(LocalAddr(str(ip), ip.packed, 0, tentative))
    return mtu, link_local + v4 + v6


def netdev_of_address(addr: str) -> tuple[str, int]:
    """(interface name, MTU) that traffic from ``addr`` uses; ("", 1500) if unknown.

    Asks the routing table, as the kernel would: 127.0.0.2 has no address
    entry of its own but is routed through ``lo``.
    """
    try:
        out = subprocess.run(["ip", "-j", "route", "get", addr], capture_output=True,
                             text=True, check=True, timeout=10).stdout  # fmt: skip
        dev = str(json.loads(out)[0]["dev"])
        mtu = int(Path(f"/sys/class/net/{dev}/mtu").read_text())
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError):
        return "", 1500
    return dev, mtu


def explicit_addresses(addrs: list[str]) -> list[LocalAddr]:
    out = []
    for text in addrs:
        ip = ipaddress.ip_address(text.split("%")[0])
        scope = 0
        if "%" in text:
            scope = socket.if_nametoindex(text.split("%", 1)[1])
        out.append(LocalAddr(str(ip), ip.packed, scope))
    return out


#: errno of a failed bind -> what it means for a softverbs device, and what to do.
BIND_HINTS: dict[int, str] = {
    errno.EADDRINUSE: "another process holds UDP port 4791 there (another softverbs UDP "
    "device, softverbsd, or kernel rxe on that netdev); stop it, or use another address",
    errno.EADDRNOTAVAIL: "this host has no such address (see 'ip addr')",
    errno.EACCES: "binding that address is not permitted for this user",
    errno.EPERM: "binding that address is not permitted for this user",
    errno.EAFNOSUPPORT: "this host has that address family (IPv4/IPv6) disabled",
    errno.EINVAL: "the address cannot be bound (a link-local IPv6 address needs its "
    "interface: ADDR%IFNAME)",
    errno.ENODEV: "no such network interface (see 'ip link')",
}


def bind_error_hint(exc: OSError) -> str:
    """What a failed bind of a device address means (:data:`BIND_HINTS`)."""
    return BIND_HINTS.get(exc.errno or 0, "see the errno")


def address_error(text: str) -> str | None:
    """None if ``text`` is an address of this host (the kernel lets us bind it),
    else why not.  Binds an ephemeral UDP port, so a device holding 4791 does
    not make its own address look foreign."""
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return f"{text!r} is not an IPv4 or IPv6 address"
    try:
        scope = socket.if_nametoindex(text.split("%", 1)[1]) if "%" in text else 0
        family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        where: tuple[str, int] | tuple[str, int, int, int] = (
            (str(ip), 0) if ip.version == 4 else (str(ip), 0, 0, scope)
        )
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind(where)
    except OSError as exc:
        return f"{text} cannot be used: {exc.strerror}: {bind_error_hint(exc)}"
    return None


# Address conversions cost microseconds through ipaddress; a peer's address is
# converted once, not once per packet.
@functools.lru_cache(maxsize=4096)
def _ip_text(packed: bytes) -> str:
    return str(ipaddress.ip_address(packed))


@functools.lru_cache(maxsize=4096)
def _ip_packed(text: str) -> bytes:
    return ipaddress.ip_address(text.split("%")[0]).packed


def _ifindex_of(local: LocalAddr) -> int:
    """The index of the interface a local address is on (its scope for a
    link-local one): the device the routing table delivers the address to."""
    if local.scope_id:
        return local.scope_id
    try:
        out = subprocess.run(["ip", "-j", "route", "get", local.text], capture_output=True,
                             text=True, timeout=5, check=False).stdout  # fmt: skip
        routes = json.loads(out or "[]")
        return socket.if_nametoindex(str(routes[0]["dev"])) if routes else 0
    except (OSError, ValueError, KeyError, IndexError, TypeError, subprocess.SubprocessError):
        return 0


def _ip_of_gid(gid: bytes) -> bytes:
    return gid[12:] if gid[:12] == IPV4_MAPPED_PREFIX else gid


def _set_tos(sock: socket.socket, tos: int) -> None:
    """Send with this IPv4 TOS / IPv6 traffic class (its ECN bits too: UDP keeps them)."""
    if sock.family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, IP_TOS, tos)
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TCLASS, tos)


def _tos(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The received datagram's IPv4 TOS or IPv6 traffic class (0 if not reported)."""
    for level, kind, value in ancdata:
        if level == socket.IPPROTO_IP and kind == IP_TOS and value:
            return value[0]
        if level == socket.IPPROTO_IPV6 and kind == IPV6_TCLASS and len(value) >= 4:
            return int(struct.unpack("=i", value[:4])[0]) & 0xFF
    return 0


def _gro_size(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The segment size of a GRO-coalesced receive (0: one datagram)."""
    for level, kind, value in ancdata:
        if level == SOL_UDP and kind == UDP_GRO and len(value) >= 2:
            return int(struct.unpack("=H", value[:2])[0]) if len(value) < 4 else \
                int(struct.unpack("=i", value[:4])[0])  # fmt: skip
    return 0


#: an application thread whose poll found its CQ empty less than this long ago
#: is a busy poller: its polls drain the sockets and run the timers
POLLER_STANDS_BACK = 0.0005
#: how long the progress thread then sleeps, away from the sockets, before it
#: looks again (a poller that blocks in a wait it cannot drive wakes it at
#: once, and one that drives counts as polling when its wait ends: wait_for)
STAND_BACK_SLEEP = 0.005
#: the longest a thread that drives the device from wait_for sleeps in select
#: before it looks at the timers again
DRIVE_SLICE = 0.05


#: a time that has long passed (the thread's sleep while it stands back, the last
#: poll of a poller that has not polled): a constant, not ``-math.inf`` looked up
#: on every check
_NEVER = float("-inf")

#: where a datagram is sent: (IPv4 address, port) or (IPv6 address, port, flow, scope)
Dest = tuple[str, int] | tuple[str, int, int, int]
#: how a packet leaves (UdpRuntime._route): socket, source port, source and
#: destination IP, destination
Route = tuple[socket.socket, int, bytes, bytes, Dest]


def _sendto(src: HCA, sock: socket.socket, parts: Parts, dest: Dest) -> None:
    """One datagram, from the buffers of ``parts``."""
    try:
        if len(parts) == 1:
            sock.sendto(parts[0], dest)
        else:
            sock.sendmsg(parts, (), 0, dest)
    except BlockingIOError:
        src.counters["drop_tx_busy"] += 1  # like a full NIC queue: RC recovers
    except OSError as exc:
        src.counters["drop_tx_error"] += 1
        log.debug("sendto %s failed: %s", dest, exc)


class UdpRuntime(Runtime):
    """One UDP device's sockets, progress thread and progress loop."""

    def __init__(self, addrs: list[LocalAddr], clock: Clock | None = None) -> None:
        super().__init__(clock)
        if not addrs:
            raise PyverbsRDMAError("a UDP device needs at least one address")
        self.addrs = addrs
        self._by_ip: dict[bytes, LocalAddr] = {a.packed: a for a in addrs}
        self._rx: dict[socket.socket, LocalAddr] = {}
        #: the receiving sockets by file descriptor, and an epoll set of them and of
        #: the wake pipe: asked without waiting, it says which sockets have
        #: datagrams (see _drain); the threads that wait block in it (_run, _drive)
        self._rx_fd: dict[int, tuple[socket.socket, LocalAddr]] = {}
        self._ready = select.epoll()
        #: what the wait that woke a thread found ready: that thread's drain starts
        #: with it instead of asking the epoll set again
        self._woken: list[tuple[int, int]] | None = None
        #: each receiving socket's BurstMerger, kept from drain to drain
        self._mergers: dict[int, BurstMerger] = {}
        self._tx: dict[tuple[bytes, int], socket.socket] = {}
        self._main: dict[bytes, socket.socket] = {}
        #: how packets leave, by (source GID, destination GID, source port): see _route
        self._routes: dict[tuple[bytes, bytes, int], Route] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        # wake() runs under the lock; a blocking send into a full pair would wait
        # for the thread, which waits for the lock.  A full pair is a wakeup anyway.
        self._wake_w.setblocking(False)
        self._wake_fd = self._wake_r.fileno()
        self._ready.register(self._wake_fd, select.EPOLLIN)
        self._stop = threading.Event()
        self._resume = threading.Event()  #: ends the thread's standing back early
        #: the thread blocked in wait_for that drives the device (see there)
        self._driver: threading.Thread | None = None
        self._thread: threading.Thread | None = None
        self._sleep_until: float | None = None
        self._poller_seen = _NEVER  #: when a poll last found its CQ empty
        #: segmentation offload: bursts whole, runs of datagrams per sendmsg
        self.gso = gso_wanted()
        self.bursts = self.gso
        self.gro = False
        self._checksummed: set[socket.socket] = set()  #: sockets that have sent a GSO run
        #: multicast: the socket receiving each joined group, by the group's IP
        self._groups: dict[bytes, socket.socket] = {}
        #: sockets set up to send multicast (their IP_MULTICAST_IF is set), with their TTL
        self._mc_senders: dict[socket.socket, int] = {}
        self.tos = 0  #: the TOS / traffic class the sockets send with (ECT(0) with DCQCN)
        for addr in addrs:
            sock = self._socket(addr, ROCEV2_PORT)
            _set_rcvbuf(sock, RECV_BUFFER)
            if self.gso:
                try:
                    sock.setsockopt(SOL_UDP, UDP_GRO, 1)
                    self.gro = True
                except OSError:
                    pass  # an old kernel: a datagram per recvmsg
            # ECN: the TOS / traffic class of each datagram comes with it, so a
            # CE mark a router or qdisc set reaches DCQCN's notification point.
            if addr.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
            sock.setblocking(False)
            self._main[addr.packed] = sock
            self._add_rx(sock, addr)

    @property
    def gids(self) -> list[bytes]:
        return [a.gid for a in self.addrs]

    def attach(self, hca: HCA) -> None:
        # what the kernel granted (SO_RCVBUF is capped by net.core.rmem_max): the
        # QPs' windows must fit in it (HCA.window_for)
        hca.rx_buffer = min(
            (s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for s in self._rx), default=None
        )
        hca.on_mcast = self._membership
        # ECN: with DCQCN every packet is ECN-capable, ECT(0), set on the sockets
        # once; a packet with another TOS (a CNP) says so per send.
        self.tos = hca.cc.ect
        for sock in [*self._rx, *self._tx.values()]:
            _set_tos(sock, self.tos)
        super().attach(hca)

    # --- multicast -----------------------------------------------------------------
    def _local_for(self, family: int) -> LocalAddr:
        """The address a group of ``family`` is joined and sent from: the
        device's first of that family, else its first (its interface)."""
        return next((a for a in self.addrs if a.family == family), self.addrs[0])

    def _membership(self, mgid: bytes, join: bool) -> None:
        """Join (or leave) the IP group of ``mgid`` on the device's interface
        (module docstring, Multicast); called under the lock by the engine."""
        ip = _ip_of_gid(mgid)
        if not join:
            sock = self._groups.pop(ip, None)
            if sock is not None:
                self._remove_rx(sock)
                sock.close()  # closing leaves the group
            return
        if ip in self._groups:
            return
        family = socket.AF_INET if len(ip) == 4 else socket.AF_INET6
        local = self._local_for(family)
        group = LocalAddr(_ip_text(ip), ip, local.scope_id)
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET:
                sock.bind((group.text, ROCEV2_PORT))
                if local.family == socket.AF_INET:
                    mreq = struct.pack("4s4s", ip, local.packed)
                else:  # ip_mreqn: the interface by index
                    mreq = struct.pack("4s4si", ip, bytes(4), _ifindex_of(local))
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            else:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
                sock.bind((group.text, ROCEV2_PORT, 0, 0))
                mreq6 = struct.pack("16sI", ip, _ifindex_of(local))
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq6)
        except OSError as exc:
            sock.close()
            raise PyverbsRDMAError(f"joining IP multicast group {group.text} from "
                                   f"{local.text} failed: {exc}",
                                   exc.errno or errno.EADDRNOTAVAIL) from None  # fmt: skip
        _set_rcvbuf(sock, RECV_BUFFER)
        sock.setblocking(False)
        self._groups[ip] = sock
        self._add_rx(sock, group)

    def _add_rx(self, sock: socket.socket, local: LocalAddr) -> None:
        """Receive on ``sock`` (its datagrams are addressed to ``local``)."""
        self._rx[sock] = local
        self._rx_fd[sock.fileno()] = (sock, local)
        self._ready.register(sock.fileno(), select.EPOLLIN)

    def _remove_rx(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._ready.unregister(sock.fileno())
        self._rx_fd.pop(sock.fileno(), None)
        self._mergers.pop(sock.fileno(), None)
        self._rx.pop(sock, None)

    def _mc_sender(self, sock: socket.socket, local: LocalAddr, ttl: int) -> None:
        """Make ``sock`` send multicast from ``local``'s interface with ``ttl``."""
        if self._mc_senders.get(sock) == ttl:
            return
        with contextlib.suppress(OSError):
            if local.family == socket.AF_INET:
                if sock not in self._mc_senders:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, local.packed)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
            else:
                if sock not in self._mc_senders:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF,
                                    _ifindex_of(local))  # fmt: skip
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, ttl)
        self._mc_senders[sock] = ttl

    @staticmethod
    def _socket(addr: LocalAddr, port: int) -> socket.socket:
        sock = socket.socket(addr.family, socket.SOCK_DGRAM)
        try:
            if addr.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
                sock.bind((addr.text, port))
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
                    sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
                if addr.tentative:
                    # An interface just brought up has its IPv6 addresses still in
                    # duplicate address detection for a second or two, and binding one
                    # fails (EADDRNOTAVAIL).  Bind it anyway: the GID table keeps its
                    # layout, and the GID carries traffic once the address is valid.
                    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
                sock.bind((addr.text, port, 0, addr.scope_id))
        except OSError:
            sock.close()
            raise
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RECV_BUFFER)
        return sock

    # --- sending -----------------------------------------------------------------
    def _sender(self, local: LocalAddr, sport: int) -> tuple[socket.socket, int]:
        key = (local.packed, sport)
        sock = self._tx.get(key)
        if sock is None:
            try:
                sock = self._socket(local, sport)
            except OSError:
                # Port taken: send from 4791 instead; the ICRC follows the port.
                return self._main[local.packed], ROCEV2_PORT
            _set_tos(sock, self.tos)
            self._tx[key] = sock
        return sock, sport

    def transmit(self, src: HCA, pkt: Packet, now: float) -> None:
        route = self._routes.get((pkt.sgid, pkt.dgid, pkt.sport))
        if route is None:
            route = self._route(src, pkt)
            if route is None:
                return
        sock, sport, src_ip, dst_ip, dest = route
        if pkt.count > 1:  # a burst (only when self.bursts): GSO runs
            datagrams, sizes, runs = encode_udp_burst(
                pkt, src_ip, dst_ip, sport, runs=gso_runs if self.gso else None
            )
            for first, count in runs:
                self._send_run(src, sock, datagrams[first : first + count], sizes[first], dest,
                               (src_ip, dst_ip, sport))  # fmt: skip
            return
        data = encode_udp_payload(pkt, src_ip, dst_ip, sport)
        if pkt.corrupt_bit >= 0:
            flip_bit(data, pkt.corrupt_bit)
        if pkt.tclass != self.tos:
            self._send_tos(src, sock, data, dest, pkt.tclass)
            return
        _sendto(src, sock, [data], dest)

    def _route(self, src: HCA, pkt: Packet) -> Route | None:
        """How ``pkt`` leaves: the socket, its source port, the source and
        destination IPs and the address to send to; None (counted) if no
        address of this device can send it.  Kept for the next packet of the
        same addresses and port, unless multicast (its TTL is the packet's)."""
        src_ip = _ip_of_gid(pkt.sgid)
        local = self._by_ip.get(src_ip)
        if local is None:
            src.counters["drop_no_route"] += 1
            return None
        dst_ip = _ip_of_gid(pkt.dgid)
        if len(dst_ip) != len(src_ip):
            src.counters["drop_no_route"] += 1
            return None
        sock, sport = self._sender(local, pkt.sport or ROCEV2_PORT)
        dst_text = _ip_text(dst_ip)
        dest: Dest
        if len(dst_ip) == 4:
            dest = (dst_text, ROCEV2_PORT)
        else:
            dest = (dst_text, ROCEV2_PORT, 0, local.scope_id)
        route = (sock, sport, src_ip, dst_ip, dest)
        if is_multicast_gid(pkt.dgid):
            self._mc_sender(sock, local, pkt.hop_limit or 1)
            src.counters["mcast_sent_pkts"] += 1
        else:
            self._routes[(pkt.sgid, pkt.dgid, pkt.sport)] = route
        return route

    @staticmethod
    def _send_tos(src: HCA, sock: socket.socket, data: bytes | bytearray,
                  dest: tuple[str, int] | tuple[str, int, int, int], tos: int) -> None:  # fmt: skip
        """One datagram with its own TOS / traffic class (a CNP's DSCP, not ECN-capable)."""
        if sock.family == socket.AF_INET:
            cmsg = [(socket.IPPROTO_IP, IP_TOS, struct.pack("=i", tos))]
        else:
            cmsg = [(socket.IPPROTO_IPV6, IPV6_TCLASS, struct.pack("=i", tos))]
        try:
            sock.sendmsg([data], cmsg, 0, dest)
        except BlockingIOError:
            src.counters["drop_tx_busy"] += 1
        except OSError as exc:
            src.counters["drop_tx_error"] += 1
            log.debug("sendmsg %s (tos %#x) failed: %s", dest, tos, exc)

    def _send_run(self, src: HCA, sock: socket.socket, run: list[Parts], seg: int,
                  dest: tuple[str, int] | tuple[str, int, int, int],
                  addr: tuple[bytes, bytes, int]) -> None:  # fmt: skip
        """Datagrams of ``seg`` bytes (the last maybe shorter), sealed for IPv4
        IDs 0, 1, 2 ..., with one GSO send: the kernel gathers their parts, so
        a payload is copied once, from registered memory into the socket.  Where
        GSO is refused they go one by one, each sealed again for ID 0 (``addr``:
        source IP, destination IP, source port)."""
        if len(run) == 1:
            _sendto(src, sock, run[0], dest)
            return
        if not self.gso:  # refused earlier in this burst
            for parts in run:
                _sendto(src, sock, [_alone(parts, addr)], dest)
            return
        if sock not in self._checksummed:
            self._checksum_on(sock)
        cmsg = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", seg))]
        try:
            sock.sendmsg([part for parts in run for part in parts], cmsg, 0, dest)
            src.counters["gso_sends"] += 1
        except BlockingIOError:
            src.counters["drop_tx_busy"] += len(run)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP):
                # the kernel (or the device under it) refuses GSO: a datagram at a time
                self.gso = self.bursts = False
                src.counters["gso_fallback"] += 1
                log.info("UDP GSO refused (%s): sending a datagram at a time", exc)
                self._send_run(src, sock, run, seg, dest, addr)
            else:
                src.counters["drop_tx_error"] += len(run)
                log.debug("sendmsg %s failed: %s", dest, exc)

    def _checksum_on(self, sock: socket.socket) -> None:
        """A GSO send needs the UDP checksum that SO_NO_CHECK turned off."""
        with contextlib.suppress(OSError):
            if sock.family == socket.AF_INET:
                sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 0)
            else:
                sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 0)
        self._checksummed.add(sock)

    # --- receiving -----------------------------------------------------------------
    def _drain(self) -> bool:
        """Deliver every waiting datagram, each at the time it is taken.

        Draining a full socket buffer can take a long time on a busy host; an ACK
        processed at its end must set its retransmission deadline from then, not
        from when the drain began, or the timer fires early and a whole window is
        sent again for nothing -- which only makes the next drain longer.
        """
        rx_fd = self._rx_fd
        woken, self._woken = self._woken, None
        if not rx_fd:
            return False  # stopped
        got = False
        clock = self.clock
        hca = self.hcas[0] if self.hcas else None
        unanswered = 0  # packets taken since the ACKs due were last sent
        # A message's packets merge across receives too, each socket's on their own
        # (the mergers are flushed at the end, so none is open between drains).
        mergers = self._mergers
        failed: set[int] | None = None  # sockets whose receive failed: not again this drain
        # Which sockets hold datagrams: asking epoll without waiting is cheaper than
        # the receive that would find a socket empty (and raise), so neither a
        # drain nor a busy poller's empty poll makes one (module docstring).  A
        # thread woken by the epoll set already knows (_run, _drive).
        poll = self._ready.poll
        ready = poll(0) if woken is None else woken
        while ready:
            took = False
            for fd, _ in ready:
                entry = rx_fd.get(fd)
                if entry is None or (failed is not None and fd in failed):
                    continue  # the wake pipe (the thread that waits reads it)
                took = True
                sock, local = entry
                try:
                    data, anc, _flags, peer = sock.recvmsg(MAX_DATAGRAM, _GRO_CMSG)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    log.debug("recvmsg failed: %s", exc)
                    if failed is None:
                        failed = set()
                    failed.add(fd)
                    continue
                got = True
                new_pass()  # a packet may follow an unmap: check mappings again
                if hca is None:
                    continue
                merger = mergers.get(fd)
                if merger is None:
                    merger = mergers[fd] = BurstMerger()
                now = clock.now()
                if _tos(anc) & ECN_MASK == ECN_CE:
                    # Congestion experienced: these packets go alone, marked, to
                    # DCQCN's notification point (the kernel never coalesces
                    # datagrams whose TOS differs, so the whole buffer is marked).
                    self._deliver(hca, merger.flush(), now)
                    try:
                        src_ip = _ip_packed(peer[0])
                    except ValueError:
                        hca.counters["drop_bad_source"] += 1
                        continue
                    marked = merger.feed(data, _gro_size(anc), src_ip, local.packed, peer[1])
                    marked += merger.flush()
                    for pkt in marked:
                        if not isinstance(pkt, WireError):
                            pkt.tclass |= ECN_CE
                    unanswered += self._deliver(hca, marked, now)
                    continue
                unanswered += self._take(hca, merger, data, _gro_size(anc), peer, local, now)
                if unanswered >= ACK_FLUSH_PACKETS:
                    # A long drain must not hold back the ACKs it owes: the peer's
                    # window would close, and both ends would take turns idling.
                    self.send_outboxes(now)
                    unanswered = 0
            if not took:
                break  # only the wake pipe, or sockets that failed
            ready = poll(0)
        for merger in mergers.values():
            if merger.head is not None and hca is not None:
                self._deliver(hca, merger.flush(), clock.now())
            merger.next_id = 1  # as a new merger: the next drain's GSO run starts at ID 1
        return got

    def _take(self, hca: HCA, merger: BurstMerger, data: bytes, size: int,
              peer: tuple[str, int] | tuple[str, int, int, int], local: LocalAddr,
              now: float) -> int:  # fmt: skip
        """One received buffer -- a datagram, or (``size`` < its length) datagrams
        of ``size`` bytes coalesced by GRO -- into ``merger``, which merges the
        packets of a message into bursts (the receive half of segmentation
        offload); deliver what it completes.  Returns how many datagrams that was."""
        try:
            src_ip = _ip_packed(peer[0])
        except ValueError:
            hca.counters["drop_bad_source"] += 1
            return 1
        if 0 < size < len(data):
            hca.counters["gro_coalesced"] += 1
        else:
            size = len(data)
        return self._deliver(hca, merger.feed(data, size, src_ip, local.packed, peer[1]), now)

    def _deliver(self, hca: HCA, pkts: Sequence[Packet | WireError], now: float) -> int:
        """Hand decoded packets to the device, and count the datagrams that were
        not; how many datagrams they were."""
        datagrams = 0
        for pkt in pkts:
            if isinstance(pkt, WireError):
                hca.counters["rcvd_pkts"] += 1
                hca.counters[f"drop_{pkt.reason}"] += 1
                datagrams += 1
                continue
            datagrams += pkt.count
            if self.taps:
                for seg in pkt.segments():  # a capture shows the datagrams received
                    self.tap(seg, now)
            try:
                hca.receive(pkt, now)
            except Exception:  # never let a packet kill the device
                hca.counters["drop_internal_error"] += 1
                log.exception("internal error while receiving %r", pkt)
        return datagrams

    def progress(self) -> bool:
        got = self._drain()
        did = Runtime.progress(self)  # (not super(): a proxy object made per call)
        if got and not did:
            # A datagram that only made a CQE or an event (a UD or UC receive, an
            # ACK) sends nothing, so the loop above did not wake the threads
            # blocked in wait_for (get_cq_event, get_async_event): wake them here.
            self.woke()
        self._timers_moved()
        return did or got

    def posted(self) -> bool:
        """Send what a post made, without looking for datagrams: a poll or the
        progress thread takes those (a receive system call on every post cost
        the ping-pong two per message and side)."""
        did = Runtime.progress(self)
        self._timers_moved()
        return did

    def _timers_moved(self) -> None:
        if self._sleep_until == _NEVER:
            return  # the thread stands back: it takes no timer until a poller stops
        if self._thread is not None and threading.current_thread() is not self._thread:
            # A verb may have armed a timer earlier than the thread sleeps on.
            nxt = self.next_deadline()
            if nxt is not None and (self._sleep_until is None or nxt < self._sleep_until):
                self.wake()
                self._sleep_until = nxt  # one wakeup per earlier deadline, not one per poll

    def idle_step(self) -> bool:
        """A poll found nothing: an application thread is busy-polling (the
        progress thread stands back while it does)."""
        self._poller_seen = time.monotonic()
        return Runtime.idle_step(self)

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``ready()``; False on timeout.  Called without the lock held.

        The first thread to block drives the device itself: it waits in
        ``select`` on the sockets and runs the progress loop when a datagram
        arrives, so ``get_cq_event`` sees its completion without a hop through
        the progress thread, which stands back meanwhile.  Other threads that
        block at the same time wait to be notified, as before.
        """
        with self.lock:
            driving = self._driver is None and not self.clock.virtual and not self._stop.is_set()
            if driving:
                self._driver = threading.current_thread()
        if self._poller_seen != _NEVER:
            # A thread that blocks is no longer busy-polling: unless it drives the
            # device, the progress thread takes the sockets at once.
            self._poller_seen = _NEVER
            if not driving:
                self._resume.set()
        if not driving:
            return super().wait_for(ready, timeout)
        try:
            return self._drive(ready, timeout)
        finally:
            with self.lock:
                self._driver = None
                # The thread goes on to poll its CQ, as a busy poller does: the
                # progress thread, asleep, takes the sockets again when its nap
                # ends unless a poll or another wait has come by then.  Waking it
                # here cost every blocking wait a thread hand-off (the GIL, the
                # lock and a select of its own on each datagram).
                self._poller_seen = time.monotonic()

    def _drive(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        woken = None
        while True:
            with self.lock:
                self._woken = woken  # the drain starts with the sockets the wait found
                done = self.wait_pass(ready, end)
                self._woken = None
                if done is not None:
                    return done
                wait = self.wait_time(time.monotonic(), end)
                wait = DRIVE_SLICE if wait is None else min(wait, DRIVE_SLICE)
                # A verb of another thread that arms an earlier timer wakes us (and
                # should the progress thread take that wakeup, the slice bounds it).
                self._sleep_until = self.next_deadline()
            try:
                events = self._ready.poll(wait)
            except (OSError, ValueError):  # the device was closed under us
                left = None if end is None else max(0.0, end - time.monotonic())
                return Runtime.wait_for(self, ready, left)
            woken = self._woke(events)

    # --- the progress thread ----------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="softverbs-progress", daemon=True)
        self._thread.start()

    def _woke(self, events: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
        """After a wait in the epoll set: read the wake pipe if it was written, and
        return the receiving sockets it found ready (None if none)."""
        rx = None
        for event in events:
            if event[0] == self._wake_fd:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            elif rx is None:
                rx = [event]
            else:
                rx.append(event)
        return rx

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._standing_back():
                self._resume.wait(STAND_BACK_SLEEP)
                self._resume.clear()
                continue
            with self.lock:
                nxt = self.next_deadline()
                now = self.clock.now()
                self._sleep_until = nxt
            timeout = -1.0 if nxt is None else max(0.0, nxt - now)
            try:
                events = self._ready.poll(timeout)
            except (OSError, ValueError):
                break
            rx = self._woke(events)
            if self._stop.is_set():
                break
            if self._standing_back():
                continue  # the poller or the driver takes it
            with self.lock:
                self._woken = rx  # the drain starts with these sockets
                try:
                    self.progress()
                except Exception:
                    log.exception("softverbs progress loop error")
                self._woken = None

    def _standing_back(self) -> bool:
        """Whether an application thread runs the device now: a busy poller, or
        a thread blocked in :meth:`wait_for`.  Both drain the sockets and run
        the timers.  Waking here for each datagram would only hand the GIL and
        the lock between threads, which cost a busy poller a third of its
        one-way latency (docs/performance.md).

        Asked without the lock: the two fields are single reads, and the lock,
        which a busy poller holds most of the time, made each of this thread's
        naps end in a futex wait and wake on both sides."""
        if self._driver is not None:
            return True  # it waits on the sockets, and on the wake pipe
        if time.monotonic() - self._poller_seen < POLLER_STANDS_BACK:
            # Nor does a verb's earlier timer need to wake this thread (at worst,
            # racing a poller's _timers_moved, one wakeup more or one less while
            # it stands back: it reads the deadline again when it resumes).
            self._sleep_until = _NEVER
            return True
        return False

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def stop(self) -> None:
        """Stop the thread, send what is queued, close the sockets."""
        self._stop.set()
        self._resume.set()
        self.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        with self.lock:
            with contextlib.suppress(Exception):
                super().progress()
            for sock in [*self._rx, *self._tx.values()]:
                with contextlib.suppress(OSError):
                    sock.close()
            self._rx.clear()
            self._rx_fd.clear()
            self._routes.clear()
            self._ready.close()
            self._tx.clear()
            self._main.clear()
            self._mergers.clear()
            for s in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    s.close()
