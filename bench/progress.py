"""Progress lines for the benchmarks: what is being measured now, on stderr.

A full benchmark run takes minutes; each script says, before every figure
it measures, which one it is and how far along the run is::

    [3/6] RDMA WRITE 4 KiB (12 s)

on stderr, so the tables on stdout stay clean for files and pipes.  Every
script takes ``-q/--quiet`` to turn the lines off.
"""

from __future__ import annotations

import argparse
import sys
import time


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr")  # fmt: skip


class Progress:
    """Counts the figures of one run and reports each as it starts."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        self.total = total
        self.quiet = quiet
        self.done = 0
        self.start = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        if not self.quiet:
            elapsed = time.monotonic() - self.start
            print(f"[{self.done}/{self.total}] {what} ({elapsed:.0f} s)", file=sys.stderr,
                  flush=True)  # fmt: skip
