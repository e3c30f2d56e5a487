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
* **The service's whole access per message** (``device/memory.py`` as the
  engine drives it, a new pass each time as for every message the service
  serves; and again within one pass, as for a burst of WQEs): the slice of a
  registered span, its check and an 8-byte ``pread``
  (ib_send_lat's SGE), and a 4 KiB store with its last 64 bytes stored last
  (the end of a WRITE) as two ``pwrite`` calls (two slice assignments) or
  as one ``pwritev`` (``ProcessSpan.place``).

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
    """Median-of-5 microseconds of this process's CPU time per call of ``fn``
    (CPU time: other processes on a loaded machine do not count)."""
    runs = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        runs.append((time.process_time() - t0) / n * 1e6)
    return sorted(runs)[2]


def per_message(pid: int, region: int, n: int) -> list[tuple[str, float, str]]:
    """The service's accesses of one message to a region of process ``pid``
    registered at ``region`` (64 KiB), each in a pass of its own."""
    from softverbs.device.memory import ProcessMemory
    from softverbs.engine.memory import new_pass

    rows: list[tuple[str, float, str]] = []
    pm = ProcessMemory(os.open(f"/proc/{pid}/mem", os.O_RDWR), pid, reuse=True)
    try:
        span = pm.span(region, 1 << 16, pinned=True)
        rows.append(("new_pass() alone", per_call(new_pass, n), "per message"))

        def check() -> None:
            new_pass()
            span[64:72].still_mapped()

        def read8() -> None:
            new_pass()
            part = span[64:72]
            if part.still_mapped():
                part.read()

        def again() -> None:
            span[64:72].still_mapped()

        rows.append(("slice + check (new pass)", per_call(check, n), "per access"))
        rows.append(("slice + check, again in the same pass", per_call(again, n), "per access"))
        rows.append(("slice + check + 8 B pread (new pass)", per_call(read8, n), "per access"))
        data = memoryview(os.urandom(4096))

        def two() -> None:
            span[0:4032] = data[:4032]
            span[4032:4096] = data[4032:]

        def one() -> None:
            span.place(0, data, 64)

        rows.append(("4 KiB store, last 64 B apart: two pwrite", per_call(two, n), "per message"))
        if hasattr(span, "place"):  # not in a tree before it
            rows.append(("4 KiB store, last 64 B apart: one pwritev", per_call(one, n),
                         "per message"))  # fmt: skip
        assert pm.faults == 0
    finally:
        pm.close()
    return rows


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

    # the client: softverbs imported (its mappings), and a 64 KiB mapping to store into
    script = ("import ctypes, mmap, softverbs, sys; m = mmap.mmap(-1, 1 << 16); "
              "print(ctypes.addressof(ctypes.c_char.from_buffer(m)), flush=True); "
              "sys.stdin.read()")  # fmt: skip
    client = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert client.stdout is not None
        region = int(client.stdout.readline())
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
        rows.extend(per_message(pid, region, n))
    finally:
        client.kill()
        client.wait()
    print(f"{'operation':<52}{'us':>9}  paid")
    for name, us, when in rows:
        print(f"{name:<52}{us:>9.2f}  {when}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
