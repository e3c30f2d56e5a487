"""A UDP device opens on an interface whose IPv6 addresses are still tentative.

Found by the multi-host tests (tests/netns): right after an interface comes
up, its IPv6 link-local address spends a second or two in duplicate address
detection; binding it failed with EADDRNOTAVAIL, so opening the device
failed with "is another process using that address?".  Now such addresses
are bound with IPV6_FREEBIND: the GID table has its usual layout at once,
and the GID carries traffic when the address becomes valid.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import subprocess
from typing import Any

import pytest

from softverbs.fabric import udp
from softverbs.fabric.udp import LocalAddr, UdpRuntime

IP_JSON = [{
    "ifindex": 7, "ifname": "sv0", "mtu": 1500,
    "addr_info": [
        {"family": "inet", "local": "10.199.7.1", "prefixlen": 24},
        {"family": "inet6", "local": "2001:db8::1", "prefixlen": 64, "tentative": True},
        {"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link",
         "tentative": True},
        {"family": "inet6", "local": "2001:db8::2", "prefixlen": 64, "dadfailed": True,
         "tentative": True},
        {"family": "inet6", "local": "2001:db8::3", "prefixlen": 64},
    ],
}]  # fmt: skip


def test_netdev_addresses_marks_tentative_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[:5] == ["ip", "-j", "addr", "show", "dev"]
        return subprocess.CompletedProcess(cmd, 0, json.dumps(IP_JSON), "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    mtu, addrs = udp.netdev_addresses("sv0")
    assert mtu == 1500
    # rxe's GID order: link-local first, then IPv4, then other IPv6
    assert [(a.text, a.tentative, a.scope_id) for a in addrs] == [
        ("fe80::1", True, 7),
        ("10.199.7.1", False, 0),
        ("2001:db8::1", True, 0),
        ("2001:db8::2", True, 0),
        ("2001:db8::3", False, 0),
    ]


def _v6(text: str, scope: int = 0, tentative: bool = False) -> LocalAddr:
    return LocalAddr(text, ipaddress.ip_address(text).packed, scope, tentative)


def test_a_tentative_address_binds() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    # 2001:db8::/32 is for documentation: never an address of this host
    try:
        sock = UdpRuntime._socket(_v6("2001:db8::77", tentative=True), 0)
    except OSError as exc:
        if exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
            pytest.skip(f"IPv6 is disabled here: {exc}")
        raise
    with sock:
        assert sock.getsockname()[0] == "2001:db8::77"
    lo = socket.if_nametoindex("lo")
    with UdpRuntime._socket(_v6("fe80::77", lo, tentative=True), 0) as sock:
        assert sock.getsockname()[3] == lo
    # an address that is not tentative must exist: a mistyped --addr still fails
    with pytest.raises(OSError) as ei:
        UdpRuntime._socket(_v6("2001:db8::77"), 0)
    assert ei.value.errno == errno.EADDRNOTAVAIL
