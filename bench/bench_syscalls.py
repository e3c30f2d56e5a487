"""System calls softverbsd makes per message, counted by strace.

A private softverbsd runs under ``strace -f -c`` while Debian's ``ib_send_lat``
(8 B SENDs, unmodified, two processes on the host device) -- or with ``--bw``
``ib_write_bw`` (4 KiB WRITEs) -- runs through it twice, with ``--iters`` and
with twice as many iterations; the difference between the two counts, divided
by the extra one-way messages (two per latency iteration, one per bandwidth
iteration), is what one message costs the service, without the setup
(connection, registration, teardown) both runs share.

    python bench/bench_syscalls.py [--bw] [--iters 2000] [--src DIR/src] [--env VAR=VALUE]

``--src`` counts another checkout's service (e.g. ``git archive main | tar
-x -C DIR``); ``--env`` sets a variable for the service and the programs
(e.g. ``SOFTVERBS_SPIN_US=50``, ``SOFTVERBS_PURE=1``).  Needs ``strace`` and
``perftest``.  A benchmark, never a test: the counts are exact, but a spinning
service (``SOFTVERBS_SPIN_US``) makes a number of polls that depends on timing.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_perftest import LAT_SIZE, on_wrapped_service, row

ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(\d*)\s*(\w+)\s*$")


def counts(summary: str) -> dict[str, tuple[int, int]]:
    """strace -c's table: system call -> (calls, errors)."""
    out: dict[str, tuple[int, int]] = {}
    for line in summary.splitlines():
        m = ROW.match(line)
        if m and m.group(3) != "total":
            out[m.group(3)] = (int(m.group(1)), int(m.group(2) or 0))
    return out


def traced_run(src: str, extra: dict[str, str], tool: str, size: int,
               iters: int) -> tuple[dict[str, tuple[int, int]], list[float]]:  # fmt: skip
    """One service under strace serving one perftest run: its counts, perftest's row."""
    output, text = on_wrapped_service(
        ["strace", "-f", "-c", "-o", "{out}", sys.executable],
        lambda out: Path(out).read_text(), src, extra, tool, size, iters)
    return counts(text), row(output, size)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=2000, help="iterations (and 2x)")
    ap.add_argument("--bw", action="store_true",
                    help="ib_write_bw 4 KiB (one message per iteration) instead of ib_send_lat")
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--env", action="append", default=[], metavar="VAR=VALUE")
    args = ap.parse_args()
    if shutil.which("strace") is None or shutil.which("ib_send_lat") is None:
        print("needs strace and perftest (scripts/apt-packages.txt)", file=sys.stderr)
        return 1
    extra = dict(s.partition("=")[::2] for s in args.env)
    tool, size = ("ib_write_bw", 4096) if args.bw else ("ib_send_lat", LAT_SIZE)
    small, _ = traced_run(args.src, extra, tool, size, args.iters)
    big, got = traced_run(args.src, extra, tool, size, 2 * args.iters)
    # the extra one-way messages of the second run (a latency iteration is a round trip)
    messages = args.iters * (1 if args.bw else 2)
    print(f"softverbsd ({args.src}, {' '.join(args.env) or 'defaults'}): system calls per "
          f"one-way {size} B message of {tool} ({args.iters} more iterations)")  # fmt: skip
    print(f"{'system call':<18}{'calls':>8}{'errors':>8}")
    total = 0.0
    for name in sorted(big, key=lambda n: -big[n][0]):
        calls = (big[name][0] - small.get(name, (0, 0))[0]) / messages
        errors = (big[name][1] - small.get(name, (0, 0))[1]) / messages
        if calls >= 0.005:
            print(f"{name:<18}{calls:>8.2f}{errors:>8.2f}")
            total += calls
    print(f"{'total':<18}{total:>8.2f}")
    figure = f"{got[1]:.1f} MB/s" if args.bw else f"typical {got[2]:.1f} us, 99% {got[5]:.1f} us"
    print(f"(under strace, which slows every system call: {tool} {figure})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
