"""Seeded, deterministic fault injection between devices.

A :class:`FaultInjector` sits where packets leave a device (every fabric
passes them through :meth:`FaultInjector.process`).  It applies a list of
:class:`FaultRule` objects; each rule matches some packets -- by packet
kind (``request``, ``response``, ``ack``, ``nak``, ``read_resp``,
``atomic_ack``, or a :class:`~softverbs.wire.opcodes.Kind` name such as
``send``/``write``), by direction (source or destination GID), by
destination QPN -- and then, with the given probabilities:

* ``drop`` it;
* ``duplicate`` it (the copy follows at once);
* ``reorder`` it (hold it back ``reorder_delay`` seconds, so the packets
  sent after it overtake it);
* ``corrupt`` it (flip one bit of its encoded bytes: the receiver's ICRC
  check drops it and counts ``drop_icrc_error``);
* ``delay`` it by a fixed time plus up to ``jitter``.

All randomness comes from one ``random.Random(seed)``, and decisions are
made in packet order, so a run with the same seed and the same traffic
makes the same decisions.  Failing tests print their seed.

A packet takes the first rule that matches it; ``limit`` stops a rule after
it has acted on that many packets (then later rules may match them).

From the environment: ``SOFTVERBS_FAULTS="seed=7;drop=0.1;kinds=ack"``;
several rules are separated by ``|``, e.g.
``"seed=1;drop=0.05|kinds=read_resp;dup=0.2"`` (the seed may appear in any
rule).  Settings: ``seed``, ``drop``, ``dup`` (or ``duplicate``),
``reorder``, ``corrupt`` (probabilities), ``delay``, ``jitter``,
``reorder_delay`` (seconds), ``kinds`` (comma-separated), ``src`` and ``dst``
(an IPv4/IPv6 address or a GID), ``dqpn`` and ``limit`` (integers, ``0x``
allowed).  A bad setting raises ValueError saying which and why.
"""

from __future__ import annotations

import ipaddress
import math
import random
from collections import Counter
from dataclasses import dataclass, field

from softverbs.wire.opcodes import AETH_NAK, AETH_RNR_NAK, OPINFO, Kind, aeth_kind
from softverbs.wire.packet import Packet

#: kind names a rule may match, beyond the Kind enum's own names
_GROUPS = {"request", "response", "ack", "nak", "read_resp", "atomic_ack"}
#: every name ``kinds`` accepts
KIND_NAMES = frozenset(_GROUPS | {k.name.lower() for k in Kind})


def packet_kinds(pkt: Packet) -> frozenset[str]:
    """Every kind name that describes ``pkt``."""
    info = OPINFO[pkt.opcode]
    if info is None:
        return frozenset({"unknown"})
    names = {"request" if info.request else "response"}
    if info.kind is Kind.ACK:
        # The ACK opcode carries ACKs and NAKs: "ack" is a positive one only.
        names.add("nak" if aeth_kind(pkt.syndrome) in (AETH_NAK, AETH_RNR_NAK) else "ack")
    else:
        names.add(info.kind.name.lower())
    return frozenset(names)


@dataclass
class FaultRule:
    """What to do to matching packets; probabilities are per packet."""

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    delay: float = 0.0
    jitter: float = 0.0
    reorder_delay: float = 100e-6
    kinds: frozenset[str] = frozenset()  #: empty: every packet
    src_gid: bytes | None = None
    dst_gid: bytes | None = None
    dqpn: int | None = None
    limit: int | None = None  #: stop after acting on this many packets
    applied: int = field(default=0, compare=False)  #: packets acted on so far

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - KIND_NAMES
        if unknown:
            raise ValueError(
                f"unknown packet kinds {sorted(unknown)}; known: {', '.join(sorted(KIND_NAMES))}"
            )
        for name in ("drop", "duplicate", "reorder", "corrupt"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} probability {p} is not in [0, 1]")
        for name in ("delay", "jitter", "reorder_delay"):
            t = getattr(self, name)
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"{name} {t} is not a time in seconds >= 0")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit {self.limit} is negative")
        if self.dqpn is not None and not 0 <= self.dqpn <= 0xFFFFFF:
            raise ValueError(f"dqpn {self.dqpn:#x} is not a 24-bit QP number")
        for name in ("src_gid", "dst_gid"):
            gid = getattr(self, name)
            if gid is not None and len(gid) != 16:
                raise ValueError(f"{name} must be a 16-byte GID, not {len(gid)} bytes")

    def matches(self, pkt: Packet) -> bool:
        if self.limit is not None and self.applied >= self.limit:
            return False
        if self.kinds and not self.kinds & packet_kinds(pkt):
            return False
        if self.src_gid is not None and pkt.sgid != self.src_gid:
            return False
        if self.dst_gid is not None and pkt.dgid != self.dst_gid:
            return False
        return self.dqpn is None or pkt.dqpn == self.dqpn


class FaultInjector:
    """Applies rules to packets in flight (see the module docstring)."""

    def __init__(self, rules: list[FaultRule], seed: int = 0) -> None:
        self.rules = rules
        self.seed = seed
        self.rng = random.Random(seed)
        self.stats: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"FaultInjector(seed={self.seed}, rules={self.rules})"

    def process(self, pkt: Packet, now: float) -> list[tuple[float, Packet]]:
        """The packets to put on the wire for ``pkt``, each with its send time."""
        rule = next((r for r in self.rules if r.matches(pkt)), None)
        if rule is None:
            return [(now, pkt)]
        return self._apply(rule, pkt, now)

    def _apply(self, rule: FaultRule, pkt: Packet, now: float) -> list[tuple[float, Packet]]:
        rng = self.rng
        stats = self.stats
        if rule.drop and rng.random() < rule.drop:
            rule.applied += 1
            stats["dropped"] += 1
            return []
        hit = False
        when = now
        if rule.delay or rule.jitter:
            hit = True
            when = now + rule.delay + rng.random() * rule.jitter
            stats["delayed"] += 1
            pkt = _detached(pkt)
        if rule.corrupt and rng.random() < rule.corrupt:
            hit = True
            stats["corrupted"] += 1
            pkt = _detached(pkt)
            pkt.corrupt_bit = rng.randrange(1 << 30)
        if rule.reorder and rng.random() < rule.reorder:
            hit = True
            stats["reordered"] += 1
            when += rule.reorder_delay
            pkt = _detached(pkt)
        out = [(when, pkt)]
        if rule.duplicate and rng.random() < rule.duplicate:
            hit = True
            stats["duplicated"] += 1
            out.append((when, _detached(pkt)))
        if hit:  # one packet counts once against the limit, whatever was done to it
            rule.applied += 1
        return out

def _detached(pkt: Packet) -> Packet:
    """A copy whose payload no longer aliases application memory."""
    new = pkt.copy()
    new.payload = bytes(pkt.payload)
    return new


def parse_faults(text: str) -> FaultInjector:
    """Build an injector from ``SOFTVERBS_FAULTS`` syntax (module docstring)."""
    seed = 0
    rules = []
    for chunk in text.split("|"):
        kwargs: dict[str, object] = {}
        for item in filter(None, (p.strip() for p in chunk.split(";"))):
            key, eq, value = item.partition("=")
            key, value = key.strip().lower(), value.strip()
            try:
                if not eq:
                    raise ValueError("expected name=value")
                if key == "seed":
                    seed = _int(value)
                elif key in _SETTINGS:
                    name, convert = _SETTINGS[key]
                    kwargs[name] = convert(value)
                else:
                    known = ", ".join(sorted([*_SETTINGS, "seed"]))
                    raise ValueError(f"unknown setting; known: {known}")
            except ValueError as exc:
                raise ValueError(f"fault setting {item!r} in {text!r}: {exc}") from None
        if kwargs:
            try:
                rules.append(FaultRule(**kwargs))  # type: ignore[arg-type]
            except ValueError as exc:
                raise ValueError(f"fault rule {chunk.strip()!r} in {text!r}: {exc}") from None
    return FaultInjector(rules, seed)


def _int(value: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


def _kinds(value: str) -> frozenset[str]:
    kinds = frozenset(v.strip().lower() for v in value.split(",") if v.strip())
    if not kinds:
        raise ValueError("no packet kinds given")
    return kinds


def _gid(value: str) -> bytes:
    """An IPv4 address (as its IPv4-mapped GID), an IPv6 address or a GID in IPv6 form."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4/IPv6 address or a GID") from None
    if ip.version == 4:
        return b"\x00" * 10 + b"\xff\xff" + ip.packed
    return ip.packed


#: SOFTVERBS_FAULTS setting -> (FaultRule field, parser)
_SETTINGS = {
    "drop": ("drop", _float),
    "dup": ("duplicate", _float),
    "duplicate": ("duplicate", _float),
    "reorder": ("reorder", _float),
    "corrupt": ("corrupt", _float),
    "delay": ("delay", _float),
    "jitter": ("jitter", _float),
    "reorder_delay": ("reorder_delay", _float),
    "kinds": ("kinds", _kinds),
    "src": ("src_gid", _gid),
    "dst": ("dst_gid", _gid),
    "dqpn": ("dqpn", _int),
    "limit": ("limit", _int),
}
