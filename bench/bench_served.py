#!/usr/bin/env python3
"""The served host device beside the in-process one, in the same run.

The same two measurements as ``bench_inproc.py`` -- 64-byte RC SEND message
rate in batches, and RDMA WRITE bandwidth at 4 KiB, 64 KiB and 1 MiB against
a memoryview copy -- on two devices:

* in-process: ``sv0`` of this process (``SOFTVERBS_SERVICE=0``);
* served: ``sv0`` of a private ``softverbsd`` started for the run, the host
  device every process shares.  The engine runs in the service; this
  process writes WQEs into shared rings, rings doorbells over the socket,
  and polls CQEs from shared memory; the service reads and writes the
  registered memory through ``/proc/PID/mem``.

Both QPs of each pair are in this process, so the served figures include
both ends' doorbells and the service's reads and writes of this process's
memory.  Not a test: nothing asserts a speed.

    python bench/bench_served.py [--quick] [--runs N] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace

os.environ["SOFTVERBS_SERVICE"] = "0"  # before softverbs reads it: the in-process device

from bench_inproc import (
    BATCHES,
    FULL,
    QUICK,
    WRITE_SIZES,
    BenchError,
    Settings,
    human,
    machine,
    message_rate,
    write_bandwidth,
)
from progress import Progress, add_quiet

import softverbs
from softverbs import Context
from softverbs.config import service_command


@contextmanager
def served_device() -> Iterator[None]:
    """A private softverbsd for the run; the process's devices are its devices."""
    from softverbs.verbs import world
    from softverbs.verbs.served import ServiceRegistry

    d = tempfile.mkdtemp(prefix="svbench", dir="/tmp")  # a Unix socket path is short
    path = os.path.join(d, "sv.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    proc = subprocess.Popen(service_command("--socket", path),
                            env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    reg = None
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError("softverbsd did not start")
            time.sleep(0.02)
        reg = ServiceRegistry(path)
        world.push(reg)
        yield
    finally:
        if reg is not None:
            world.pop(reg)
            reg.shutdown()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def in_process() -> Iterator[None]:
    yield


KINDS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "in-process": in_process,
    "served": served_device,
}


def measure(s: Settings, progress: Progress) -> dict[str, dict[str, float]]:
    """figure -> kind -> value (messages/s, or bytes/s; and memcpy's bytes/s)."""
    out: dict[str, dict[str, float]] = {}
    for kind, where in KINDS.items():
        with where(), Context(name="sv0") as ctx:
            for batch in BATCHES:
                progress.step(f"{kind}: RC SEND, batches of {batch}")
                out.setdefault(f"send{batch}", {})[kind] = message_rate(ctx, batch, s)
            for size in WRITE_SIZES:
                progress.step(f"{kind}: RDMA WRITE {human(size)}")
                sv, mc = write_bandwidth(ctx, size, s)
                row = out.setdefault(f"write{size}", {})
                row[kind] = sv
                row["memcpy"] = max(row.get("memcpy", 0.0), mc)
    return out


def report(res: dict[str, dict[str, float]]) -> None:
    print(f" {'figure':<22} {'in-process':>12} {'served':>12} {'served/in-process':>18}")
    for batch in BATCHES:
        r = res[f"send{batch}"]
        print(f" {f'SEND 64 B, batch {batch}':<22} {r['in-process']:>12,.0f} "
              f"{r['served']:>12,.0f} {r['served'] / r['in-process']:>18.2f}")  # fmt: skip
    print("   (messages per second)")
    for size in WRITE_SIZES:
        r = res[f"write{size}"]
        print(f" {f'WRITE {human(size)} MB/s':<22} {r['in-process'] / 1e6:>12,.1f} "
              f"{r['served'] / 1e6:>12,.1f} {r['served'] / r['in-process']:>18.2f}")  # fmt: skip
    print()
    print(f" {'WRITE vs memcpy':<22} {'in-process':>12} {'served':>12} {'memcpy MB/s':>18}")
    for size in WRITE_SIZES:
        r = res[f"write{size}"]
        print(f" {human(size):<22} {r['in-process'] / r['memcpy']:>12.4f} "
              f"{r['served'] / r['memcpy']:>12.4f} {r['memcpy'] / 1e6:>18,.1f}")  # fmt: skip


def plot(path: str, res: dict[str, dict[str, float]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable; skipping the plot ({path}).")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(BATCHES))
    for off, kind in ((-0.2, "in-process"), (0.2, "served")):
        ax1.bar([x + off for x in xs], [res[f"send{b}"][kind] / 1e3 for b in BATCHES], 0.4,
                label=kind)  # fmt: skip
        ax2.bar([x + off for x in range(len(WRITE_SIZES))],
                [res[f"write{sz}"][kind] / 1e6 for sz in WRITE_SIZES], 0.4, label=kind)  # fmt: skip
    ax1.set_xticks(list(xs), [str(b) for b in BATCHES])
    ax1.set(title="RC SEND, 64 B", xlabel="batch size", ylabel="k messages/s")
    ax1.legend()
    ax2.set_xticks(list(range(len(WRITE_SIZES))), [human(sz) for sz in WRITE_SIZES])
    ax2.set(title="RDMA WRITE", ylabel="MB/s")
    ax2.legend()
    fig.suptitle(machine(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run")
    ap.add_argument("--runs", type=int, help="timed runs per figure (median reported)")
    ap.add_argument("--plot", metavar="FILE", help="also write a PNG plot (needs matplotlib)")
    add_quiet(ap)
    args = ap.parse_args()
    s = QUICK if args.quick else FULL
    if args.runs:
        s = replace(s, runs=args.runs)
    progress = Progress(len(KINDS) * (len(BATCHES) + len(WRITE_SIZES)), args.quiet)
    print(machine())
    print(f"median of {s.runs} runs after {s.warmup} warm-up run(s); MB = 10^6 bytes; "
          f"{s.messages} messages and {s.write_bytes >> 20} MiB per run")  # fmt: skip
    print()
    try:
        res = measure(s, progress)
    except (BenchError, softverbs.PyverbsError) as e:
        print(f"bench_served: FAILED: {e}", file=sys.stderr)
        return 1
    report(res)
    if args.plot:
        print()
        plot(args.plot, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
