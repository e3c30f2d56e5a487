#!/usr/bin/env python3
"""How softverbs scales with the number of connected RC QPs on one device.

Connected RC QP pairs (each QP with its own 16-entry send and receive
queues, all sharing one PD, one CQ and one MR) are created on the
in-process device ``sv0`` in steps up to the largest count, and after each
step the script measures:

* **bytes per idle QP**: the growth of the process's resident memory (RSS,
  from ``/proc/self/statm``) per QP created in the step, and Python's own
  allocations per QP (``tracemalloc``);
* **creation cost**: wall time per QP to create it and take it to RTS
  (with ``tracemalloc`` on, which slows it);
* **posting cost**: a 64-byte SEND and its receive on one pair, posted and
  polled (median of 200), with all the other QPs idle on the device -- the
  time should not grow with the count.

Not a test: nothing asserts a speed.  ``--plot FILE`` draws the two curves.

    python bench/bench_scale.py [--max 10000] [--steps 100,1000,10000] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc

os.environ.setdefault("SOFTVERBS_SERVICE", "0")  # the in-process device

from progress import Progress, add_quiet

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
    RecvWR,
    SendWR,
)
from softverbs.enums import IBV_ACCESS_LOCAL_WRITE, IBV_QPT_RC, IBV_WC_SUCCESS, IBV_WR_SEND


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class World:
    def __init__(self) -> None:
        self.ctx = Context(name="sv0")
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 4096)
        self.mr = MR(self.pd, 4096, IBV_ACCESS_LOCAL_WRITE)
        self.gid = self.ctx.query_gid(1, 1)
        self.qps: list[QP] = []

    def qp(self) -> QP:
        cap = QPCap(max_send_wr=16, max_recv_wr=16)
        return QP(self.pd, QPInitAttr(qp_type=IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap),
                  QPAttr())  # fmt: skip

    def pair(self) -> tuple[QP, QP]:
        a, b = self.qp(), self.qp()
        for q, p in ((a, b), (b, a)):
            attr = QPAttr()
            attr.dest_qp_num = p.qp_num
            attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=self.gid, sgid_index=1))
            attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
            q.to_rts(attr)
        self.qps += (a, b)
        return a, b

    def post_cost(self, a: QP, b: QP, n: int = 200) -> float:
        """Median seconds for one 64-byte SEND + its receive, posted and polled."""
        mr = self.mr
        send = SendWR(1, IBV_WR_SEND, 1, sg=[SGE(mr.buf, 64, mr.lkey)])
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            b.post_recv(RecvWR(2, 1, [SGE(mr.buf + 2048, 64, mr.lkey)]))
            a.post_send(send)
            got = 0
            while got < 2:
                _, wcs = self.cq.poll(2)
                for wc in wcs:
                    if wc.status != IBV_WC_SUCCESS:
                        raise SystemExit(f"bench_scale: completion failed: {wc}")
                got += len(wcs)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def plot(path: str, rows: list[dict[str, float]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable; skipping the plot ({path}).")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    qps = [r["qps"] for r in rows]
    ax1.plot(qps, [r["rss_per_qp"] / 1024 for r in rows], "o-", label="RSS")
    ax1.plot(qps, [r["py_per_qp"] / 1024 for r in rows], "s-", label="Python objects")
    ax1.set(xscale="log", xlabel="connected RC QPs", ylabel="KiB per idle QP",
            title="memory per QP")  # fmt: skip
    ax1.legend()
    ax2.plot(qps, [r["post_us"] for r in rows], "o-")
    ax2.set(xscale="log", xlabel="connected RC QPs", ylabel="us per SEND + receive",
            title="posting cost", ylim=(0, max(r["post_us"] for r in rows) * 1.3))  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", default="100,1000,10000",
                    help="QP counts to measure at (comma-separated)")  # fmt: skip
    ap.add_argument("--plot", metavar="FILE", help="also write a PNG plot (needs matplotlib)")
    add_quiet(ap)
    args = ap.parse_args()
    steps = sorted({int(s) for s in args.steps.split(",")})
    progress = Progress(len(steps), args.quiet)
    world = World()
    probe = world.pair()  # the pair the posting cost is measured on
    world.post_cost(*probe, 20)  # warm up
    rows: list[dict[str, float]] = []
    print(f" {'QPs':>7} {'KiB RSS/QP':>11} {'KiB py/QP':>10} {'us create/QP':>13} "
          f"{'us SEND+recv':>13}")  # fmt: skip
    for target in steps:
        progress.step(f"{target} QPs")
        tracemalloc.start()  # only while creating: it slows every allocation down
        before_rss, (before_py, _) = rss(), tracemalloc.get_traced_memory()
        t0 = time.perf_counter()
        start = len(world.qps)
        while len(world.qps) < target:
            world.pair()
        made = len(world.qps) - start
        create = (time.perf_counter() - t0) / max(1, made)
        after_rss, (after_py, _) = rss(), tracemalloc.get_traced_memory()
        tracemalloc.stop()
        row = {
            "qps": float(len(world.qps)),
            "rss_per_qp": (after_rss - before_rss) / max(1, made),
            "py_per_qp": (after_py - before_py) / max(1, made),
            "create_us": create * 1e6,
            "post_us": world.post_cost(*probe) * 1e6,
        }
        rows.append(row)
        print(f" {len(world.qps):>7} {row['rss_per_qp'] / 1024:>11.1f} "
              f"{row['py_per_qp'] / 1024:>10.1f} {row['create_us']:>13.0f} "
              f"{row['post_us']:>13.1f}")  # fmt: skip
    if args.plot:
        plot(args.plot, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
