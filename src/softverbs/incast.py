"""An N:1 incast of long RC WRITEs through a simulated switch, measured.

:func:`run_incast` builds a :class:`~softverbs.sim.Simulation` with a
:class:`~softverbs.fabric.switch.Topology`: ``senders`` devices ``s1``..
``sN`` and one receiver ``r``, every link of the same bandwidth, so the
switch's port toward ``r`` is the bottleneck.  Each sender connects one RC
QP to its own QP on ``r`` and keeps ``depth`` WRITEs of ``message`` bytes
posted for ``duration`` virtual seconds (path MTU ``mtu``), with the same
pyverbs calls a program makes.  All devices run the congestion control
``cc``.  With ``Topology(pfc=True)`` the fabric is lossless: the switch
pauses a sender instead of dropping (see :mod:`softverbs.fabric.switch`).

What it measures (:class:`IncastResult`), over the *last half* of the run
(the steady state; the first half includes the start, when every sender
begins at line rate):

* ``utilisation``: bytes the bottleneck port sent (on the wire: headers,
  preamble and gap included) over what the link could have sent;
* ``jain``: Jain's fairness index of the senders' shares of them,
  ``(sum x)**2 / (n * sum x**2)`` (1 is perfectly fair, 1/n is one sender);
* ``queue_p50`` / ``queue_p99``: the bottleneck queue (bytes) as arriving
  packets found it;
* ``drops`` (tail drops at the switch), ``retransmits`` (request packets sent
  more than once: every packet sent minus the PSNs used), ``cnps`` (CNPs
  the receiver sent) and ``pauses`` (PFC PAUSE frames the switch sent), over
  the whole run.

The series for a plot: each sender's throughput through the bottleneck per
``bin`` seconds (:attr:`IncastResult.throughput`), each sender's DCQCN rate
limit (:attr:`IncastResult.rates`) and the queue every ``step``
(:attr:`IncastResult.queue`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    AHAttr,
    Context,
    GlobalRoute,
    QPAttr,
    QPCap,
    QPInitAttr,
    SendWR,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QPT_RC,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_WRITE,
    bytes_to_mtu,
)
from softverbs.fabric.switch import Topology
from softverbs.sim import Simulation

ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE


@dataclass
class IncastResult:
    """What one incast run measured (see the module docstring)."""

    senders: int
    cc: str
    duration: float
    kmax: int
    pfc: bool = False  #: the fabric was lossless (priority flow control)
    utilisation: float = 0.0
    jain: float = 0.0
    queue_p50: int = 0
    queue_p99: int = 0
    drops: int = 0
    pauses: int = 0  #: PFC PAUSE frames the switch sent (a lossless fabric)
    marks: int = 0
    retransmits: int = 0
    cnps: int = 0
    cnps_handled: int = 0
    ecn_marked: int = 0  #: CE-marked packets the receiver got (np_ecn_marked_roce_packets)
    sent_packets: int = 0
    completed: int = 0  #: WRITEs completed, all senders
    throughput: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    rates: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    queue: list[tuple[float, int]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The result as one JSON object (``bench_incast.py --json``)."""
        return {
            "senders": self.senders, "cc": self.cc, "utilisation": round(self.utilisation, 4),
            "jain": round(self.jain, 4), "queue_p50": self.queue_p50,
            "queue_p99": self.queue_p99, "kmax": self.kmax, "drops": self.drops,
            "retransmits": self.retransmits, "cnps": self.cnps, "pfc": self.pfc,
            "pauses": self.pauses, "marks": self.marks,
            "sent_packets": self.sent_packets, "duration": self.duration,
        }  # fmt: skip


def percentile(values: list[int], q: float) -> int:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; 0 if empty."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def jain(shares: list[float]) -> float:
    """Jain's fairness index of ``shares`` (1.0 for no shares)."""
    total = sum(shares)
    squares = sum(x * x for x in shares)
    return 1.0 if squares == 0 else total * total / (len(shares) * squares)


def run_incast(
    senders: int,
    cc: str,
    *,
    duration: float = 0.02,
    topology: Topology | None = None,
    cc_params: dict[str, int] | None = None,
    message: int = 1 << 20,
    depth: int = 2,
    step: float = 20e-6,
    bin: float = 500e-6,
    timeout: int = 12,
    mtu: int = 4096,
    stagger: float = 0.0,
) -> IncastResult:
    """Run one incast (see the module docstring); ``timeout`` is the QPs' ACK
    timeout exponent (4.096 us * 2**timeout).  Sender ``i`` (from 0) posts its
    first WRITE ``i * stagger`` seconds in (rounded up to ``step``): 0 starts
    them all in the same microsecond, the hardest case."""
    topo = topology or Topology()
    topo.record = True
    names = [f"s{i + 1}" for i in range(senders)]
    path_mtu = bytes_to_mtu(mtu)
    res = IncastResult(senders, cc, duration, topo.kmax, topo.pfc)
    with Simulation(devices=(*names, "r"), topology=topo, cc=cc, cc_params=cc_params,
                    mtu=mtu) as sim:  # fmt: skip
        rctx = Context(name="r")
        rpd = PD(rctx)
        rcq = CQ(rctx, 16)
        flows = []
        for name in names:
            ctx = Context(name=name)
            pd = PD(ctx)
            cq = CQ(ctx, 4 * depth)
            qp = QP(pd, QPInitAttr(qp_type=IBV_QPT_RC, scq=cq, rcq=cq,
                                   cap=QPCap(depth, 1, 1, 1)))  # fmt: skip
            rqp = QP(rpd, QPInitAttr(qp_type=IBV_QPT_RC, scq=rcq, rcq=rcq,
                                     cap=QPCap(1, 1, 1, 1)))  # fmt: skip
            mr = MR(pd, message, ACCESS)
            rmr = MR(rpd, message, ACCESS)
            _connect(qp, ctx, rqp, rctx, timeout, path_mtu)
            _connect(rqp, rctx, qp, ctx, timeout, path_mtu)
            flows.append((name, ctx, cq, qp, mr, rmr))
        hcas = {name: sim.registry.open(name).hca for name in (*names, "r")}
        outstanding = dict.fromkeys(names, 0)
        engines = {}
        for name, _ctx, _cq, qp, _mr, _rmr in flows:
            hca = hcas[name]
            assert hca is not None
            engines[name] = hca.qps[qp.qp_num]
            res.rates[name] = []
        bottleneck = sim.port("r")
        t = 0.0
        while t < duration:
            for i, (name, _ctx, _cq, qp, mr, rmr) in enumerate(flows):
                # (1e-12: ``t`` is a sum of steps, rounded)
                while outstanding[name] < depth and t >= i * stagger - 1e-12:
                    wr = SendWR(0, IBV_WR_RDMA_WRITE, 1, sg=[SGE(mr.buf, message, mr.lkey)])
                    wr.set_wr_rdma(rmr.rkey, rmr.buf)
                    qp.post_send(wr)
                    outstanding[name] += 1
            t = min(duration, t + step)
            sim.run(max(0.0, t - sim.now))
            for name, _ctx, cq, _qp, _mr, _rmr in flows:
                n, wcs = _poll_nowait(cq)
                for wc in wcs:
                    if wc.status != IBV_WC_SUCCESS:
                        raise RuntimeError(f"{name}: a WRITE failed: {wc}")
                outstanding[name] -= n
                res.completed += n
                rate = engines[name].req.cc.rate()
                res.rates[name].append((sim.now, topo.bandwidth if rate is None else rate))
            res.queue.append((sim.now, bottleneck.occupancy(sim.now)))
        port = sim.port("r")
        half = duration / 2
        assert port.departed is not None and port.samples is not None
        gid_name = {hcas[n].gids[1]: n for n in names}  # type: ignore[union-attr]
        late = dict.fromkeys(names, 0.0)
        bins: dict[str, dict[int, int]] = {n: {} for n in names}
        rate = topo.bandwidth / 8  # bytes per second
        for when, sgid, size in port.departed:
            src = gid_name.get(sgid)
            if src is None or when > duration:
                continue
            b = int(when / bin)
            bins[src][b] = bins[src].get(b, 0) + size
            # the part of its transmission inside the last half
            late[src] += min(size, max(0.0, when - half) * rate)
        res.throughput = {
            n: [(b * bin, bins[n].get(b, 0) * 8 / bin) for b in range(int(duration / bin))]
            for n in names
        }
        res.utilisation = sum(late.values()) * 8 / (topo.bandwidth * (duration - half))
        res.jain = jain(list(late.values()))
        qs = [q for when, q in port.samples if half <= when <= duration]
        res.queue_p50 = percentile(qs, 0.5)
        res.queue_p99 = percentile(qs, 0.99)
        ports = sim.runtime.ports()  # type: ignore[attr-defined]
        res.drops = sum(p.drops for p in ports)
        res.pauses = sum(p.pfc_xoff for p in ports)
        res.marks = port.marks
        for e in engines.values():
            res.sent_packets += e.sent_pkts
            res.retransmits += e.req.resent_pkts
            res.cnps_handled += e.rare_counts["rp_cnp_handled"]
        rhca = hcas["r"]
        assert rhca is not None
        res.cnps = rhca.counters["np_cnp_sent"]
        res.ecn_marked = rhca.counters["np_ecn_marked_roce_packets"]
    return res


def _poll_nowait(cq: CQ) -> tuple[int, list[Any]]:
    """Poll what is there, without letting an empty poll move the virtual clock."""
    got: list[Any] = []
    while cq.ring.pending():
        n, wcs = cq.poll(16)
        got.extend(wcs[:n])
    return len(got), got


def _connect(qp: QP, ctx: Context, peer: QP, peer_ctx: Context, timeout: int,
             path_mtu: int) -> None:  # fmt: skip
    attr = QPAttr()
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num = peer.qp_num
    attr.path_mtu = path_mtu
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = timeout, 7, 7, 12
    attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=peer_ctx.query_gid(1, 1),
                                                      sgid_index=1))  # fmt: skip
    qp.to_rts(attr)
