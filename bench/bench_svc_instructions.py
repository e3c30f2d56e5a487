"""Instructions softverbsd spends per 4 KiB WRITE, by function, counted by callgrind.

A private softverbsd of ``--src`` runs (compiled, as that tree's build has it)
under ``valgrind --tool=callgrind`` while Debian's ``ib_write_bw -s 4096`` runs
through it with ``--iters`` WRITEs.  For each function named by ``--match`` (a
regular expression on the C symbol; by default the service's loop, the fabric
runtime's progress loop and hand-off, ``HCA.queue`` and the mapping check
``ProcessMemory.still_pinned``) it prints how many times it was called and its
inclusive instructions per call and per WRITE, with the run's totals.

    python bench/bench_svc_instructions.py [--iters 10000] [--src DIR/src] [--match RE] [--lat]

``--lat`` runs ``ib_send_lat -s 8`` instead (per WRITE is then per iteration, a
round trip of two SENDs).

Per call is the figure to compare between two trees: the service under
valgrind runs some fifty times slower than the client posts, so a turn of its
loop serves far more WRITEs than it does at full speed (about nine), the
responder coalesces ACKs over more WRITEs, and whole-run totals follow that
timing.  A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_perftest import on_wrapped_service

DEFAULT_MATCH = (r"Service__turn$|Service__rang$|Service__progress$|Service__ready$"
                 r"|Runtime_progress$|InprocRuntime_send_outboxes$|HCA_queue$|HCA_receive$"
                 r"|ProcessMemory_still_pinned$")  # fmt: skip


def calls(path: str) -> dict[str, int]:
    """Calls of each function in a callgrind file (summed over its call sites)."""
    names: dict[str, str] = {}
    counts: dict[str, int] = {}
    callee = None
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line.strip())
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3)
                if m.group(1) == "cfn":
                    callee = m.group(2)
            elif line.startswith("calls=") and callee is not None:
                counts[callee] = counts.get(callee, 0) + int(line[6:].split()[0])
    out: dict[str, int] = {}
    for ident, n in counts.items():
        name = names.get(ident, ident)
        out[name] = out.get(name, 0) + n
    return out


def inclusive(path: str) -> tuple[int, dict[str, int]]:
    """The run's total instructions and each function's inclusive instructions."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    total = 0
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S.*)$", line)
        if not m:
            continue
        count = int(m.group(1).replace(",", ""))
        if "PROGRAM TOTALS" in line:
            total = count
            continue
        name = m.group(2).split(" [")[0].rsplit(":", 1)[-1]
        out[name] = out.get(name, 0) + count
    return total, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=10000, help="4 KiB WRITEs")
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter that runs the service (the tree's venv)")  # fmt: skip
    ap.add_argument("--match", default=DEFAULT_MATCH, help="functions to show (a regex)")
    ap.add_argument("--lat", action="store_true", help="ib_send_lat -s 8 instead")
    args = ap.parse_args()
    perftest, size = ("ib_send_lat", 8) if args.lat else ("ib_write_bw", 4096)
    for tool in (perftest, "valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            print(f"needs {tool} (perftest, valgrind)", file=sys.stderr)
            return 1
    wrapper = ["valgrind", "--tool=callgrind", "--callgrind-out-file={out}", args.python]
    _, (total, incl, ncalls) = on_wrapped_service(
        wrapper, lambda out: (*inclusive(out), calls(out)), args.src, {}, perftest, size,
        args.iters)  # fmt: skip
    pattern = re.compile(args.match)
    print(f"softverbsd ({args.src}) under callgrind, {perftest} -s {size} -n {args.iters}: "
          f"{total:,} instructions in all, {ncalls.get('epoll_wait', 0)} epoll_wait")  # fmt: skip
    print(f"{'calls':>10} {'per call':>10} {'per iter':>10}  function")
    for name in sorted(n for n in incl if pattern.search(n)):
        n = ncalls.get(name, 0)
        per_call = incl[name] / n if n else 0.0
        print(f"{n:10d} {per_call:10.1f} {incl[name] / args.iters:10.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
