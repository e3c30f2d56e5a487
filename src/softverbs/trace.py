"""``SOFTVERBS_TRACE``: what each QP did, as JSON Lines.

A :class:`Tracer` is an :class:`~softverbs.engine.observe.Observer` of one
device: it writes one JSON object per line for every hook the engine calls
(WQEs, doorbells, packets out and in -- ACKs and NAKs among them --, the
step at which the responder or the completer was done with each packet in,
retransmissions, CQEs, state changes, asynchronous events).  Every record
has ``t`` (the time of the device's runtime clock: real time, or virtual
time in a :class:`~softverbs.sim.Simulation`), ``dev`` (the device name),
``qpn`` (the QP, when there is one) and ``kind`` (the hook's name); the
other fields depend on the kind (see ``docs/trace.md``).  The first record
of a device is ``{"kind": "device", "gids": [...]}``, so a reader can tell
which device a packet's destination GID belongs to.

When ``SOFTVERBS_TRACE`` names a file, every device this process builds
(:mod:`softverbs.verbs.registry`) gets a tracer writing to it; ``{pid}`` in
the name becomes the process id.  All devices of the process share one file.
With the variable unset nothing is attached, and each hook point of the
engine costs its one ``observer is None`` test.

``softverbs trace FILE`` (:mod:`softverbs.cli.trace`) draws a trace as an
HTML ladder diagram.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TextIO

from softverbs.enums import (
    IBV_WC_RECV,
    ibv_event_type,
    ibv_qp_state,
    ibv_qp_type,
    ibv_wc_opcode,
    ibv_wc_status,
    ibv_wr_opcode,
)
from softverbs.errors import ConfigError
from softverbs.wire.opcodes import (
    AETH_ACK,
    AETH_NAK,
    AETH_RNR_NAK,
    OPINFO,
    Hdr,
    aeth_kind,
    aeth_value,
)

if TYPE_CHECKING:
    from softverbs.engine.core import QPCore
    from softverbs.engine.hca import HCA
    from softverbs.engine.rings import CQE, CompletionRing, SendWQE
    from softverbs.fabric.runtime import Clock
    from softverbs.wire.packet import Packet

#: the environment variable naming the trace file
ENV = "SOFTVERBS_TRACE"

#: the kinds of record a trace holds (``device`` heads each device's records)
KINDS = ("device", "doorbell", "wqe_start", "packet_out", "packet_in", "step", "retransmit",
         "cqe", "state", "event")  # fmt: skip

_NAK_CODES = {0: "PSN_SEQUENCE_ERROR", 1: "INVALID_REQUEST", 2: "REMOTE_ACCESS_ERROR",
              3: "REMOTE_OPERATIONAL_ERROR", 4: "INVALID_RD_REQUEST"}  # fmt: skip
_AETH_KINDS = {AETH_ACK: "ACK", AETH_NAK: "NAK", AETH_RNR_NAK: "RNR_NAK"}


def _name(enum: Any, value: int) -> str:
    try:
        return str(enum(value).name)
    except ValueError:
        return str(value)


class TraceFile:
    """One trace file, shared by every tracer of the process that names it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # devices with their own progress threads share it
        # line-buffered: a program that hangs or is killed still leaves its trace
        self._f: TextIO | None = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._f is not None:
                self._f.write(line)

    def flush(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


class Tracer:
    """The observer of one device: every hook becomes a record in ``out``."""

    def __init__(self, out: TraceFile, hca: HCA, clock: Clock | None = None) -> None:
        self.out = out
        self.hca = hca
        self.dev = hca.name
        self.clock = clock
        import time

        self._monotonic = time.monotonic
        self._write("device", None, gids=[g.hex() for g in hca.gids], wall=time.time())

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else self._monotonic()

    def _write(self, kind: str, qpn: int | None, **fields: Any) -> None:
        record: dict[str, Any] = {"t": self._now(), "dev": self.dev, "qpn": qpn, "kind": kind}
        record.update(fields)
        self.out.write(record)

    # --- the hooks (engine.observe.Observer) -------------------------------------------
    def doorbell(self, qp: QPCore, queue: str, index: int) -> None:
        self._write("doorbell", qp.qpn, queue=queue, index=index)

    def wqe_start(self, qp: QPCore, wqe: SendWQE) -> None:
        fields: dict[str, Any] = {
            "wr_id": wqe.wr_id,
            "opcode": _name(ibv_wr_opcode, wqe.opcode),
            "length": wqe.length,
            "signaled": wqe.signaled,
        }
        if wqe.npkts:
            fields["psn"] = wqe.psn
            fields["npkts"] = wqe.npkts
        if wqe.status:
            fields["status"] = _name(ibv_wc_status, wqe.status)
            if wqe.reason:
                fields["reason"] = wqe.reason
        self._write("wqe_start", qp.qpn, **fields)

    def wqe_done(self, qp: QPCore, wqe: SendWQE) -> None:
        fields: dict[str, Any] = {"wr_id": wqe.wr_id, "opcode": _name(ibv_wr_opcode, wqe.opcode)}
        if wqe.status:
            fields["status"] = _name(ibv_wc_status, wqe.status)
        self._write("wqe_done", qp.qpn, **fields)

    def packet_out(self, qp: QPCore, pkt: Packet) -> None:
        self._write("packet_out", qp.qpn, **packet_fields(pkt))

    def packet_in(self, qp: QPCore, pkt: Packet) -> None:
        self._write("packet_in", qp.qpn, **packet_fields(pkt))

    def step(self, qp: QPCore, part: str, state: IntEnum) -> None:
        self._write("step", qp.qpn, part=part, state=state.name)

    def retransmit(self, qp: QPCore, psn: int, why: str) -> None:
        self._write("retransmit", qp.qpn, psn=psn, why=why)

    def rate(self, qp: QPCore, bps: float, why: str) -> None:
        self._write("rate", qp.qpn, bps=bps, why=why)

    def cqe(self, qp: QPCore, cq: CompletionRing, cqe: CQE) -> None:
        fields: dict[str, Any] = {
            "wr_id": cqe.wr_id,
            "status": _name(ibv_wc_status, cqe.status),
            "opcode": _name(ibv_wc_opcode, cqe.opcode),
            "byte_len": cqe.byte_len,
            "queue": "rq" if cqe.opcode & IBV_WC_RECV else "sq",
        }
        if cqe.reason:
            fields["reason"] = cqe.reason
        self._write("cqe", qp.qpn, **fields)

    def state(self, qp: QPCore, old: int, new: int) -> None:
        self._write("state", qp.qpn, old=_name(ibv_qp_state, old), new=_name(ibv_qp_state, new),
                    qp_type=_name(ibv_qp_type, qp.qp_type))  # fmt: skip

    def event(self, event_type: int, element: Any) -> None:
        qpn = getattr(element, "qpn", None)
        fields: dict[str, Any] = {"event": _name(ibv_event_type, event_type)}
        srqn = getattr(element, "srqn", None)
        if qpn is None and srqn is not None:
            fields["srqn"] = srqn
        if qpn is None and srqn is None and element is not None:
            cqn = next((n for n, c in self.hca.cqs.items() if c is element), None)
            if cqn is not None:
                fields["cqn"] = cqn
        self._write("event", qpn if isinstance(qpn, int) else None, **fields)


def packet_fields(pkt: Packet) -> dict[str, Any]:
    """A packet's (or a burst's) record fields: opcode, PSN, length, addressing."""
    info = OPINFO[pkt.opcode]
    fields: dict[str, Any] = {
        "opcode": info.name if info is not None else f"0x{pkt.opcode:02x}",
        "psn": pkt.psn,
        "length": len(pkt.payload),
        "dqpn": pkt.dqpn,
        "dgid": bytes(pkt.dgid).hex(),
    }
    if pkt.count > 1:
        fields["count"] = pkt.count
        last = getattr(pkt, "last_opcode", pkt.opcode)
        last_info = OPINFO[last]
        fields["last_opcode"] = last_info.name if last_info is not None else f"0x{last:02x}"
    if pkt.ackreq:
        fields["ackreq"] = True
    if info is None:
        return fields
    hdrs = info.hdrs
    if hdrs & Hdr.AETH:
        kind = aeth_kind(pkt.syndrome)
        fields["aeth"] = _AETH_KINDS.get(kind, f"0b{kind:02b}")
        if kind == AETH_NAK:
            value = aeth_value(pkt.syndrome)
            fields["nak"] = _NAK_CODES.get(value, str(value))
        fields["msn"] = pkt.msn
    if hdrs & (Hdr.RETH | Hdr.ATOMICETH):
        fields.update(va=pkt.va, rkey=pkt.rkey)
    if hdrs & Hdr.RETH:
        fields["dma_len"] = pkt.dma_len
    if hdrs & Hdr.ATOMICETH:
        fields.update(swap_add=pkt.swap_add, compare=pkt.compare)
    if hdrs & Hdr.ATOMICACKETH:
        fields["orig"] = pkt.orig
    if hdrs & Hdr.IMMDT:
        fields["imm"] = pkt.imm
    if hdrs & Hdr.IETH:
        fields["inv_rkey"] = pkt.inv_rkey
    if hdrs & Hdr.DETH:
        fields.update(qkey=pkt.qkey, src_qp=pkt.src_qp)
    return fields


_files: dict[str, TraceFile] = {}
_files_lock = threading.Lock()


def environment_trace() -> TraceFile | None:
    """The process's trace file for ``SOFTVERBS_TRACE`` (None: not set).

    The file is created (truncated) the first time a device is built, and
    shared by every device of the process after that.  A file that cannot be
    written is a :class:`~softverbs.errors.ConfigError` naming the variable."""
    path = os.environ.get(ENV)
    if not path:
        return None
    path = path.replace("{pid}", str(os.getpid()))
    key = os.path.abspath(path)
    with _files_lock:
        out = _files.get(key)
        if out is None:
            try:
                out = TraceFile(path)
            except OSError as exc:
                raise ConfigError(f"{ENV}: cannot write {path}: {exc.strerror}") from None
            _files[key] = out
            atexit.register(out.flush)  # not close: a device stopping at exit may still send
    return out


def trace_device(hca: HCA, clock: Clock | None) -> Tracer | None:
    """Attach a tracer to ``hca`` if ``SOFTVERBS_TRACE`` is set."""
    out = environment_trace()
    if out is None:
        return None
    from softverbs.engine.observe import attach

    tracer = Tracer(out, hca, clock)
    attach(hca, tracer)
    return tracer
