#!/usr/bin/env python3
"""Issue 25's target rows, interpreted against compiled, from one run.

softverbs' hot modules run compiled where ``pip install`` had Cython and a C
compiler, and interpreted with ``SOFTVERBS_PURE=1`` (softverbs.compiled).
This runs the three benchmarks that measure the targets in both modes,
interleaved (round 1 interpreted then compiled, round 2 compiled then
interpreted, ...), so a machine that gets busier or quieter during the run
moves both columns alike, and prints each target row with the median of its
rounds in each mode:

* bench_inproc.py: 64 B SENDs/s batched by 64; 1 MiB WRITE against a memoryview copy
  (timed by the process's CPU time, --cpu-clock: a shared machine disturbs it less);
* bench_perftest.py (host device, Debian perftest through the C library,
  the service started in the mode of the round): ib_send_lat 8 B against UCX
  tag_lat over TCP; ib_write_bw 4 KiB and 1 MiB against ucp_put_bw;
* bench_loopback.py (UDP devices, two processes): 8 B ping-pong against a
  plain Python UDP ping-pong; 1 MiB WRITE against the Python UDP loop and UCX, and
  the CPU time each process spends per packet (steadier than any wall-clock figure).

A benchmark whose tools are missing (perftest, ucx-utils) is left out with
the reason.  Not a test: nothing asserts a speed.

    python bench/bench_modes.py [--rounds N] [--only inproc,perftest,loopback]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("interpreted", "compiled")
TIMEOUT = 1800


def _run(script: str, args: list[str], pure: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SOFTVERBS_PURE"}
    if pure:
        env["SOFTVERBS_PURE"] = "1"
    r = subprocess.run([sys.executable, str(HERE / script), *args], env=env, text=True,
                       capture_output=True, timeout=TIMEOUT, check=False)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text, re.M)
    if m is None:
        raise SystemExit(f"no match for {pattern!r} in:\n{text}")
    return float(m.group(1).replace(",", ""))


#: a row: its label, the target, and how to read it (with the ratio's sense)
Row = tuple[str, str]


def inproc(pure: bool) -> dict[Row, float]:
    out = _run("bench_inproc.py", ["-q", "--cpu-clock"], pure)
    return {
        ("in-process 64 B SENDs/s, batched by 64", ">= 200k/s"):
            _number(r"^\s+64\s+([\d,]+)\s", out),
        ("in-process 1 MiB WRITE / memcpy", ">= 0.6"):
            _number(r"^\s+1 MiB\s+[\d,.]+\s+[\d,.]+\s+([\d.]+)", out),
    }  # fmt: skip


def perftest(pure: bool) -> dict[Row, float]:
    out = _run("bench_perftest.py", ["-q"], pure)
    rows = {
        ("ib_send_lat 8 B typical / UCX tag_lat", "<= 4"):
            _number(r"^\s+typical / median\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out),
        ("ib_send_lat 8 B typical, us", "(beside it)"):
            _number(r"^\s+typical / median\s+([\d.]+)", out),
        ("ib_write_bw 4 KiB / ucp_put_bw", ">= 1"):
            _number(r"^\s+4096 B\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out),
        ("ib_write_bw 1 MiB / ucp_put_bw", ">= 1.5"):
            _number(r"^\s+1048576 B\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out),
    }  # fmt: skip
    if "Open MPI" in out:  # left out where Open MPI is not installed
        mpi = _number(r"^\s+Open MPI, UCX rc_verbs\s+([\d.]+)", out)
        rows[("Open MPI over UCX rc_verbs, 8 B half round trip, us", "(beside it)")] = mpi
    return rows


def loopback(pure: bool) -> dict[Row, float]:
    r = json.loads(_run("bench_loopback.py", ["--json", "--sizes", "1M"], pure))
    lat = r["latency_us"]
    (bw,) = r["bandwidth"]
    rows: dict[Row, float] = {
        ("UDP 8 B ping-pong / Python UDP ping-pong", "<= 1.5"):
            lat["softverbs"]["median"] / lat["python_udp"]["median"],
        ("UDP 1 MiB WRITE / Python UDP loop", ">= 2"): bw["softverbs_Bps"] / bw["python_udp_Bps"],
    }  # fmt: skip
    rows[("UDP 1 MiB WRITE, server CPU us/packet", "(beside it)")] = bw["server_cpu_us_per_packet"]
    rows[("UDP 1 MiB WRITE, client CPU us/packet", "(beside it)")] = bw["client_cpu_us_per_packet"]
    if bw.get("ucx_Bps"):
        rows[("UDP 1 MiB WRITE / UCX ucp_put_bw", ">= 1.5")] = bw["softverbs_Bps"] / bw["ucx_Bps"]
    return rows


BENCHES: dict[str, tuple[Callable[[bool], dict[Row, float]], tuple[str, ...]]] = {
    "inproc": (inproc, ()),
    "perftest": (perftest, ("ib_send_lat", "ib_write_bw", "ucx_perftest")),
    "loopback": (loopback, ()),
}


def _compiled_installed() -> str:
    r = subprocess.run([sys.executable, "-c", "import softverbs.compiled as c; print(c.mode())"],
                       capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return r.stdout.strip()


def _num(value: float) -> str:
    """A rate as a whole number with thousands separators, a ratio or a time to 3 places."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per mode (default 3)")
    ap.add_argument("--only", default=",".join(BENCHES), help="which benchmarks (comma-separated)")
    args = ap.parse_args()
    mode = _compiled_installed()
    if not mode.startswith("compiled"):
        print(f"bench_modes: nothing to compare: {mode} (pip install -e . with a C compiler)",
              file=sys.stderr)  # fmt: skip
        return 1
    results: dict[Row, dict[str, list[float]]] = {}
    skipped: list[str] = []
    for name in args.only.split(","):
        fn, tools = BENCHES[name]
        missing = [t for t in tools if shutil.which(t) is None]
        if missing:
            skipped.append(f"{name}: {', '.join(missing)} not found (scripts/apt-packages.txt)")
            continue
        for rnd in range(args.rounds):
            order = MODES if rnd % 2 == 0 else MODES[::-1]
            for m in order:
                print(f"bench_modes: {name} round {rnd + 1}/{args.rounds}, {m}", file=sys.stderr)
                for row, value in fn(m == "interpreted").items():
                    results.setdefault(row, {k: [] for k in MODES})[m].append(value)
    print(f"softverbs, interpreted (SOFTVERBS_PURE=1) against {mode};")
    print(f"median of {args.rounds} interleaved rounds per mode")
    print(f"{'row':<44}{'target':>12}{'interpreted':>13}{'compiled':>11}{'gain':>7}")
    for (label, target), by_mode in results.items():
        pure, comp = (statistics.median(by_mode[m]) for m in MODES)
        better_low = target.startswith("<=") or label.endswith(("us", "us/packet"))
        gain = (pure / comp) if better_low else (comp / pure)
        print(f"{label:<44}{target:>12} {_num(pure):>12} {_num(comp):>10}{gain:>6.2f}x")
    for note in skipped:
        print(f"skipped: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
