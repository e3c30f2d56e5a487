"""Congestion control: one object per QP, owned by its requester.

The requester asks it how many packets may be unacknowledged
(:meth:`CongestionControl.window`) and whether a packet may leave now
(:meth:`~CongestionControl.can_send`; if not, :meth:`~CongestionControl.
next_send_time` says when, and the QP arms its timer for then).  The
requester reports what it sent (:meth:`~CongestionControl.on_packet_sent`);
the completer reports acknowledged packets (:meth:`~CongestionControl.on_ack`)
and go-back-N episodes (:meth:`~CongestionControl.on_loss`); the device
reports congestion notification packets (:meth:`~CongestionControl.on_cnp`).
Like the rest of the engine it is sans-IO: every call takes ``now`` (seconds
from the injected clock) and nothing reads a clock.

Three kinds, chosen per device (:data:`KINDS`):

* ``slow_restart`` (the default): a loss halves ``cwnd``, the part of the
  window the requester may use; each window's worth of acknowledged packets
  gives back :data:`CWND_GROWTH` packets.  Go-back-N resends everything after
  a lost packet, so the fewer are in flight when one is lost, the less is
  sent twice.  No pacing.
* ``none``: the whole window, always; no pacing.
* ``dcqcn``: the reaction point of DCQCN (Zhu et al., "Congestion Control for
  Large-Scale RDMA Deployments", SIGCOMM 2015) as ConnectX NICs run it, with
  mlx5's parameter names, units and defaults (:data:`DCQCN_PARAMS`).  A rate
  limiter, not a window: the window stays the QP's.

DCQCN's reaction point
----------------------
State: the current rate ``rc``, the target rate ``rt`` (both bit/s, starting
at the line rate) and ``alpha`` (an estimate of how congested the path is).

* **A cut**, at most one per ``rate_reduce_monitor_period``: a CNP that comes
  when the last cut is older than that cuts at once; one that comes sooner
  cuts when the period ends (more CNPs in the period change nothing more).  A
  cut sets ``rt = rc`` -- always with ``clamp_tgt_rate``, or, mlx5's default
  (``clamp_tgt_rate_after_time_inc``), only if a timer event has raised the
  rate since the last cut, so a flow cut again while it recovers keeps its
  target -- then ``rc = rc * (1 - alpha / 2**(rpg_gd - 10))`` -- with the
  default ``rpg_gd`` 11 that is the paper's ``rc(1 - alpha/2)`` -- but never
  below ``rc * rpg_min_dec_fac / 100`` nor ``rpg_min_rate``.  Alpha is raised
  at the end of the current ``dce_tcp_rtt`` period; the increase stages
  restart.  The first CNP of a flow starts from ``alpha = initial_alpha_value
  / 1024``.
* **Alpha** is updated once per ``dce_tcp_rtt``: with ``g = dce_tcp_g / 1024``,
  ``alpha = g * alpha + (1 - g)`` if a CNP arrived in the period, else
  ``alpha = g * alpha`` (the paper's ``(1-g')alpha + g'`` with ``g' = 1 - g``).
* **Increase events** come from a timer (every ``rpg_time_reset`` us without
  a CNP) and a byte counter (every ``rpg_byte_reset`` bytes sent; 0 turns it
  off, as the firmware's register description says, and its stage ``BC`` then
  stays 0 -- whether the firmware then still reaches hyper increase is not
  documented; QCN's rule, kept here, needs both stages at ``F``).  With ``T``
  and ``BC`` the timer and byte stages since the last CNP and ``F =
  rpg_threshold``: while ``max(T, BC) < F`` *fast recovery* (``rt`` kept);
  once one of them reaches ``F`` *additive increase* (``rt += rpg_ai_rate``);
  once both do, *hyper increase* (``rt += i * rpg_hai_rate``, ``i = min(T, BC)
  - F + 1``).  Every event then sets ``rc = (rt + rc) / 2``; neither passes the
  line rate.

The timers are evaluated lazily: each call first replays the deferred cuts,
alpha periods and timer stages that ended since the last one, in time order,
so no timer events are needed for them -- only the pacing wake-up
(:meth:`next_send_time`).
Pacing sends at most what ``rc`` pays for in :data:`PACE_QUANTUM` seconds (at
least one packet) at once, and then waits until ``rc`` has paid for it -- at
line rate too, as a NIC's rate limiter sits where packets leave it: nothing
queues behind it that a later cut could not slow down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

# the module, not the name: compiled, importing core first runs hca (core.pxd
# cimports HCA), which imports this module before core's body has run
from softverbs.engine import core

#: Packets a congestion window grows by per window of acknowledged packets, after a loss.
CWND_GROWTH = 16
#: A paced QP sends in one go what its rate pays for in this long (at least one
#: packet), then waits: one packet at a time at simulated rates, bursts a UDP
#: device can hand to the kernel whole (GSO) at 100 Gb/s.
PACE_QUANTUM = 5e-6


class Param:
    """One DCQCN knob: its mlx5 name, unit, range and default."""

    __slots__ = ("default", "doc", "high", "low", "name", "unit")

    def __init__(self, name: str, default: int, low: int, high: int, unit: str, doc: str) -> None:
        self.name = name
        self.default = default
        self.low = low
        self.high = high
        self.unit = unit
        self.doc = doc


#: The reaction and notification point parameters, by the names of mlx5's
#: ``roce_rp`` / ``roce_np`` knobs, with the firmware's defaults and ranges.
DCQCN_PARAMS: tuple[Param, ...] = (
    # reaction point: rate decrease
    Param("rpg_gd", 11, 10, 11, "log2, 10 fraction bits",
          "rate cut per CNP: rc *= 1 - alpha / 2**(rpg_gd - 10)"),
    Param("rpg_min_dec_fac", 50, 0, 100, "%", "one cut leaves at least this share of rc"),
    Param("rpg_min_rate", 1, 1, 400_000, "Mb/s", "the lowest rate"),
    Param("rate_reduce_monitor_period", 4, 1, 0xFFFFFFFF, "us",
          "at most one cut per this period; a CNP inside it cuts at its end"),
    Param("clamp_tgt_rate", 0, 0, 1, "bool", "every cut sets rt = rc"),
    Param("clamp_tgt_rate_after_time_inc", 1, 0, 1, "bool",
          "a cut sets rt = rc if the timer raised the rate since the last cut"),
    Param("rate_to_set_on_first_cnp", 0, 0, 400_000, "Mb/s",
          "rc and rt on a flow's first CNP (0: cut as usual)"),
    # reaction point: alpha
    Param("dce_tcp_g", 1019, 0, 1023, "1/1024", "alpha's memory per update period"),
    Param("dce_tcp_rtt", 1, 1, 131071, "us", "alpha's update period"),
    Param("initial_alpha_value", 1023, 0, 1023, "1/1024", "alpha at a flow's first CNP"),
    # reaction point: rate increase
    Param("rpg_time_reset", 300, 1, 131071, "us", "a timer increase event every this long"),
    # Bytes, 0 turning the byte counter off: mstflint's tools_open_roce_cc_ecn layout
    # ("Given in Bytes", "0 == disabled"; a 15-bit field there, so 32767 is its largest
    # value) and mlxconfig's RPG_BYTE_RESET ("Disabled=0"); mlx5_ifc.h's
    # cong_control_r_roce_ecn_rp gives it a 32-bit word, which the paper's 10 MB needs.
    Param("rpg_byte_reset", 32767, 0, 0x7FFFFFFF, "bytes",
          "a byte-counter event every this many (0: no byte counter)"),
    Param("rpg_threshold", 1, 1, 31, "events", "F: stages of fast recovery"),
    Param("rpg_ai_rate", 5, 1, 400_000, "Mb/s", "additive increase of rt per event"),
    Param("rpg_hai_rate", 50, 1, 400_000, "Mb/s", "hyper increase of rt per stage"),
    # notification point
    Param("min_time_between_cnps", 4, 0, 4095, "us",
          "at most one CNP per this long, from the port (cnp_per_port) or per QP"),
    # Not an mlx5 knob: the scope of min_time_between_cnps.  The paper spaces each
    # flow's CNPs; a firmware register description (mstflint's tools_open_roce_cc_ecn,
    # ConnectX-3 Pro era) says "from the port".  0: one interval per QP, 1: one for the
    # whole device.  Per QP by default: see docs/congestion.md for what per port does here.
    Param("cnp_per_port", 0, 0, 1, "bool",
          "min_time_between_cnps spaces the device's CNPs (1) or each QP's (0)"),
    Param("cnp_dscp", 48, 0, 63, "DSCP", "the CNP's IP DSCP"),
    Param("cnp_802p_prio", 6, 0, 7, "PCP", "the CNP's 802.1p priority (recorded, no VLANs)"),
)  # fmt: skip
PARAMS_BY_NAME: dict[str, Param] = {p.name: p for p in DCQCN_PARAMS}

#: The ECN codepoint ECN-capable packets carry (RFC 3168's ECT(0)).
ECT0 = 2
#: The congestion control kinds a device may run.
KINDS = ("slow_restart", "none", "dcqcn")


def check_params(kind: str, params: Mapping[str, int]) -> str | None:
    """Why ``kind`` with ``params`` cannot be configured, or None."""
    if kind not in KINDS:
        return f"congestion control {kind!r}: choose one of {', '.join(KINDS)}"
    if params and kind != "dcqcn":
        return f"congestion control {kind!r} takes no parameters"
    for name, value in params.items():
        p = PARAMS_BY_NAME.get(name)
        if p is None:
            return f"{name!r} is not a DCQCN parameter ({', '.join(PARAMS_BY_NAME)})"
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name} must be an integer, not {value!r}"
        if not p.low <= value <= p.high:
            return f"{name}={value} is out of range: {p.low}..{p.high} {p.unit}"
    return None


class CCConfig:
    """A device's congestion control: the kind, its parameters, the line rate."""

    __slots__ = ("ect", "kind", "line_rate", "params")

    def __init__(self, kind: str = "slow_restart", params: Mapping[str, int] | None = None,
                 line_rate: float = 100e9) -> None:  # fmt: skip
        problem = check_params(kind, params or {})
        if problem:
            raise ValueError(problem)
        self.kind = kind
        self.params = {p.name: p.default for p in DCQCN_PARAMS}
        self.params.update(params or {})
        self.line_rate = line_rate  #: bit/s: where a DCQCN flow starts and stops growing
        #: the ECN field of every packet sent: ECT(0) with DCQCN, else not ECN-capable
        self.ect = ECT0 if kind == "dcqcn" else 0

    @property
    def ecn(self) -> bool:
        """Whether this device's packets are ECN-capable and CNPs are sent (DCQCN)."""
        return self.kind == "dcqcn"

    def new(self, window: int) -> CongestionControl:
        """A fresh per-QP object of this kind for a QP with this window."""
        if self.kind == "dcqcn":
            return Dcqcn(self.params, self.line_rate)
        if self.kind == "none":
            return NoControl()
        return SlowRestart(window)


class CongestionControl:
    """The interface (see the module docstring).  Unpaced, unlimited."""

    __slots__ = ()
    kind: ClassVar[str] = ""

    def reset(self, window: int) -> None:
        """The QP was reset, or its window changed (a new path MTU)."""

    def window(self, limit: int) -> int:
        """Packets the requester may have unacknowledged, of its ``limit``."""
        return limit

    def can_send(self, now: float) -> bool:
        return True

    def next_send_time(self) -> float | None:
        """When :meth:`can_send` turns True, if it is False now."""
        return None

    def quantum(self, pmtu: int) -> int:
        """The most packets of ``pmtu`` bytes to send in one go, 0 for no limit."""
        return 0

    def on_packet_sent(self, nbytes: int, npkts: int, now: float) -> None:
        """``npkts`` packets of ``nbytes`` bytes in all left."""

    def on_ack(self, npkts: int, now: float) -> None:
        """``npkts`` packets were newly acknowledged."""

    def on_loss(self, now: float) -> None:
        """A go-back-N episode began (a NAK, a timeout, an implied NAK)."""

    def on_cnp(self, now: float) -> bool:
        """A CNP for this QP arrived; False if this kind does not react to CNPs."""
        return False

    def rate(self) -> float | None:
        """The current rate limit (bit/s), or None when unpaced."""
        return None


class NoControl(CongestionControl):
    """``none``: the whole window at once, whatever happens."""

    __slots__ = ()
    kind = "none"


class SlowRestart(CongestionControl):
    """``slow_restart``: a loss halves ``cwnd``; acknowledgements give it back."""

    __slots__ = ("cwnd", "cwnd_credit", "limit")
    kind = "slow_restart"

    def __init__(self, window: int) -> None:
        self.reset(window)

    def reset(self, window: int) -> None:
        self.limit = window
        self.cwnd = window  #: packets the requester may have unacknowledged (<= window)
        self.cwnd_credit = 0  #: acknowledged packets times CWND_GROWTH, toward growing it

    def window(self, limit: int) -> int:
        return min(self.cwnd, limit)

    def on_ack(self, npkts: int, now: float) -> None:
        if self.cwnd < self.limit:  # recovering from a loss: grow back
            credit = self.cwnd_credit + npkts * CWND_GROWTH
            step, self.cwnd_credit = divmod(credit, self.cwnd)
            self.cwnd = min(self.limit, self.cwnd + step)

    def on_loss(self, now: float) -> None:
        self.cwnd = max(core.MIN_WINDOW, min(self.cwnd, self.limit) // 2)
        self.cwnd_credit = 0


class Dcqcn(CongestionControl):
    """``dcqcn``: DCQCN's reaction point (see the module docstring)."""

    __slots__ = (
        "a_ai", "a_hai", "alpha", "alpha_at", "byte_reset", "byte_stage", "bytes_left", "clamp",
        "clamp_ati", "cnp_in_period", "cut_at", "cut_due", "cuts", "debt", "events", "first_cnp",
        "first_rate", "g", "gd",
        "initial_alpha", "line_rate", "min_dec", "min_rate", "monitor", "paid_at", "period",
        "rc", "rt", "threshold", "time_reset", "timer_at", "timer_stage",
    )  # fmt: skip
    kind = "dcqcn"

    def __init__(self, params: Mapping[str, int], line_rate: float) -> None:
        us = 1e-6
        mbps = 1e6
        self.line_rate = line_rate
        self.gd = 2.0 ** (params["rpg_gd"] - 10)
        self.min_dec = params["rpg_min_dec_fac"] / 100
        self.min_rate = min(line_rate, params["rpg_min_rate"] * mbps)
        self.monitor = params["rate_reduce_monitor_period"] * us
        self.first_rate = params["rate_to_set_on_first_cnp"] * mbps
        self.clamp = bool(params["clamp_tgt_rate"])
        self.clamp_ati = bool(params["clamp_tgt_rate_after_time_inc"])
        self.g = params["dce_tcp_g"] / 1024
        self.period = params["dce_tcp_rtt"] * us
        self.initial_alpha = params["initial_alpha_value"] / 1024
        self.time_reset = params["rpg_time_reset"] * us
        self.byte_reset = params["rpg_byte_reset"]
        self.threshold = params["rpg_threshold"]
        self.a_ai = params["rpg_ai_rate"] * mbps
        self.a_hai = params["rpg_hai_rate"] * mbps
        self.cuts = 0  #: rate cuts made (CNPs acted on)
        self.events = 0  #: rate increase events
        self.reset(0)

    def reset(self, window: int) -> None:
        self.rc = self.line_rate  #: current rate, bit/s
        self.rt = self.line_rate  #: target rate, bit/s
        self.alpha = 1.0
        self.first_cnp = True
        self.alpha_at: float | None = None  #: end of the current alpha period (None: idle)
        self.cnp_in_period = False
        self.cut_at = -math.inf  #: when the last cut was made
        self.cut_due: float | None = None  #: a CNP came inside the monitor period: cut then
        self.timer_at: float | None = None  #: next timer increase event (None: at line rate)
        self.timer_stage = 0
        self.byte_stage = 0
        self.bytes_left = self.byte_reset
        self.debt = 0.0  #: bits sent that the rate has not paid for yet
        self.paid_at = 0.0  #: the time up to which ``debt`` is paid

    # --- lazily run timers ------------------------------------------------------
    def _advance(self, now: float) -> None:
        """Replay the alpha periods and timer events that ended by ``now``, in
        time order, paying the pacing debt at the rate of each stretch."""
        while True:
            a = self.alpha_at
            t = self.timer_at
            c = self.cut_due
            if c is not None and c <= now and (a is None or c <= a) and (t is None or c <= t):
                self._pay(c)
                self.cut_due = None
                self._cut(c)
            elif a is not None and a <= now and (t is None or a <= t):
                self._pay(a)
                self._alpha_update(a)
            elif t is not None and t <= now:
                self._pay(t)
                self.timer_stage += 1
                self.timer_at = t + self.time_reset
                self._increase()
            else:
                self._pay(now)
                return

    def _pay(self, until: float) -> None:
        """The link sent at ``rc`` from ``paid_at`` to ``until``: less owed."""
        if until > self.paid_at:
            debt = self.debt - (until - self.paid_at) * self.rc
            self.debt = debt if debt >= 1.0 else 0.0
            self.paid_at = until

    def _alpha_update(self, at: float) -> None:
        g = self.g
        if self.cnp_in_period:
            self.alpha = g * self.alpha + (1 - g)
        else:
            self.alpha = g * self.alpha
        self.cnp_in_period = False
        if self.alpha < 1e-6 and self.rc >= self.line_rate:
            self.alpha_at = None  # nothing left to decay: stop until the next CNP
        else:
            self.alpha_at = at + self.period

    def _increase(self) -> None:
        """One rate increase event (timer or byte counter)."""
        self.events += 1
        f = self.threshold
        t, b = self.timer_stage, self.byte_stage
        if max(t, b) < f:
            pass  # fast recovery: rt stays
        elif min(t, b) >= f:
            self.rt += (min(t, b) - f + 1) * self.a_hai  # hyper increase
        else:
            self.rt += self.a_ai  # additive increase
        self.rt = min(self.rt, self.line_rate)
        self.rc = min(self.line_rate, (self.rt + self.rc) / 2)
        if self.rc >= self.line_rate * (1 - 1e-9):
            self.rc = self.rt = self.line_rate
            self.timer_at = None  # back at line rate: no more increase events

    # --- the interface --------------------------------------------------------------
    def rate(self) -> float | None:
        return self.rc

    def quantum(self, pmtu: int) -> int:
        return max(1, int(self.rc * PACE_QUANTUM / 8) // pmtu)

    def can_send(self, now: float) -> bool:
        self._advance(now)
        # Less than a bit owed is paid: floating-point rounding must not leave a
        # wake-up that lands on ``now`` again and again.
        return self.debt < 1.0

    def next_send_time(self) -> float | None:
        """When the debt is paid at today's rate, or the next increase event if
        that comes first (the rate it brings pays faster)."""
        paid = self.paid_at + self.debt / self.rc
        t = self.timer_at
        return paid if t is None or paid <= t else t

    def on_packet_sent(self, nbytes: int, npkts: int, now: float) -> None:
        self._advance(now)
        # Paced at rc even at line rate: the limiter is where packets leave the
        # NIC, so nothing piles up behind it that a later cut could not slow.
        self.debt += nbytes * 8
        if self.rc < self.line_rate and self.byte_reset:  # byte_reset 0: no byte counter
            self.bytes_left -= nbytes
            while self.bytes_left <= 0 and self.rc < self.line_rate:
                self.bytes_left += self.byte_reset
                self.byte_stage += 1
                self._increase()

    def on_cnp(self, now: float) -> bool:
        self._advance(now)
        self.cnp_in_period = True
        if self.alpha_at is None:
            self.alpha_at = now + self.period
        if self.cut_due is not None:
            return True  # a cut is already due at the end of the monitor period
        if now - self.cut_at < self.monitor:
            # Inside the monitor period of the last cut: the cut waits for its end
            # (mlx5 checks once per period whether a CNP came, and cuts then).
            self.cut_due = self.cut_at + self.monitor
            return True
        self._cut(now)
        return True

    def _cut(self, now: float) -> None:
        """Act on the CNPs of a monitor period: one rate cut."""
        self.cut_at = now
        self.cuts += 1
        if self.first_cnp:
            self.first_cnp = False
            self.alpha = self.initial_alpha
            if self.first_rate:
                self.rc = self.rt = max(self.min_rate, min(self.line_rate, self.first_rate))
                self._restart_stages(now)
                return
        # The target rate: the paper's rt = rc on every cut (clamp_tgt_rate), or,
        # mlx5's default, only if the timer has raised the rate since the last cut --
        # otherwise rt keeps the higher target the flow is recovering toward.
        if self.clamp or (self.clamp_ati and self.timer_stage > 0):
            self.rt = self.rc
        cut = self.rc * (1 - self.alpha / self.gd)
        self.rc = max(cut, self.rc * self.min_dec, self.min_rate)
        self._restart_stages(now)

    def _restart_stages(self, now: float) -> None:
        self.timer_stage = 0
        self.byte_stage = 0
        self.bytes_left = self.byte_reset
        self.timer_at = now + self.time_reset
