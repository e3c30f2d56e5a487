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

From the environment: ``SOFTVERBS_FAULTS="seed=7;drop=0.1;kinds=ack"``;
several rules are separated by ``|``, e.g.
``"seed=1;drop=0.05|kinds=read_resp;dup=0.2"`` (the seed may appear in any
rule).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from softverbs.wire.opcodes import AETH_NAK, AETH_RNR_NAK, OPINFO, Kind, aeth_kind
from softverbs.wire.packet import Packet

#: kind names a rule may match, beyond the Kind enum's own names
_GROUPS = {"request", "response", "ack", "nak", "read_resp", "atomic_ack"}


def packet_kinds(pkt: Packet) -> frozenset[str]:
    """Every kind name that describes ``pkt``."""
    info = OPINFO[pkt.opcode]
    if info is None:
        return frozenset({"unknown"})
    names = {info.kind.name.lower(), "request" if info.request else "response"}
    if info.kind is Kind.ACK:
        k = aeth_kind(pkt.syndrome)
        if k in (AETH_NAK, AETH_RNR_NAK):
            names.add("nak")
        else:
            names.add("ack")
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
    limit: int | None = None  #: stop after this many faults
    applied: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - _GROUPS - {k.name.lower() for k in Kind}
        if unknown:
            raise ValueError(f"unknown packet kinds {sorted(unknown)}")
        for name in ("drop", "duplicate", "reorder", "corrupt"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} probability {p} is not in [0, 1]")

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
        when = now
        if rule.delay or rule.jitter:
            when = now + rule.delay + rng.random() * rule.jitter
            stats["delayed"] += 1
            pkt = _detached(pkt)
        if rule.corrupt and rng.random() < rule.corrupt:
            rule.applied += 1
            stats["corrupted"] += 1
            pkt = _detached(pkt)
            pkt.corrupt_bit = rng.randrange(1 << 30)
        if rule.reorder and rng.random() < rule.reorder:
            rule.applied += 1
            stats["reordered"] += 1
            when += rule.reorder_delay
            pkt = _detached(pkt)
        out = [(when, pkt)]
        if rule.duplicate and rng.random() < rule.duplicate:
            rule.applied += 1
            stats["duplicated"] += 1
            out.append((when, _detached(pkt)))
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
    names = {"dup": "duplicate", "duplicate": "duplicate", "drop": "drop",
             "reorder": "reorder", "corrupt": "corrupt", "delay": "delay",
             "jitter": "jitter", "limit": "limit", "dqpn": "dqpn",
             "reorder_delay": "reorder_delay"}  # fmt: skip
    for chunk in text.split("|"):
        kwargs: dict[str, object] = {}
        for item in filter(None, (p.strip() for p in chunk.split(";"))):
            key, _, value = item.partition("=")
            key = key.strip().lower()
            if key == "seed":
                seed = int(value)
            elif key == "kinds":
                kwargs["kinds"] = frozenset(v.strip().lower() for v in value.split(",") if v)
            elif key in ("limit", "dqpn"):
                kwargs[names[key]] = int(value, 0)
            elif key in names:
                kwargs[names[key]] = float(value)
            else:
                raise ValueError(f"unknown fault setting {key!r} in {text!r}")
        if kwargs:
            rules.append(FaultRule(**kwargs))  # type: ignore[arg-type]
    return FaultInjector(rules, seed)
