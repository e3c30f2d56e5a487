#!/usr/bin/env python3
"""What the device's CRCs cost per block, beside a memoryview copy.

The ICRC of every RoCEv2 frame is a CRC-32 (ISA-L's through ``isal``, else
zlib's); the signature offload's guards are CRC-32C and T10-DIF (fastcrc,
else a table in Python).  For each block size the table gives microseconds
per block and the ratio to a memoryview slice copy of the same bytes, all
from this run.  Not a test: nothing asserts a speed.

    python bench/bench_crc.py [--sizes 512,4096,65536] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import os
import timeit
import zlib
from collections.abc import Callable

from progress import Progress, add_quiet

from softverbs.engine import signature
from softverbs.wire import codec


def per_call(fn: Callable[[], object], budget: float = 0.2) -> float:
    """Microseconds per call: the best of five runs of about ``budget`` seconds."""
    n, t = 1, 0.0
    while t < budget / 5:
        n *= 4
        t = timeit.timeit(fn, number=n)
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="512,4096,65536")
    ap.add_argument("--plot", metavar="FILE")
    add_quiet(ap)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    progress = Progress(len(sizes), args.quiet)
    rows: dict[str, list[float]] = {}
    copies = []
    for size in sizes:
        progress.step(f"CRCs of {size}-byte blocks")
        data = os.urandom(size)
        src, dst = memoryview(data), memoryview(bytearray(size))

        def copy(dst: memoryview = dst, src: memoryview = src) -> None:
            dst[:] = src

        copies.append(per_call(copy))
        slow = size <= 4096  # the Python tables take ms per 64 KiB
        candidates = {
            "ICRC crc32 (zlib)": lambda d=data: zlib.crc32(d),
            f"ICRC crc32 ({codec.crc32.__module__})": lambda d=data: codec.crc32(d),
            "CRC-32C (native)": lambda d=data: signature.crc32c(d),
            "T10-DIF (native)": lambda d=data: signature.crc16_t10dif(d),
        }
        if slow:
            candidates["CRC-32C (Python table)"] = lambda d=data: signature.crc32c_table(d)
            candidates["T10-DIF (Python table)"] = lambda d=data: signature.crc16_t10dif_table(d)
        for name, fn in candidates.items():
            rows.setdefault(name, [float("nan")] * len(sizes))[sizes.index(size)] = per_call(fn)
    print(f"native CRCs in use: {signature.NATIVE_CRCS}")
    head = "".join(f"{s:>10} B  xcopy" for s in sizes)
    print(f"{'us per block':<28}{head}")
    print(f"{'memoryview copy':<28}" + "".join(f"{c:>12.3f}  {1:>5.1f}" for c in copies))
    for name, values in rows.items():
        cells = "".join(f"{v:>12.3f}  {v / c:>5.1f}" if v == v else f"{'-':>12}  {'-':>5}"
                        for v, c in zip(values, copies, strict=True))  # fmt: skip
        print(f"{name:<28}{cells}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(sizes, copies, "k--", label="memoryview copy")
        for name, values in rows.items():
            ax.plot(sizes, values, marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="block bytes", ylabel="µs per block",
               title="softverbs CRCs (one run)")  # fmt: skip
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
