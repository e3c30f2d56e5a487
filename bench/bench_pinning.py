"""What keeping client memory safe for the service costs, per mechanism.

The service reaches a client's memory two ways (docs/architecture.md,
*Reaching application memory*): a memfd it maps, or ``pread``/``pwrite`` on
the client's ``/proc/self/mem``.  This measures, on this machine:

* **Sealing** (what the service does): the client's ``memfd_create`` +
  ``ftruncate`` with and without ``F_ADD_SEALS``, and the service's checks
  before it maps one (``fstat`` + ``F_GET_SEALS``) -- once per object made,
  nothing per message.
* **Checking that a region is still mapped** (candidates for "registered
  memory behaves as if pinned", per access): reading ``/proc/PID/maps`` of a
  client, one ``PROCMAP_QUERY`` ioctl on it (Linux 6.11+), the service's
  whole check of a span as it runs (``ProcessSpan.still_mapped``: the ioctl
  and its Python), and a 4 KiB ``pread`` of ``/proc/PID/mem`` for scale
  (what an access costs anyway).

The client is a child Python process with softverbs imported (a realistic
number of mappings).

    python bench/bench_pinning.py [--n 2000]

A benchmark, never a test: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable

#: struct procmap_query (include/uapi/linux/fs.h): 9 u64, 4 u32, 2 u64
PROCMAP_QUERY_FMT = "<9Q4I2Q"
PROCMAP_QUERY = (3 << 30) | (struct.calcsize(PROCMAP_QUERY_FMT) << 16) | (ord("f") << 8) | 17
PROCMAP_QUERY_COVERING_OR_NEXT_VMA = 0x10


def per_call(fn: Callable[[], object], n: int) -> float:
    """Median-of-5 microseconds per call of ``fn``."""
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(runs)[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="calls per measurement")
    args = ap.parse_args()
    n = args.n
    rows: list[tuple[str, float, str]] = []

    def plain() -> None:
        fd = os.memfd_create("b", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 1 << 16)
        os.close(fd)

    def sealed() -> None:
        fd = os.memfd_create("b", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 1 << 16)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)  # fmt: skip
        os.close(fd)

    rows.append(("client: memfd_create + ftruncate", per_call(plain, n), "per object"))
    rows.append(("client: ... + F_ADD_SEALS", per_call(sealed, n), "per object"))
    fd = os.memfd_create("b", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 1 << 16)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)

    def check() -> None:
        os.fstat(fd)
        fcntl.fcntl(fd, fcntl.F_GET_SEALS)

    rows.append(("service: fstat + F_GET_SEALS", per_call(check, n), "per object"))

    client = subprocess.Popen([sys.executable, "-c", "import softverbs, sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)  # fmt: skip
    try:
        time.sleep(1.0)
        pid = client.pid
        with open(f"/proc/{pid}/maps") as f:
            text = f.read()
        lines = text.count("\n")
        heap = [ln for ln in text.splitlines() if ln.endswith("[heap]")]
        start = int(heap[0].split("-")[0], 16)
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        buf = bytearray(4096)
        rows.append(("4 KiB pread of /proc/PID/mem",
                     per_call(lambda: os.preadv(mem, [buf], start), n), "per access (today)"))

        def read_maps() -> None:
            with open(f"/proc/{pid}/maps", "rb") as f:
                f.read()

        rows.append((f"read /proc/PID/maps ({lines} lines)", per_call(read_maps, max(1, n // 10)),
                     "per access"))  # fmt: skip
        maps = os.open(f"/proc/{pid}/maps", os.O_RDONLY)
        query = bytearray(struct.pack(PROCMAP_QUERY_FMT, struct.calcsize(PROCMAP_QUERY_FMT),
                                      PROCMAP_QUERY_COVERING_OR_NEXT_VMA, start,
                                      *([0] * 12)))  # fmt: skip
        try:
            fcntl.ioctl(maps, PROCMAP_QUERY, query)
            rows.append(("PROCMAP_QUERY ioctl", per_call(
                lambda: fcntl.ioctl(maps, PROCMAP_QUERY, query), n), "per access"))  # fmt: skip
        except OSError as exc:
            rows.append((f"PROCMAP_QUERY ioctl: {exc.strerror}", float("nan"), "-"))
        os.close(maps)
        from softverbs.device.memory import ProcessMemory

        pm = ProcessMemory(os.dup(mem), pid)
        span = pm.span(start, 4096, pinned=True)
        if span.pin is not None:
            rows.append(("the service's check of a 4 KiB span", per_call(span.still_mapped, n),
                         "per access (now)"))  # fmt: skip
        pm.close()
        os.close(mem)
    finally:
        client.kill()
        client.wait()
    print(f"{'operation':<44}{'us':>9}  paid")
    for name, us, when in rows:
        print(f"{name:<44}{us:>9.2f}  {when}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
