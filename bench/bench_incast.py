#!/usr/bin/env python3
"""N:1 incast of long RC WRITEs through a simulated switch, DCQCN on and off.

For each sender count (2, 4, 8, 16), each fabric (lossless: priority flow
control on; lossy: tail drop) and each congestion control (``dcqcn`` and
``none``), :func:`softverbs.incast.run_incast` builds a Simulation: N
senders and one receiver around one switch, every link 40 Gb/s with 1 us of
propagation delay (the DCQCN paper's link speed), the switch's port toward
the receiver the bottleneck (a buffer of 4 x Kmax; RED/ECN judged at dequeue
with the DCQCN paper's Kmin 5 KB, Kmax 200 KB, Pmax 1 %, or with ``--red
cumulus`` the profile Cumulus Linux's RoCE mode sets: 150 KB, 1.5 MB, 100 %;
:data:`softverbs.fabric.switch.RED_PROFILES`).  Every sender keeps two
1 MiB RDMA WRITEs posted on its RC QP (1024-byte MTU) for ``--duration``
virtual seconds.  Everything runs on the virtual clock: a run is exactly
reproducible and takes no wall time in waiting.

The DCQCN parameters are the DCQCN paper's recommended ones expressed with
mlx5's knobs (:data:`PAPER`, ``--params paper``), mlx5's firmware defaults
(``--params mlx5``, the default), or the DCQCN of the HPCC paper's ns-3
simulator (:data:`HPCC_SIM`, ``--params hpcc``: mlx5's timers without the byte
counter).  ``none`` sends the whole window whatever happens
(go-back-N on loss), as a NIC without congestion control.

Printed: one row per configuration -- bottleneck utilisation and Jain's
fairness index over the last half of the run, the bottleneck queue's p50
and p99 as arriving packets found it (last half), switch drops,
retransmitted packets, CNPs and PFC PAUSE frames over the whole run.  ``--json`` prints one
JSON object per configuration instead.  ``--plot FILE`` draws, for the
largest sender count, each sender's throughput, its DCQCN rate limit and the
queue over virtual time, DCQCN on and off (needs matplotlib: ``pip install -e '.[bench]'``).

    python bench/bench_incast.py [--senders 2,4,8,16] [--duration 0.01] [--fabric lossless,lossy]
                                 [--bandwidth 40e9] [--mtu 1024] [--json] [--plot F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from softverbs.engine.congestion import check_params
from softverbs.fabric.switch import RED_PROFILES, Topology
from softverbs.incast import IncastResult, run_incast

#: The DCQCN paper's parameters (Zhu et al., SIGCOMM 2015) as mlx5 knobs: a CNP per flow
#: and a rate cut at most every 50 us, every cut setting Rt = Rc, alpha updated every 55 us
#: with g = 1/256, the increase timer 55 us, the byte counter 10 MB, F = 5, R_AI 40 Mb/s;
#: R_HAI (100 Mb/s) is ours.
PAPER: dict[str, int] = {
    "min_time_between_cnps": 50, "cnp_per_port": 0, "rate_reduce_monitor_period": 50,
    "clamp_tgt_rate": 1,
    "dce_tcp_rtt": 55,
    "dce_tcp_g": 1020, "rpg_time_reset": 55, "rpg_byte_reset": 10_000_000,
    "rpg_threshold": 5, "rpg_ai_rate": 40, "rpg_hai_rate": 100,
}  # fmt: skip

#: The DCQCN of the ns-3 simulator published with the HPCC paper (Li et al., SIGCOMM 2019;
#: github.com/alibaba-edu/High-Precision-Congestion-Control, simulation/run.py ``--cc
#: dcqcn`` and rdma-hw.cc's "Mellanox's version of DCQCN") as mlx5 knobs: mlx5's 1 us
#: alpha period, 4 us cut period, 300 us timer, F = 1 and its clamping rule, but g = 1/256,
#: a 1 Gb/s floor, R_AI 5 Mb/s per 25 Gb/s of link (8 at 40 Gb/s), a CNP for every marked
#: packet -- and no byte counter: the timer alone raises the rate.  Differences left:
#: that simulator reaches hyper increase on the timer alone (here QCN's rule needs the
#: byte stage too, so recovery stays additive) and bounds no cut by rpg_min_dec_fac (a
#: cut of at most alpha/2 never reaches the 50 % bound anyway).
HPCC_SIM: dict[str, int] = {
    "rpg_byte_reset": 0, "rpg_min_rate": 1000, "dce_tcp_g": 1020,
    "min_time_between_cnps": 0, "rpg_ai_rate": 8,
}  # fmt: skip

#: ``--params``: the named DCQCN parameter sets, over mlx5's defaults.
PARAM_SETS: dict[str, dict[str, int]] = {"mlx5": {}, "paper": PAPER, "hpcc": HPCC_SIM}


FABRICS = {"lossless": True, "lossy": False}


def topology(bandwidth: float, pfc: bool, buffer: int | None = None,
             red: str = "paper") -> Topology:  # fmt: skip
    """The incast's star: 1 us links, the RED profile ``red``, a buffer of ``buffer``
    bytes (default 4 x the profile's Kmax)."""
    topo = Topology(bandwidth=bandwidth, delay=1e-6, pfc=pfc).with_red(red)
    return replace(topo, buffer=buffer if buffer is not None else 4 * topo.kmax)


def table(results: list[IncastResult]) -> str:
    head = (f"{'senders':>7} {'fabric':>8} {'cc':>6} {'util':>6} {'jain':>6} {'q p50 KB':>9} "
            f"{'q p99 KB':>9} {'drops':>6} {'retx':>6} {'CNPs':>6} {'PAUSEs':>6}")  # fmt: skip
    rows = [head]
    for r in results:
        rows.append(
            f"{r.senders:>7} {'lossless' if r.pfc else 'lossy':>8} {r.cc:>6} "
            f"{r.utilisation:>6.3f} {r.jain:>6.3f} "
            f"{r.queue_p50 / 1000:>9.1f} {r.queue_p99 / 1000:>9.1f} {r.drops:>6} "
            f"{r.retransmits:>6} {r.cnps:>6} {r.pauses:>6}"
        )
    return "\n".join(rows)


def plot(path: str, on: IncastResult, off: IncastResult, params: str) -> bool:
    """Each sender's throughput, its DCQCN rate limit and the bottleneck queue over
    virtual time, DCQCN on (left) and off (right): the DCQCN paper's incast view."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')")
        return False
    fig, axes = plt.subplots(3, 2, figsize=(12, 8.5), sharex=True)
    for col, res in enumerate((on, off)):
        fabric = "lossless (PFC)" if res.pfc else "lossy"
        label = f"cc={res.cc}" + (f" ({params} parameters)" if res.cc == "dcqcn" else "")
        ax = axes[0][col]
        for series in res.throughput.values():
            ax.plot([t * 1e3 for t, _ in series], [b / 1e9 for _, b in series], lw=0.8)
        ax.set_title(f"{res.senders}:1 incast, {fabric}, {label}", fontsize=10)
        ax.set_ylabel("throughput per sender (Gb/s)")
        ax = axes[1][col]
        if res.cc == "dcqcn":
            for series in res.rates.values():
                ax.plot([t * 1e3 for t, _ in series], [r / 1e9 for _, r in series], lw=0.6)
            ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no rate limiter", ha="center", va="center",
                    transform=ax.transAxes)  # fmt: skip
        ax.set_ylabel("rate limit Rc per sender (Gb/s)")
        ax = axes[2][col]
        ax.plot([t * 1e3 for t, _ in res.queue], [q / 1000 for _, q in res.queue], lw=0.6)
        ax.axhline(res.kmax / 1000, color="r", ls="--", lw=0.8, label="Kmax")
        ax.set_ylabel("bottleneck queue (KB)")
        ax.set_xlabel("virtual time (ms)")
        ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print(f"plot: {path}")
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--senders", default="2,4,8,16", help="sender counts (comma-separated)")
    ap.add_argument("--duration", type=float, default=0.01, help="virtual seconds per run")
    ap.add_argument(
        "--fabric",
        default="lossless,lossy",
        help="fabrics (comma-separated): lossless (PFC), lossy (tail drop)",
    )
    ap.add_argument("--cc", default="dcqcn,none",
                    help="congestion controls (comma-separated): dcqcn, none")  # fmt: skip
    ap.add_argument("--bandwidth", type=float, default=40e9, help="bit/s of every link")
    ap.add_argument(
        "--mtu",
        type=int,
        default=1024,
        choices=(256, 512, 1024, 2048, 4096),
        help="the QPs' path MTU (bytes)",
    )
    ap.add_argument(
        "--params",
        choices=tuple(PARAM_SETS),
        default="mlx5",
        help="DCQCN parameters: mlx5's defaults (default), the paper's, or those of the "
        "HPCC paper's ns-3 simulator (mlx5's timers without the byte counter)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one DCQCN parameter over the set (repeatable), e.g. cnp_per_port=1",
    )
    ap.add_argument(
        "--red",
        choices=tuple(RED_PROFILES),
        default="paper",
        help="the switch's RED/ECN profile: the DCQCN paper's (Kmin 5 KB, Kmax 200 KB, "
        "Pmax 1 %%, default) or Cumulus Linux's RoCE mode (150 KB, 1.5 MB, 100 %%)",
    )
    ap.add_argument(
        "--buffer",
        type=int,
        default=None,
        help="bytes of the bottleneck's buffer (default 4 x the profile's Kmax)",
    )
    ap.add_argument(
        "--timeout",
        type=int,
        default=12,
        help="the QPs' ACK timeout exponent: 4.096 us * 2**N (default 12)",
    )
    ap.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sender i starts i x this late (default 0: all at once; 20 us resolution)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object per configuration")
    ap.add_argument(
        "--plot", metavar="FILE", help="plot the largest sender count on the first fabric (PNG)"
    )
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.senders.split(",")]
    except ValueError:
        ap.error(f"--senders: comma-separated integers, not {args.senders!r}")
    if any(n < 1 for n in counts) or not args.duration > 0:
        ap.error("--senders must be >= 1 and --duration > 0")
    fabrics = args.fabric.split(",")
    if not fabrics or any(f not in FABRICS for f in fabrics):
        ap.error(f"--fabric: comma-separated {' or '.join(FABRICS)}, not {args.fabric!r}")
    ccs = args.cc.split(",")
    if not ccs or any(c not in ("dcqcn", "none") for c in ccs):
        ap.error(f"--cc: comma-separated dcqcn or none, not {args.cc!r}")
    if not 0 < args.bandwidth < 1e13:
        ap.error(f"--bandwidth must be a positive number of bit/s, not {args.bandwidth}")
    if args.buffer is not None and args.buffer < 4200:
        ap.error(f"--buffer must hold a packet (>= 4200 bytes), not {args.buffer}")
    if not 0 <= args.stagger < args.duration:
        ap.error(f"--stagger must be >= 0 and below --duration, not {args.stagger}")
    if not 1 <= args.timeout <= 31:
        ap.error(f"--timeout is an exponent 1..31, not {args.timeout}")
    params = dict(PARAM_SETS[args.params])
    for item in args.set:
        name, eq, value = item.partition("=")
        try:
            params[name] = int(value, 0)
        except ValueError:
            ap.error(f"--set: NAME=VALUE with an integer value, not {item!r}")
        if not eq:
            ap.error(f"--set: NAME=VALUE, not {item!r}")
    problem = check_params("dcqcn", params)
    if problem:
        ap.error(f"--set: {problem}")
    results: list[IncastResult] = []
    for n in counts:
        for fabric in fabrics:
            for cc in ccs:
                t0 = time.monotonic()
                res = run_incast(n, cc, duration=args.duration, mtu=args.mtu,
                                 timeout=args.timeout, stagger=args.stagger,
                                 topology=topology(args.bandwidth, FABRICS[fabric], args.buffer,
                                                   args.red),
                                 cc_params=params if cc == "dcqcn" else None)  # fmt: skip
                results.append(res)
                if args.json:
                    row = res.row()
                    row["wall_s"] = round(time.monotonic() - t0, 2)
                    print(json.dumps(row), flush=True)
    if not args.json:
        topo = topology(args.bandwidth, True, args.buffer, args.red)
        print(
            f"bottleneck {args.bandwidth / 1e9:g} Gb/s, buffer {topo.buffer / 1000:g} KB, "
            f"RED {args.red} (Kmin {topo.kmin / 1000:g} KB, Kmax {topo.kmax / 1000:g} KB, "
            f"Pmax {topo.pmax:.0%}), "
            f"MTU {args.mtu}, {args.duration * 1e3:g} ms virtual per run, ACK timeout "
            f"{4.096 * 2**args.timeout / 1000:.3g} ms, DCQCN parameters: {args.params}"
            + (f", senders staggered by {args.stagger * 1e6:g} us" if args.stagger else "")
            + "".join(f" {s}" for s in args.set)
        )
        print(table(results))
    if args.plot and len(ccs) < 2:
        print("--plot draws DCQCN on against off: it needs --cc dcqcn,none")
    elif args.plot:
        top = max(counts)
        pfc = FABRICS[fabrics[0]]
        on = next(r for r in results if (r.senders, r.pfc, r.cc) == (top, pfc, "dcqcn"))
        off = next(r for r in results if (r.senders, r.pfc, r.cc) == (top, pfc, "none"))
        plot(args.plot, on, off, args.params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
