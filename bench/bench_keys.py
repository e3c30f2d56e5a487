"""What the service's key checks and copies of client memory cost, per call.

The served device reaches a C program's buffers through the client's
``/proc/PID/mem`` (``device/memory.py``): every SGE and every remote access is
a key check (``KeyTable.local`` / ``.remote``, ``engine/memory.py``) that
bounds-checks the range, checks that the region is still mapped as registered
(one ``PROCMAP_QUERY`` per region per pass, :func:`new_pass`) and, for a read,
copies it.  This measures those calls on this process's own ``/proc/self/mem``:
a 1 MiB anonymous mapping registered by address with its ``Pin``, as the
service registers a client's ``malloc``ed buffer, a 4 KiB access at a time --
within one pass (a burst of WQEs) and with a new pass before each call (every
message the service serves starts one) -- beside the bare system calls and a
region of this process's memory (the in-process device).

Each figure is this process's CPU time per call (``time.process_time``), the
minimum and the median of ``--rounds`` rounds of ``--n`` calls, all the rows
interleaved round by round.  The calls are made from Python, so each includes
its argument parsing, which the engine's typed (compiled) calls skip.

    python bench/bench_keys.py [--n 10000] [--rounds 7]
    PYTHONPATH=/path/to/other/src python bench/bench_keys.py   # another tree
    SOFTVERBS_PURE=1 python bench/bench_keys.py                 # interpreted
    python bench/bench_keys.py --only "new pass"                # some rows only

``--only`` runs the rows whose names contain the text (the loop alone too), so
that an instruction count (callgrind: a run of ``--n 5000 --rounds 1`` minus one
of ``--n 1000``) measures those calls alone.

A benchmark, never a test: compare trees by running them alternately.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import time

from softverbs.device import memory as device_memory
from softverbs.device.memory import ProcessMemory
from softverbs.engine.memory import REMOTE_WRITE, KeyTable, MemKind, new_pass

REGION = 1 << 20
ALL_ACCESS = 0xF


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="", help="run only the rows whose names contain this")
    args = ap.parse_args()

    dst = mmap.mmap(-1, REGION)
    dst.write(b"\1" * REGION)  # the pages present, as a program's written buffer
    src = mmap.mmap(-1, REGION)
    src.write(b"\2" * REGION)
    dst_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    src_addr = ctypes.addressof(ctypes.c_char.from_buffer(src))
    mem = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC), os.getpid(),
                        reuse=True)  # fmt: skip
    if mem.maps < 0:
        raise SystemExit("no PROCMAP_QUERY on this kernel (Linux 6.11+): nothing is checked")
    pd = object()
    keys = KeyTable(lambda: 7)
    dst_key = keys.register(MemKind.MR, pd, mem.span(dst_addr, REGION, pinned=True), dst_addr,
                            ALL_ACCESS).key  # fmt: skip
    src_key = keys.register(MemKind.MR, pd, mem.span(src_addr, REGION, pinned=True), src_addr,
                            ALL_ACCESS).key  # fmt: skip
    own = bytearray(1 << 16)
    own_key = keys.register(MemKind.MR, pd, memoryview(own), 0x10000, ALL_ACCESS).key
    payload = memoryview(bytes(range(256)) * 16)
    sub = mem.span(dst_addr + 4096, 4096, pinned=True)
    fd, at, src_at = mem.fd, dst_addr + 4096, src_addr + 4096

    ops: dict[str, str] = {
        "(the loop alone)": "pass",
        "os.pread 4 KiB + memoryview (bare)": "memoryview(os.pread(fd, 4096, src_at))",
        "os.pwritev 4032 + 64 B (bare, 2 slices)":
            "os.pwritev(fd, [payload[:4032], payload[4032:]], at)",
        "span.place 4 KiB, last 64 B apart": "sub.place(0, payload, 64)",
        "PROCMAP_QUERY (ProcessMemory._ask)": "mem._ask(at)",
        "keys.local 4 KiB read, same pass": "keys.local(src_key, pd, src_at, 4096, False)",
        "keys.local 4 KiB read, new pass":
            "new_pass(); keys.local(src_key, pd, src_at, 4096, False)",
        "keys.local write target, same pass": "keys.local(src_key, pd, src_at, 4096, True)",
        "keys.remote WRITE, same pass": "keys.remote(dst_key, pd, 5, at, 4096, REMOTE_WRITE)",
        "keys.remote WRITE, new pass":
            "new_pass(); keys.remote(dst_key, pd, 5, at, 4096, REMOTE_WRITE)",
        "keys.local, a memoryview region": "keys.local(own_key, pd, 0x10064, 64, False)",
    }  # fmt: skip
    ops = {name: stmt for name, stmt in ops.items()
           if args.only in name or name == "(the loop alone)"}  # fmt: skip
    if len(ops) == 1:
        raise SystemExit(f"--only {args.only!r}: no row has that in its name")
    scope = {"os": os, "new_pass": new_pass, "REMOTE_WRITE": REMOTE_WRITE, "keys": keys,
             "mem": mem, "pd": pd, "sub": sub, "payload": payload, "fd": fd, "at": at,
             "src_at": src_at, "src_key": src_key, "dst_key": dst_key, "own_key": own_key}
    loops = {name: compile(f"for _ in range({args.n}):\n    {stmt}\n", name, "exec")
             for name, stmt in ops.items()}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(args.rounds):
        for name, loop in loops.items():
            t0 = time.process_time()
            exec(loop, scope)
            times[name].append((time.process_time() - t0) / args.n * 1e6)
    base = min(times.pop("(the loop alone)"))
    print(f"{device_memory.__file__.rsplit('/', 1)[-1]}, load average "
          f"{os.getloadavg()[0]:.1f}: us per call, min and median of {args.rounds} rounds "
          f"of {args.n}")  # fmt: skip
    for name, got in times.items():
        print(f"{name:42s} {min(got) - base:7.3f} {statistics.median(got) - base:7.3f}")
    mem.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
