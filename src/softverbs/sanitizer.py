"""The verbs sanitizer: misuse reported the moment the device sees it (docs/sanitizer.md).

``SOFTVERBS_SANITIZE=1`` (or ``json``, each with ``:halt_on_error=1``) in a
program's environment turns it on for that program.  The checks live in the
device, in one place for every kind of client: the in-process device, a
Python program of the host device and a C program through softverbs'
``libibverbs.so.1`` all tell the device which process wants them
(``SANITIZE``, with the program's stderr), and the device writes the reports
there.  A :class:`Sanitizer` is an observer of the engine
(:mod:`softverbs.engine.observe`) and is called by :class:`~softverbs.device.core.Host`
at the control verbs that can be misused (destroying, RESET, creating a QP);
it only ever watches the QPs and objects of the processes that asked.

A report's first line is ``softverbs-sanitizer: CHECK``, details follow on
indented lines (or one JSON object per report); :data:`CHECKS` names every
check and the rule it enforces.  When no process asked, nothing is attached
and the engine pays one ``observer is None`` test per hook point.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, BinaryIO

from softverbs.engine.observe import SQ
from softverbs.engine.rings import CompletionRing, WqeState
from softverbs.engine.wr import WR_INFO, WrClass
from softverbs.enums import (
    IBV_EVENT_CQ_ERR,
    IBV_QPS_ERR,
    IBV_WC_WR_FLUSH_ERR,
    IBV_WR_LOCAL_INV,
    ibv_qp_type,
    ibv_wr_opcode,
)
from softverbs.wire.codec import crc32

if TYPE_CHECKING:
    from softverbs.engine.core import QPCore
    from softverbs.engine.rings import CQE, SendWQE
    from softverbs.wire.packet import Packet

ENV = "SOFTVERBS_SANITIZE"

#: Every check: its name (a report's first line) and the rule it enforces,
#: quoting the seed document where one states it.
CHECKS: dict[str, str] = {
    "send-buffer-changed": (
        "a send or WRITE source buffer must not change until the WR has completed: "
        "\"The Memory Regions that contain the data to be sent don't need to be "
        "destroyed/reused\" (seed 000)"
    ),
    "mr-in-use": (
        "an MR must not be deregistered while WRs that use it are outstanding (seed 000)"
    ),
    "mr-unmapped": (
        "the memory of a registered region must stay mapped, as registered, until the "
        "region is deregistered: a NIC pins the pages at registration (ib_umem_get) and "
        "never reaches whatever is mapped at those addresses later"
    ),
    "mw-in-use": (
        "a memory window must not be deallocated or invalidated while WRs that use it are "
        "outstanding: a BIND_MW WR that names it, or a peer's RDMA WRITE in progress "
        "through its rkey"
    ),
    "ah-in-use": (
        "\"For UD QPs, Address Handles to the remote side don't need to be "
        "destroyed/reused\" while WRs that use them are outstanding (seed 000)"
    ),
    "unsignaled-send-queue": (
        "\"he must make sure that occasionally (before the Send Queue is full with "
        "outstanding Send Requests) a Send Request that generate Work Completion will "
        "be posted\" (seed 000)"
    ),
    "send-queue-full": (
        "a send slot is freed only when a CQE of its WR, or of a later WR of the same "
        "send queue, is polled (seed 000)"
    ),
    "cq-too-small": (
        "a CQ must hold every completion that may come: the WRs posted to the queues "
        "attached to it and not yet completed, and the completions not yet polled"
    ),
    "cq-overrun": (
        "a CQ that overruns is in error, and so is every QP that uses it"
    ),
    "qp-destroyed-while-flushing": (
        "\"move the QP to error, wait until all messages are flushed, and only then "
        "destroy the QP\": destroying it stops the flush (seed 001)"
    ),
    "srq-qp-destroyed-early": (
        "a QP attached to an SRQ is destroyed after IBV_EVENT_QP_LAST_WQE_REACHED, or "
        "the receive WQE it took from the SRQ is lost (seed 001)"
    ),
    "deferred-wr-never-rung": (
        "\"all initiator request chains will be terminated by an initiator request that "
        "does not set the NDK_OP_FLAG_DEFER flag\" (seed 003)"
    ),
    "leak": "every object is destroyed, every WR completed and every CQE polled before exit",
}


class SanitizeError(ValueError):
    """A malformed ``SOFTVERBS_SANITIZE`` value (the message says what is wrong)."""


@dataclass(frozen=True)
class Options:
    """What ``SOFTVERBS_SANITIZE`` asks for."""

    json: bool = False
    halt_on_error: bool = False
    #: report objects left at exit (as ASan's detect_leaks); a Python client
    #: turns it off unless asked (:func:`for_python`)
    detect_leaks: bool = True
    #: seconds deferred WRs may wait unrung while the program goes on posting
    deferred_timeout: float = 5.0


def parse(value: str) -> Options | None:
    """``SOFTVERBS_SANITIZE``'s value: None when off (unset, ``0``, empty).

    ``1`` or ``json``, then ``:name=value`` options (``halt_on_error=0|1``)."""
    value = value.strip()
    if value in ("", "0"):
        return None
    mode, *opts = value.split(":")
    if mode not in ("1", "json"):
        raise SanitizeError(f"{ENV}={value!r}: the mode must be 1 or json, not {mode!r}")
    flags = {"halt_on_error": False, "detect_leaks": True}
    timeout = Options.deferred_timeout
    for opt in opts:
        name, eq, v = opt.partition("=")
        if name == "deferred_timeout" and eq:
            try:
                timeout = float(v)
            except ValueError:
                timeout = -1.0
            if not 0 < timeout < 1e6:
                raise SanitizeError(f"{ENV}={value!r}: deferred_timeout={v!r} is not a number "
                                    "of seconds")
            continue
        if name not in flags or not eq or v not in ("0", "1"):
            raise SanitizeError(f"{ENV}={value!r}: unknown option {opt!r} (the options are "
                                "halt_on_error=0|1, detect_leaks=0|1 and "
                                "deferred_timeout=SECONDS)")
        flags[name] = v == "1"
    return Options(json=mode == "json", deferred_timeout=timeout, **flags)


def for_python(value: str) -> str:
    """``value`` as a Python program's client sends it: ``detect_leaks=0``
    unless the user asked for it.  A Python program commonly leaves the
    objects it still holds to its exit, and an object still referenced at exit
    is not a leak (LeakSanitizer, too, reports only what nothing reaches)."""
    return value if "detect_leaks" in value else value + ":detect_leaks=0"


def from_environment() -> str | None:
    """``SOFTVERBS_SANITIZE`` if it turns the sanitizer on (checked: ConfigError
    names the variable when it is malformed), else None."""
    from softverbs.errors import ConfigError

    value = os.environ.get(ENV, "")
    try:
        return value if parse(value) is not None else None
    except SanitizeError as exc:
        raise ConfigError(str(exc)) from None


# --- where a report goes ---------------------------------------------------------------------
@dataclass
class Watch:
    """One process that asked for the sanitizer: where its reports go."""

    out: BinaryIO  #: the program's stderr
    options: Options
    pid: int
    local: bool  #: the program is this process: its Python stack is the place
    reports: int = 0
    halted: bool = False
    #: (qpn, index) -> the program's stack at the post (local programs)
    sites: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    said: set[tuple[str, int]] = field(default_factory=set)  #: once-only reports given

    def report(self, check: str, details: list[tuple[str, str]],
               where: Iterable[str] = ()) -> None:
        """Write one report (and stop the program if halt_on_error)."""
        if self.halted:
            return  # the program was stopped at its first report
        self.reports += 1
        where = list(where)
        if self.options.json:
            obj = {"sanitizer": "softverbs", "check": check, "rule": CHECKS[check],
                   "pid": self.pid, **dict(details), "where": where}
            text = json.dumps(obj) + "\n"
        else:
            lines = [f"softverbs-sanitizer: {check}", f"    rule: {CHECKS[check]}"]
            lines += [f"    {k}: {v}" for k, v in details]
            if where:
                lines.append("    where:")
                lines += [f"      {w}" for w in where]
            text = "\n".join(lines) + "\n"
        try:
            self.out.write(text.encode())
            self.out.flush()
        except (OSError, ValueError):
            pass  # the program closed its stderr: nowhere to say it
        if self.options.halt_on_error:
            self.halted = True
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGABRT)

    def once(self, check: str, key: int) -> bool:
        """True the first time ``check`` is reported for ``key``."""
        if (check, key) in self.said:
            return False
        self.said.add((check, key))
        return True


_here: Watch | None = None


def report_here(check: str, details: list[tuple[str, str]]) -> None:
    """A report this process makes itself (the driver's side: a post refused
    with ENOMEM), when ``SOFTVERBS_SANITIZE`` asks for reports."""
    global _here
    try:
        options = parse(os.environ.get(ENV, ""))
    except SanitizeError:
        return  # the device refused it already, naming the variable
    if options is None:
        return
    if _here is None or _here.options != options:
        _here = Watch(sys.stderr.buffer, options, os.getpid(), True)
    if _here.once(check, hash(details[0])):
        _here.report(check, details, python_site())


def python_site(skip_softverbs: bool = True) -> list[str]:
    """The calling program's stack, innermost last, without softverbs' own frames."""
    here = os.path.dirname(os.path.abspath(__file__))
    frames = [f for f in traceback.extract_stack()
              if not (skip_softverbs and os.path.abspath(f.filename).startswith(here))]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames[-4:]]


def c_site(pid: int, address: int) -> list[str]:
    """A C caller's address as ``0xADDR in MODULE+0xOFFSET`` (from /proc/PID/maps)."""
    if not address:
        return []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= address < hi and len(parts) >= 6:
                    path = parts[5]
                    return [f"{address:#x} in {os.path.basename(path)}"
                            f"+{address - _base(pid, path):#x}"]
    except (OSError, ValueError):
        pass
    return [f"{address:#x}"]


def _base(pid: int, path: str) -> int:
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == path:
                lo = int(parts[0].split("-")[0], 16)
                return lo - int(parts[2], 16)
    return 0


def _qp_line(qp: Any) -> str:
    tname = ibv_qp_type(qp.qp_type).name.replace("IBV_QPT_", "")
    return f"{qp.qpn:#x} ({tname})"


def _op_name(opcode: int) -> str:
    try:
        return ibv_wr_opcode(opcode).name
    except ValueError:
        return str(opcode)


# --- the checks ------------------------------------------------------------------------------
class Sanitizer:
    """The device's sanitizer: an engine observer plus the Host's control-verb checks.

    ``watches`` maps an owner (:class:`~softverbs.device.core.Owner`) to its
    :class:`Watch`; everything of other owners is ignored."""

    def __init__(self) -> None:
        self.watches: dict[Any, Watch] = {}
        #: id(QP engine) -> {WQE index: (crc, bytes)} taken at the doorbell
        self._sums: dict[int, dict[int, tuple[int, int]]] = {}
        self._unsignaled: dict[int, int] = {}  #: id(QP engine) -> unsignaled WQEs in a row
        self._seen: dict[int, int] = {}  #: id(QP engine) -> the doorbell last looked at
        #: id(QP engine) -> (its doorbell, when WRs were first seen written past it)
        self._unrung_since: dict[int, tuple[int, float]] = {}

    def watch_of(self, qp: Any) -> Watch | None:
        rec = getattr(qp, "owner", None)
        return self.watches.get(getattr(rec, "owner", None)) if rec is not None else None

    def _where(self, w: Watch, qp: Any, wqe: SendWQE) -> list[str]:
        site = w.sites.get((qp.qpn, wqe.index))
        if site is not None:
            return site
        return c_site(w.pid, wqe.caller)

    # --- engine hooks ------------------------------------------------------------------------
    def doorbell(self, qp: QPCore, queue: str, index: int) -> None:
        w = self.watch_of(qp)
        if w is None:
            return
        self._cq_pressure(w, qp)
        self._deferred_too_long(w, qp.owner.owner)
        if queue != SQ or qp.sq is None:
            return
        sums = self._sums.setdefault(id(qp), {})
        seen = self._seen.get(id(qp), max(0, index - qp.sq.size))
        self._seen[id(qp)] = index
        site = python_site() if w.local else None
        run = self._unsignaled.get(id(qp), 0)
        for i in range(seen, index):
            wqe = qp.sq.get(i)
            if site is not None:
                w.sites[(qp.qpn, i)] = site
            if wqe.opcode in _INVALIDATING:
                self._invalidating(w, qp, wqe)
            sums[i] = self._checksum(qp, wqe)
            run = 0 if wqe.signaled or qp.sq_sig_all else run + 1
            if run >= qp.sq.size and w.once("unsignaled-send-queue", qp.qpn):
                w.report("unsignaled-send-queue", [
                    ("qp", _qp_line(qp)),
                    ("send queue", f"{run} unsignaled WRs in a row fill all {qp.sq.size} "
                                   "slots (max_send_wr)"),
                    ("result", "no completion can ever free a slot: every later post fails "
                               "with ENOMEM until the QP is reset"),
                    ("fix", "signal at least one WR in every max_send_wr posts and poll "
                            "its completion"),
                ], self._where(w, qp, wqe))
        self._unsignaled[id(qp)] = run

    @staticmethod
    def _checksum(qp: Any, wqe: SendWQE) -> tuple[int, int]:
        """CRC of what a SEND or WRITE will send (0, -1 if not one, or not resolvable)."""
        if wqe.inline is not None or WR_INFO[wqe.opcode].klass not in (WrClass.SEND,
                                                                        WrClass.WRITE):
            return 0, -1
        crc, total = 0, 0
        for addr, length, lkey in wqe.sges:
            view = qp.hca.keys.local(lkey, qp.pd, addr, length, False)
            if isinstance(view, str):
                return 0, -1
            crc = crc32(view, crc)
            total += length
        return crc, total

    def wqe_start(self, qp: QPCore, wqe: SendWQE) -> None:
        pass

    def wqe_done(self, qp: QPCore, wqe: SendWQE) -> None:
        sums = self._sums.get(id(qp))
        if sums is None:
            return
        before = sums.pop(wqe.index, None)
        w = self.watch_of(qp)
        site = w.sites.pop((qp.qpn, wqe.index), None) if w is not None else None
        if w is None or before is None or before[1] < 0 or wqe.state != WqeState.DONE:
            return
        after = self._checksum(qp, wqe)
        if after[1] >= 0 and after != before:
            w.report("send-buffer-changed", [
                ("qp", _qp_line(qp)),
                ("wr", f"wr_id {wqe.wr_id:#x}, {_op_name(wqe.opcode)}, {wqe.length} bytes"),
                ("buffer", ", ".join(f"lkey {k:#x} [{a:#x}, {a + n:#x})"
                                     for a, n, k in wqe.sges)),
                ("seen", f"CRC-32 {before[0]:#010x} when posted, {after[0]:#010x} when "
                         "the device finished with it"),
            ], site or c_site(w.pid, wqe.caller))

    def packet_out(self, qp: QPCore, pkt: Packet) -> None:
        pass

    def packet_in(self, qp: QPCore, pkt: Packet) -> None:
        pass

    def step(self, qp: QPCore, part: str, state: IntEnum) -> None:
        pass

    def retransmit(self, qp: QPCore, psn: int, why: str) -> None:
        pass

    def rate(self, qp: QPCore, bps: float, why: str) -> None:
        pass

    def cqe(self, qp: QPCore, cq: CompletionRing, cqe: CQE) -> None:
        pass

    def state(self, qp: QPCore, old: int, new: int) -> None:
        pass

    def event(self, event_type: int, element: Any) -> None:
        if event_type != IBV_EVENT_CQ_ERR or not isinstance(element, CompletionRing):
            return
        rec = element.owner
        w = self.watches.get(getattr(rec, "owner", None))
        if w is None:
            return
        feeders = self.feeders(rec)
        need = sum(d for _, d in feeders)
        w.report("cq-overrun", [
            ("cq", f"handle {rec.handle}, cqe {element.capacity}, "
                   f"{element.capacity} completions not polled"),
            ("filled by", ", ".join(name for name, _ in feeders) or "no queue"),
            ("size", f"the queues attached can hold {need} WRs: create the CQ with "
                     f"cqe >= {need}, or poll it more often"),
        ], python_site() if w.local else [])

    # --- the Host's control verbs ------------------------------------------------------------
    @staticmethod
    def feeders(cq_rec: Any) -> list[tuple[str, int]]:
        """The queues that complete into CQ ``cq_rec``: (description, depth)."""
        cq = cq_rec.engine
        found: dict[str, int] = {}
        for o in cq_rec.owner.objects.values():
            eng = o.engine
            if o.kind_name == "qp" and eng is not None and o.info is not None:
                caps = o.info.caps
                if eng.send_cq is cq and eng.sq is not None:
                    found[f"QP {eng.qpn:#x} send queue ({caps.max_send_wr})"] = caps.max_send_wr
                if eng.recv_cq is cq and eng.rq is not None:
                    found[f"QP {eng.qpn:#x} receive queue ({caps.max_recv_wr})"] = \
                        caps.max_recv_wr
                srq = eng.srq  # its receives complete into the QP's CQ, unless it has one
                if eng.recv_cq is cq and srq is not None and getattr(srq, "cq", None) is None:
                    found[f"SRQ {srq.srqn:#x} ({srq.size})"] = srq.size
            elif o.kind_name == "srq" and eng is not None and getattr(eng, "cq", None) is cq:
                found[f"SRQ {eng.srqn:#x} ({eng.size})"] = eng.size
        out = list(found.items())
        return out

    def _cq_pressure(self, w: Watch, qp: Any) -> None:
        """After a post: can the CQs of ``qp`` still hold what may complete into them?"""
        for cq in {id(c): c for c in (qp.send_cq, qp.recv_cq) if c is not None}.values():
            rec = cq.owner
            if rec is None or not w.once("cq-too-small", rec.handle):
                continue
            users = [q for q in qp.hca.qps.values() if q.send_cq is cq or q.recv_cq is cq]
            pending = sum(_may_complete(q, cq) for q in users)
            unpolled = cq.waiting()
            if pending + unpolled <= cq.capacity:
                w.said.discard(("cq-too-small", rec.handle))  # not yet: look again next time
                continue
            feeders = self.feeders(rec)
            need = sum(d for _, d in feeders)
            w.report("cq-too-small", [
                ("cq", f"handle {rec.handle}, cqe {cq.capacity}"),
                ("outstanding", f"{pending} posted WRs will complete into it and {unpolled} "
                                "completions wait to be polled: more than it holds"),
                ("attached", ", ".join(n for n, _ in feeders)),
                ("size", f"the queues attached hold {need} WRs: create it with cqe >= {need}, "
                         "or post fewer WRs between polls"),
            ], python_site() if w.local else [])

    def _outstanding(self, owner: Any) -> Iterable[tuple[Any, SendWQE | Any, str]]:
        """Every WQE of ``owner``'s QPs the device has not finished: (qp, wqe, queue)."""
        for o in list(owner.objects.values()):
            eng = o.engine
            if o.kind_name != "qp" or eng is None:
                continue
            if eng.sq is not None:
                for wqe in eng.comp.inflight:
                    if wqe.state in (WqeState.QUEUED, WqeState.ACTIVE):
                        yield eng, wqe, "send"
                for i in range(eng.req.sq_next, eng.sq.db):
                    yield eng, eng.sq.get(i), "send"
                for i in range(eng.sq.db, eng.sq.posted()):  # written, not rung
                    try:
                        yield eng, eng.sq.slots.read(i), "send"
                    except ValueError:  # a slot the program corrupted
                        continue
            if eng.rq is not None:
                for i in range(eng.resp.rq_next, eng.rq.db):
                    yield eng, eng.rq.get(i), "receive"

    def unmapped(self, key: Any, why: str) -> None:
        """A region's memory was found unmapped or replaced (the key table saw it at an
        access, which failed): told to the process that registered it."""
        rec = key.owner
        w = self.watches.get(getattr(rec, "owner", None))
        if w is None or not w.once("mr-unmapped", key.key):
            return
        w.report("mr-unmapped", [
            ("object", f"MR lkey {key.key:#x} [{key.iova:#x}, {key.iova + key.length:#x})"),
            ("access", why),
            ("fix", "deregister the region (ibv_dereg_mr) before unmapping its memory, or "
                    "register it with IBV_ACCESS_ON_DEMAND to follow the mapping"),
        ])  # fmt: skip

    def destroying(self, rec: Any) -> None:
        """An object is about to be destroyed (or a QP moved to RESET: ``reset``)."""
        w = self.watches.get(rec.owner)
        if w is None or rec.engine is None:
            return
        kind = rec.kind_name
        if kind == "mr":
            key = rec.engine.key
            # send WRs only: a receive still posted at teardown reads nothing
            users = [(qp, wqe, q) for qp, wqe, q in self._outstanding(rec.owner)
                     if q == "send" and any(k == key for _, _, k in wqe.sges)]
            if users:
                self._in_use(w, "mr-in-use", f"MR lkey {key:#x} [{rec.engine.iova:#x}, "
                             f"{rec.engine.iova + rec.engine.length:#x})", users)
        elif kind == "mw":
            key = rec.engine.key
            users = [(qp, wqe, q) for qp, wqe, q in self._outstanding(rec.owner)
                     if q == "send" and getattr(wqe, "bind_mw", 0) == rec.handle]
            writes = [qp for qp in list(rec.device.hca.qps.values())
                      if getattr(qp, "resp", None) is not None and qp.resp.wview is not None
                      and qp.resp.wkey == key]
            if users:
                self._in_use(w, "mw-in-use", f"MW rkey {key:#x}", users)
            elif writes:
                w.report("mw-in-use", [
                    ("object", f"MW rkey {key:#x} destroyed"),
                    ("outstanding", f"QP {writes[0].qpn:#x} is receiving an RDMA WRITE "
                                    "through it, not yet complete"),
                    ("fix", "deallocate it once the peer's operations through it are done"),
                ], python_site() if w.local else [])
        elif kind == "ah":
            users = [(qp, wqe, q) for qp, wqe, q in self._outstanding(rec.owner)
                     if q == "send" and getattr(wqe, "ah", 0) == rec.handle]
            if users:
                self._in_use(w, "ah-in-use", f"AH handle {rec.handle}", users)
        elif kind == "qp":
            self.leaving(rec, "destroyed")

    def leaving(self, rec: Any, how: str) -> None:
        """QP ``rec`` is destroyed or moved to RESET (``how``): what it strands."""
        w = self.watches.get(rec.owner)
        eng = rec.engine
        if w is None or eng is None:
            return
        for table in (self._sums, self._unsignaled, self._seen, self._unrung_since):
            table.pop(id(eng), None)
        if eng.state == IBV_QPS_ERR and how == "destroyed":  # RESET discards on purpose
            unpolled = sum(_unpolled(cq, eng.qpn, flushed=True)
                           for cq in {id(c): c for c in (eng.send_cq, eng.recv_cq)
                                      if c is not None}.values())
            if unpolled:
                w.report("qp-destroyed-while-flushing", [
                    ("qp", f"{_qp_line(eng)} {how} in IBV_QPS_ERR"),
                    ("flush", f"{unpolled} flushed completion(s) of this QP were not yet "
                              "polled: they are discarded, the program never sees them"),
                    ("fix", "poll until every outstanding WR has its completion, then "
                            "destroy the QP"),
                ], python_site() if w.local else [])
        if eng.srq is not None and eng.resp.rqe is not None:
            w.report("srq-qp-destroyed-early", [
                ("qp", f"{_qp_line(eng)} {how}"),
                ("lost", f"the receive WQE wr_id {eng.resp.rqe.wr_id:#x} it took from SRQ "
                         f"{eng.srq.srqn:#x} for a message in progress"),
                ("fix", "move the QP to IBV_QPS_ERR, wait for "
                        "IBV_EVENT_QP_LAST_WQE_REACHED, then destroy it"),
            ], python_site() if w.local else [])
        if eng.sq is not None:
            self._unrung(w, eng, how)

    def _invalidating(self, w: Watch, qp: Any, wqe: SendWQE) -> None:
        """A LOCAL_INV posted for an rkey a peer is writing through, mid-message."""
        writes = [q for q in list(qp.hca.qps.values()) if getattr(q, "resp", None) is not None
                  and q.resp.wview is not None and q.resp.wkey == wqe.inv_rkey]
        if writes:
            w.report("mw-in-use", [
                ("object", f"rkey {wqe.inv_rkey:#x} invalidated by LOCAL_INV wr_id "
                           f"{wqe.wr_id:#x} on QP {qp.qpn:#x}"),
                ("outstanding", f"QP {writes[0].qpn:#x} is receiving an RDMA WRITE "
                                "through it, not yet complete"),
                ("fix", "invalidate it once the peer's operations through it are done"),
            ], self._where(w, qp, wqe))

    def _deferred_too_long(self, w: Watch, owner: Any) -> None:
        """At each doorbell of the program: has a QP held deferred WRs unrung
        for longer than ``deferred_timeout`` while the program went on?"""
        now = time.monotonic()
        for o in list(owner.objects.values()):
            eng = o.engine
            if o.kind_name != "qp" or eng is None or eng.sq is None:
                continue
            sq = eng.sq
            if sq.posted() <= sq.db:
                self._unrung_since.pop(id(eng), None)
                continue
            since = self._unrung_since.get(id(eng))
            if since is None or since[0] != sq.db:
                self._unrung_since[id(eng)] = (sq.db, now)
            elif now - since[1] > w.options.deferred_timeout:
                self._unrung(w, eng, f"holds them unrung for {now - since[1]:.1f} s")

    def _unrung(self, w: Watch, eng: Any, how: str) -> None:
        sq = eng.sq
        unrung = sq.posted() - sq.db
        if unrung > 0 and w.once("deferred-wr-never-rung", eng.qpn):
            wr_ids = [sq.peek_wr_id(i) for i in range(sq.db, sq.db + min(unrung, 8))]
            w.report("deferred-wr-never-rung", [
                ("qp", f"{_qp_line(eng)} {how}"),
                ("unrung", f"{unrung} WR(s) written to the send queue and never handed to "
                           "the device (the doorbell was not rung after them)"),
                ("wr_ids", ", ".join(f"{x:#x}" if x is not None else "?" for x in wr_ids)),
                ("fix", "end every chain of deferred WRs with a post that is not deferred"),
            ], [])

    def _in_use(self, w: Watch, check: str, what: str,
                users: list[tuple[Any, Any, str]]) -> None:
        first_qp, first, _ = users[0]
        w.report(check, [
            ("object", f"{what} destroyed"),
            ("outstanding", f"{len(users)} WR(s) use it, first: QP {first_qp.qpn:#x} "
                            f"wr_id {first.wr_id:#x}"),
            ("fix", "wait for the completion of the last WR that uses it (or of a later "
                    "signaled WR), then destroy it"),
        ], python_site() if w.local else self._where(w, first_qp, first)
            if hasattr(first, "caller") else [])

    def closing(self, owner: Any) -> None:
        """The owner's program exits: deferred WRs never rung, and leaks."""
        w = self.watches.get(owner)
        if w is None:
            return
        for o in list(owner.objects.values()):
            if o.kind_name == "qp" and o.engine is not None and o.engine.sq is not None:
                self._unrung(w, o.engine, "left at exit")
        leaked = [o for o in owner.objects.values() if o.kind_name not in ("ctx", "capture")]
        if leaked and w.options.detect_leaks:
            details = [("objects", f"{len(leaked)} never destroyed")]
            for o in sorted(leaked, key=lambda r: r.handle)[:20]:
                details.append((o.kind_name, _describe(o)))
            w.report("leak", details, [])
        self.watches.pop(owner, None)


_INVALIDATING = frozenset({IBV_WR_LOCAL_INV})


def _may_complete(qp: Any, cq: CompletionRing) -> int:
    """How many posted WRs of ``qp`` will make a CQE in ``cq``: signaled send
    WQEs not yet finished, receive WQEs not yet used.  A receive counts from its
    post (the ring's ``pi``), not from when the device took its doorbell: on the
    host device a send queue's doorbell may reach the service first, and its
    completion would otherwise take the place of receives posted before it."""
    n = 0
    if qp.send_cq is cq and qp.sq is not None:
        signaled = qp.sq_sig_all
        n += sum(1 for wqe in qp.comp.inflight if signaled or wqe.signaled)
        n += sum(1 for i in range(qp.req.sq_next, qp.sq.db) if signaled or qp.sq.get(i).signaled)
    if qp.recv_cq is cq and qp.rq is not None:
        n += qp.rq.posted() - qp.resp.rq_next
    return n


def _unpolled(cq: CompletionRing, qpn: int, flushed: bool) -> int:
    """How many CQEs of QP ``qpn`` wait in ``cq`` (only WR_FLUSH_ERR ones if ``flushed``)."""
    n = 0
    for i in cq.unpolled():
        c = cq.slots.read(i)
        if c.qp_num == qpn and not c.dead and (not flushed or c.status == IBV_WC_WR_FLUSH_ERR):
            n += 1
    return n


def _describe(o: Any) -> str:
    eng = o.engine
    text = f"handle {o.handle}"
    if o.kind_name == "qp" and eng is not None:
        text += f", QP {_qp_line(eng)}"
        if eng.sq is not None:
            open_ = eng.sq.posted() - eng.req.sq_next + len(eng.comp.inflight)
            if open_:
                text += f", {open_} send WR(s) not completed"
    elif o.kind_name == "cq" and eng is not None:
        waiting = eng.waiting()
        if waiting:
            text += f", {waiting} CQE(s) never polled"
    elif o.kind_name == "mr" and eng is not None:
        text += f", lkey {eng.key:#x}, {eng.length} bytes"
    return text
