#!/usr/bin/env python3
"""In-process benchmark of softverbs: message rate and RDMA WRITE bandwidth.

Two RC QPs on the embedded device ``sv0`` talk to each other in this process.

(a) Message rate of 64-byte RC SENDs posted in batches of 1, 16 and 64: a
    batch is one ``post_send`` of a WR chain on a QP with ``sq_sig_all=0``,
    only the last WR signaled; the receiver keeps receives posted ahead.
    Counted when the sender has polled the batch's completion and the
    receiver has polled every receive completion.
(b) RDMA WRITE bandwidth at 4 KiB, 64 KiB and 1 MiB (chains of 8 WRITEs, the
    last signaled), each beside a plain memoryview copy (``dst[:] = src``)
    of the same bytes, measured in the same run.  The ratio
    softverbs/memcpy is the number to compare across machines.
(c) What issue 11's two in-process targets leave for the device's own
    Python, in the same run: the time per message that 400,000 SENDs/s allow,
    less the benchmark's own Python per message in (a) (a RecvWR to repost, a
    WC from the poll), timed alone; and the time per 1 MiB WRITE that 0.8 of a
    memoryview copy allows, less the one copy the responder makes (between the
    two MRs, timed alone).  Beside each: what the device's Python takes now.

Every completion must be IBV_WC_SUCCESS and every payload is checked; any
failure stops the script with a non-zero exit.  Each figure is the median
of several timed runs after warm-up.  Not a test: nothing asserts a speed.

    python bench/bench_inproc.py [--quick] [--runs N] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from progress import Progress, add_quiet

# the in-process device (the served one is the default; bench_served.py compares the two)
os.environ.setdefault("SOFTVERBS_SERVICE", "0")

import softverbs
from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    Context,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    testing,
    wc_status_str,
)
from softverbs.engine.rings import CQE
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_4096,
    IBV_QPT_RC,
    IBV_SEND_SIGNALED,
    IBV_WC_RECV,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)
from softverbs.verbs.cq import WC

MSG_SIZE = 64
BATCHES = (1, 16, 64)
WRITE_SIZES = (4 << 10, 64 << 10, 1 << 20)
WRITE_CHAIN = 8  #: WRITEs per post_send; the last one is signaled
TARGET_RATE = 400_000  #: issue 11: in-process 64-byte SENDs per second, batched
TARGET_COPY_RATIO = 0.8  #: issue 11: in-process 1 MiB WRITE against a memoryview copy
FLOOR_BATCH = 64  #: (c) times the application's work for batches of this size
QUEUE_DEPTH = 256  #: send and receive queue slots (>= 2 * the largest batch)
STALL_TIMEOUT = 10.0  #: seconds without an expected completion before failing
ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE


class BenchError(Exception):
    """A completion failed, a payload was wrong, or the device stalled."""


@dataclass(frozen=True)
class Settings:
    runs: int  #: timed runs per figure (the median is reported)
    warmup: int  #: untimed runs before them
    messages: int  #: messages per run in (a)
    write_bytes: int  #: bytes per run in (b)


FULL = Settings(runs=5, warmup=1, messages=16384, write_bytes=64 << 20)
QUICK = Settings(runs=3, warmup=1, messages=1024, write_bytes=4 << 20)


# --- setup -----------------------------------------------------------------------------
class Pair:
    """Two connected RC QPs on sv0, each with its own CQ and a buffer."""

    def __init__(self, ctx: Context, buf_size: int) -> None:
        self.pd = pd = PD(ctx)
        self.cq_a, self.cq_b = CQ(ctx, 2 * QUEUE_DEPTH), CQ(ctx, 2 * QUEUE_DEPTH)
        self.mr_a, self.mr_b = MR(pd, buf_size, ACCESS), MR(pd, buf_size, ACCESS)
        self.a, self.b = self._qp(pd, self.cq_a), self._qp(pd, self.cq_b)
        route = testing.route(ctx, 1)
        for qp, peer in ((self.a, self.b), (self.b, self.a)):
            # ibv_rc_pingpong's responder resources and timers, MTU 4096
            testing.connect_qp(qp, peer.qp_num, route, IBV_MTU_4096, max_dest_rd_atomic=1,
                               max_rd_atomic=1, min_rnr_timer=12)  # fmt: skip

    def close(self) -> None:
        self.pd.close()  # and with it the QPs and MRs
        self.cq_a.close()
        self.cq_b.close()

    @staticmethod
    def _qp(pd: PD, cq: CQ) -> QP:
        cap = QPCap(max_send_wr=QUEUE_DEPTH, max_recv_wr=QUEUE_DEPTH)
        init = QPInitAttr(qp_type=IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0)
        attr = QPAttr()
        attr.qp_access_flags = ACCESS
        return QP(pd, init, attr)


#: the timer: wall clock, or with --cpu-clock this process's CPU time (all its
#: threads), which a machine shared with other busy processes disturbs far less
clock: Callable[[], float] = time.perf_counter


def poll_n(cq: CQ, n: int, what: str) -> list[int]:
    """Poll exactly ``n`` completions, all successful: byte_len of receives, -1 of sends."""
    out: list[int] = []
    deadline = time.monotonic() + STALL_TIMEOUT
    while len(out) < n:
        _, wcs = cq.poll(n - len(out))
        for wc in wcs:
            if wc.status != IBV_WC_SUCCESS:
                raise BenchError(
                    f"{what}: completion wr_id={wc.wr_id} failed: "
                    f"{wc_status_str(wc.status)} ({wc.status}) {wc.reason}"
                )
            out.append(wc.byte_len if wc.opcode == IBV_WC_RECV else -1)
        if not wcs and time.monotonic() > deadline:
            raise BenchError(f"{what}: {len(out)} of {n} completions after {STALL_TIMEOUT} s")
    return out


def chain(wrs: list[SendWR]) -> SendWR:
    """Link WRs into one list for a single post_send; only the last is signaled."""
    for w, nxt in itertools.pairwise(wrs):
        w.next_wr = nxt
        w.send_flags = 0
    wrs[-1].send_flags = IBV_SEND_SIGNALED
    return wrs[0]


def median_rate(run: Callable[[], float], units: float, s: Settings) -> float:
    """``units`` per second: the median over ``s.runs`` timed calls of run()."""
    for _ in range(s.warmup):
        run()
    return statistics.median(units / run() for _ in range(s.runs))


# --- (a) message rate ------------------------------------------------------------------------
def message_rate(ctx: Context, batch: int, s: Settings) -> float:
    p = Pair(ctx, QUEUE_DEPTH * MSG_SIZE)
    src = SGE(p.mr_a.buf, MSG_SIZE, p.mr_a.lkey)
    send = chain([SendWR(i, IBV_WR_SEND, 1, sg=[src]) for i in range(batch)])
    slots = [SGE(p.mr_b.buf + i * MSG_SIZE, MSG_SIZE, p.mr_b.lkey) for i in range(QUEUE_DEPTH)]

    def post_recvs(first: int, count: int) -> None:
        wrs = [RecvWR(first + i, 1, [slots[(first + i) % QUEUE_DEPTH]]) for i in range(count)]
        for w, nxt in itertools.pairwise(wrs):
            w.next_wr = nxt
        p.b.post_recv(wrs[0])

    post_recvs(0, QUEUE_DEPTH)  # receives posted ahead
    posted = QUEUE_DEPTH
    rounds = max(1, s.messages // batch)

    def run() -> float:
        nonlocal posted
        t0 = clock()
        for _ in range(rounds):
            p.a.post_send(send)
            poll_n(p.cq_a, 1, f"SEND batch of {batch}")
            lengths = poll_n(p.cq_b, batch, f"RECV batch of {batch}")
            if lengths != [MSG_SIZE] * batch:
                raise BenchError(f"receive byte_len {lengths}, expected {MSG_SIZE} each")
            post_recvs(posted, batch)  # refill what was consumed
            posted += batch
        return clock() - t0

    p.mr_a.write(os.urandom(MSG_SIZE), MSG_SIZE)
    rate = median_rate(run, rounds * batch, s)
    if p.mr_b.read(MSG_SIZE, 0) != p.mr_a.read(MSG_SIZE, 0):
        raise BenchError("a received message differs from the one sent")
    p.close()
    return rate


# --- (b) RDMA WRITE bandwidth vs memcpy ----------------------------------------------------------
def write_bandwidth(ctx: Context, size: int, s: Settings) -> tuple[float, float]:
    """(softverbs bytes/s, memoryview-copy bytes/s) for ``size``-byte transfers."""
    chains = max(1, s.write_bytes // (size * WRITE_CHAIN))
    nbytes = chains * WRITE_CHAIN * size
    p = Pair(ctx, size)
    p.mr_a.write(os.urandom(size), size)
    sge = SGE(p.mr_a.buf, size, p.mr_a.lkey)
    wrs = [SendWR(i, IBV_WR_RDMA_WRITE, 1, sg=[sge]) for i in range(WRITE_CHAIN)]
    for w in wrs:
        w.set_wr_rdma(p.mr_b.rkey, p.mr_b.buf)
    first = chain(wrs)

    def rdma() -> float:
        t0 = clock()
        for _ in range(chains):
            p.a.post_send(first)
            poll_n(p.cq_a, 1, f"RDMA WRITE {size} B")
        return clock() - t0

    src, dst = memoryview(bytearray(os.urandom(size))), memoryview(bytearray(size))
    copies = chains * WRITE_CHAIN

    def memcpy() -> float:
        t0 = clock()
        for _ in range(copies):
            dst[:] = src
        return clock() - t0

    sv = median_rate(rdma, nbytes, s)
    mc = median_rate(memcpy, nbytes, s)
    if p.mr_b.view != p.mr_a.view or dst != src:
        raise BenchError(f"{size} B: the destination differs from the source")
    p.close()
    return sv, mc


# --- (c) what the targets leave for the device ----------------------------------------------------
@dataclass(frozen=True)
class Floors:
    app_us: float  #: (a)'s own Python per message, outside the device
    copy_us: float  #: one 1 MiB copy between two MRs, as the responder makes it
    memcpy_us: float  #: the plain memoryview copy of (b), same size


def floors(ctx: Context, s: Settings) -> Floors:
    """Time, alone, what no device can take off (a) and (b): the application's
    per-message Python in (a) -- building the RecvWR chain that reposts a batch,
    and a WC per completion with the checks poll_n makes -- and the copy a
    1 MiB WRITE needs, between the two MRs of a pair."""
    sge = [SGE(0x1000 + i * MSG_SIZE, MSG_SIZE, 1) for i in range(FLOOR_BATCH)]
    cqes = [CQE(i, IBV_WC_SUCCESS, IBV_WC_RECV, 1, MSG_SIZE) for i in range(FLOOR_BATCH)]
    rounds = max(1, s.messages // FLOOR_BATCH)

    def app() -> float:
        t0 = clock()
        for _ in range(rounds):
            wrs = [RecvWR(i, 1, [sge[i]]) for i in range(FLOOR_BATCH)]
            for w, nxt in itertools.pairwise(wrs):
                w.next_wr = nxt
            out: list[int] = []
            for wc in [WC.from_cqe(c) for c in cqes]:
                if wc.status != IBV_WC_SUCCESS:  # poll_n's check, on CQEs that pass it
                    raise BenchError(f"a WC made from a successful CQE has status {wc.status}")
                out.append(wc.byte_len if wc.opcode == IBV_WC_RECV else -1)
        return clock() - t0

    size = 1 << 20
    p = Pair(ctx, size)
    src, dst = p.mr_a.view, p.mr_b.view
    plain_src, plain_dst = memoryview(bytearray(size)), memoryview(bytearray(size))
    copies = max(1, s.write_bytes // size)

    def copy(d: memoryview, sv: memoryview) -> Callable[[], float]:
        def run() -> float:
            t0 = clock()
            for _ in range(copies):
                d[:] = sv
            return clock() - t0

        return run

    per_message = 1e6 / median_rate(app, rounds * FLOOR_BATCH, s)
    mr_copy = 1e6 / median_rate(copy(dst, src), copies, s)
    plain = 1e6 / median_rate(copy(plain_dst, plain_src), copies, s)
    p.close()
    return Floors(per_message, mr_copy, plain)


def print_floors(f: Floors, rate64: float, write_1m: float) -> None:
    """One row per target: the usec it allows per message or WRITE, what is
    spent outside the device's own Python, what that leaves, and what the
    device's Python takes now -- (a)'s batch-64 time, or (b)'s 1 MiB time,
    less the part outside it."""
    rows = (
        (f"64 B SEND ({TARGET_RATE:,}/s)", 1e6 / TARGET_RATE, f.app_us, 1e6 / rate64),
        (f"1 MiB WRITE ({TARGET_COPY_RATIO} x memcpy)", f.memcpy_us / TARGET_COPY_RATIO,
         f.copy_us, (1 << 20) * 1e6 / write_1m),
    )  # fmt: skip
    print(f" {'':28}  {'allowed':>8}  {'outside':>8}  {'left':>8}  {'device now':>10}")
    for name, allowed, outside, total in rows:
        print(f" {name:28}  {allowed:>8.2f}  {outside:>8.2f}  {allowed - outside:>8.2f}  "
              f"{total - outside:>10.2f}")  # fmt: skip
    print(f"   outside, SEND: the benchmark's RecvWR and WC for each message (batches of "
          f"{FLOOR_BATCH})")  # fmt: skip
    print(f"   outside, WRITE: the responder's one copy, MR to MR (memcpy: {f.memcpy_us:.2f})")


# --- output -----------------------------------------------------------------------------------
def human(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def machine() -> str:
    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    return (
        f"machine: {platform.machine()}, {cpus} CPUs ({usable} usable), "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"softverbs {softverbs.__version__}"
    )


def plot(path: str, rates: dict[int, float], bw: dict[int, tuple[float, float]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable; skipping the plot ({path}).")
        print("  (pip install 'softverbs[bench]' to get it)")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar([str(b) for b in rates], [r / 1e3 for r in rates.values()], color="tab:blue")
    ax1.set(title=f"RC SEND, {MSG_SIZE} B", xlabel="batch size", ylabel="k messages/s")
    labels = [human(sz) for sz in bw]
    xs = range(len(labels))
    ax2.bar([x - 0.2 for x in xs], [v[0] / 1e6 for v in bw.values()], 0.4, label="softverbs")
    ax2.bar([x + 0.2 for x in xs], [v[1] / 1e6 for v in bw.values()], 0.4, label="memcpy")
    ax2.set_xticks(list(xs), labels)
    ax2.set(title="RDMA WRITE vs memoryview copy", ylabel="MB/s (log)", yscale="log")
    ax2.set_ylim(top=max(v[1] for v in bw.values()) / 1e6 * 10)  # room for the legend
    ax2.legend(loc="upper right", ncols=2)
    fig.suptitle(machine(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (fewer, shorter runs)")
    ap.add_argument("--runs", type=int, help="timed runs per figure (median reported)")
    ap.add_argument("--plot", metavar="FILE", help="also write a PNG plot (needs matplotlib)")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="time with the process's CPU time instead of the wall clock")  # fmt: skip
    add_quiet(ap)
    args = ap.parse_args()
    if args.cpu_clock:
        global clock
        clock = time.process_time
    progress = Progress(len(BATCHES) + len(WRITE_SIZES) + 1, args.quiet)
    s = QUICK if args.quick else FULL
    if args.runs:
        s = replace(s, runs=args.runs)

    print(machine())
    print(f"median of {s.runs} runs after {s.warmup} warm-up run(s); MB = 10^6 bytes"
          + ("; timed by CPU time" if args.cpu_clock else ""))  # fmt: skip
    print()
    rates: dict[int, float] = {}
    bw: dict[int, tuple[float, float]] = {}
    try:
        with Context(name="sv0") as ctx:
            print(f"(a) RC SEND, {MSG_SIZE}-byte messages, {s.messages} per run")
            print(f" {'batch':>5}  {'messages/s':>12}  {'usec/message':>12}")
            for batch in BATCHES:
                progress.step(f"RC SEND, batches of {batch}")
                rates[batch] = r = message_rate(ctx, batch, s)
                print(f" {batch:>5}  {r:>12,.0f}  {1e6 / r:>12.2f}")
            print()
            print(f"(b) RDMA WRITE (path MTU 4096, {WRITE_CHAIN} per post) vs memoryview copy")
            sizes, ratio = "softverbs MB/s", "softverbs/memcpy"
            print(f" {'size':>7}  {sizes:>14}  {'memcpy MB/s':>12}  {ratio:>16}")
            for size in WRITE_SIZES:
                progress.step(f"RDMA WRITE {human(size)}")
                bw[size] = sv, mc = write_bandwidth(ctx, size, s)
                print(
                    f" {human(size):>7}  {sv / 1e6:>14,.1f}  {mc / 1e6:>12,.1f}  {sv / mc:>16.4f}"
                )
            print()
            progress.step("what the targets leave")
            fl = floors(ctx, s)
            print("(c) usec per message that issue 11's in-process targets allow, and what is")
            print("    left of that for the device's own Python")
            print_floors(fl, rates[BATCHES[-1]], bw[1 << 20][0])
    except (BenchError, softverbs.PyverbsError) as e:
        print(f"bench_inproc: FAILED: {e}", file=sys.stderr)
        return 1
    if args.plot:
        print()
        plot(args.plot, rates, bw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
