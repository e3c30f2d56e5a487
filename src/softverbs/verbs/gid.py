"""GIDs (``ibv_gid``): 16 bytes, which on RoCE are an IPv6 address or an
IPv4-mapped one.

The value type sits apart from the address handles in :mod:`.addr` because
the device context hands GIDs out (``query_gid``) while an AH is made on a
PD that a context allocated: the context cannot import what depends on it.
"""

from __future__ import annotations

import ipaddress

from softverbs.errors import PyverbsUserError
from softverbs.verbs.base import PyverbsObject


def gid_str(raw: bytes) -> str:
    """A GID in pyverbs' 8-word form: 'xxxx:xxxx:...:xxxx'."""
    h = raw.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def parse_gid(val: str) -> bytes:
    """Accept pyverbs' 8-word form or any IPv6/IPv4 address text."""
    if not isinstance(val, str):
        raise PyverbsUserError(f"Invalid GID value ({val!r}): expected a string")
    words = val.split(":")
    if len(words) == 8 and all(len(w) == 4 for w in words):
        try:
            return bytes.fromhex("".join(words))
        except ValueError:
            pass
    try:
        ip = ipaddress.ip_address(val)
    except ValueError:
        raise PyverbsUserError(f"Invalid GID value ({val})") from None
    if ip.version == 4:
        return b"\x00" * 10 + b"\xff\xff" + ip.packed
    return ip.packed


class GID(PyverbsObject):
    """``ibv_gid``: 16 bytes, shown as 'xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx'."""

    def __init__(self, val: str | None = None) -> None:
        super().__init__()
        self.raw = bytes(16) if val is None else parse_gid(val)

    @classmethod
    def from_raw(cls, raw: bytes) -> GID:
        gid = cls()
        gid.raw = bytes(raw)
        return gid

    @property
    def gid(self) -> str:
        return gid_str(self.raw)

    @gid.setter
    def gid(self, val: str) -> None:
        self.raw = parse_gid(val)

    def __str__(self) -> str:
        return gid_str(self.raw)

    def __repr__(self) -> str:
        return f"GID('{self}')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GID) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)
