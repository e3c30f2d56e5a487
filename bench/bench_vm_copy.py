"""The service's large copies, through ``/proc/PID/mem`` and through ``process_vm_*``.

``ProcessMemory`` copies at least ``VM_COPY`` bytes of a client's memory with one
``process_vm_readv``/``process_vm_writev`` call (``ctypes``) where it may, and
through the client's ``/proc/PID/mem`` descriptor otherwise
(docs/performance.md, *Copies that bypass the descriptor*).  This times both
ways as the service makes them -- a pooled read (``ProcessSpan.read``) and a
store with the last cache line last (``ProcessSpan.place``), checks and
``ctypes`` included -- on this process's own memory: CPU time per copy, the
median of ``--rounds`` interleaved rounds.

    python bench/bench_vm_copy.py [--sizes 131072,1048576] [--rounds 5]

A benchmark, never a test.  ``SOFTVERBS_PURE=1`` times the interpreted module,
where the threshold is lifted so that sizes below ``VM_COPY`` are timed both ways
too (compiled, it is a C global: there both rows below it are the descriptor's).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import sys
import time

from softverbs import compiled
from softverbs.device import memory
from softverbs.device.memory import VM_COPY, ProcessMemory


def _run(size: int, vm: bool, iters: int) -> tuple[float, float]:
    """(read, store) µs of CPU per copy of ``size`` bytes, one way."""
    mem = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC), os.getpid())
    try:
        if not vm:
            mem.vm = False  # the descriptor only, as for a client that refused
        elif not mem.vm:
            raise SystemExit(f"process_vm_* cannot be used here: {mem.vm_why}")
        src, dst = mmap.mmap(-1, size), mmap.mmap(-1, size)
        src.write(os.urandom(size))
        a = ctypes.addressof(ctypes.c_char.from_buffer(src))
        b = ctypes.addressof(ctypes.c_char.from_buffer(dst))
        data = memoryview(os.urandom(size)).toreadonly()
        span, target = mem.span(a, size), mem.span(b, size)
        t = time.process_time()
        for _ in range(iters):
            span.read()
        read = (time.process_time() - t) / iters * 1e6
        t = time.process_time()
        for _ in range(iters):
            target.place(0, data, 64)
        store = (time.process_time() - t) / iters * 1e6
        assert dst[:] == data.tobytes()
        del span, target
        return read, store
    finally:
        mem.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=f"65536,{VM_COPY},262144,1048576")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if "softverbs.device.memory" not in compiled.compiled_modules():
        memory._VM_COPY = 0  # every size both ways
    print(f"CPU us per copy, median of {args.rounds} interleaved rounds "
          f"(VM_COPY {VM_COPY}: below it the service uses the descriptor)")  # fmt: skip
    print(f"{'size':>9} {'way':12} {'read':>8} {'store':>8}")
    for size in [int(s) for s in args.sizes.split(",")]:
        iters = max(200, (32 << 20) // size)
        got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for vm in (False, True):
                got[vm].append(_run(size, vm, iters))
        for vm in (False, True):
            read = statistics.median(r for r, _ in got[vm])
            store = statistics.median(s for _, s in got[vm])
            way = "process_vm" if vm else "/proc/mem"
            print(f"{size:9d} {way:12} {read:8.2f} {store:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
