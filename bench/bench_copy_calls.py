"""What the kernel charges for one copy into or out of another process's memory.

softverbsd copies a WRITE's payload with two system calls on the clients'
``/proc/PID/mem`` descriptors: a ``pread`` from the sender and a ``pwritev`` of
(body, last cache line) to the receiver (docs/performance.md, *Where a 4 KiB
WRITE's time goes*).  This measures those calls against the other ways the
kernel offers, in a small C loop on the process's own memory, so no Python and
no second process count: CPU time per copy (``CLOCK_PROCESS_CPUTIME_ID``), the
median of ``--rounds`` interleaved rounds.

    python bench/bench_copy_calls.py [--size 4096] [--iters 100000] [--batch 9] [--rounds 5]

Rows: ``pread`` and ``pwrite`` on ``/proc/self/mem`` (what the service does,
the write in one piece and as body plus last line), and ``process_vm_readv`` /
``process_vm_writev`` one copy per call and ``--batch`` copies per call (what a
service allowed to ptrace its clients could do, gathering a turn's copies).
Needs ``gcc``.  A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# One C program: argv = size iters batch way; prints the CPU ns per copy.
SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    size_t size = strtoul(argv[1], NULL, 0), line = 64;
    long iters = strtol(argv[2], NULL, 0);
    int batch = atoi(argv[3]), way = atoi(argv[4]);
    if (size <= line || batch < 1 || batch > 64) return 2;
    char *mem = aligned_alloc(4096, size), *local = aligned_alloc(4096, size * batch);
    memset(mem, 1, size);
    memset(local, 2, size * batch);
    int fd = open("/proc/self/mem", O_RDWR);
    if (fd < 0) { perror("/proc/self/mem"); return 1; }
    pid_t me = getpid();
    struct iovec l = {local, size * batch}, r[128];
    for (int k = 0; k < batch; k++) {  /* (body, last line) per copy; reads use r[2k] whole */
        r[2 * k] = (struct iovec){mem, size - line};
        r[2 * k + 1] = (struct iovec){mem + size - line, line};
    }
    struct iovec whole[64];
    for (int k = 0; k < batch; k++) whole[k] = (struct iovec){mem, size};
    struct iovec pieces[2] = {{local, size - line}, {local + size - line, line}};
    long calls = iters / batch;
    ssize_t n = 0;
    double t = cpu_ns();
    for (long i = 0; i < calls; i++) {
        switch (way) {
        case 0: n = pread(fd, local, size, (off_t)(size_t)mem); break;
        case 1: n = pwrite(fd, local, size, (off_t)(size_t)mem); break;
        case 2: n = pwritev(fd, pieces, 2, (off_t)(size_t)mem); break;
        case 3: n = process_vm_readv(me, &l, 1, whole, batch, 0); break;
        case 4: n = process_vm_writev(me, &l, 1, r, 2 * batch, 0); break;
        }
        if (n != (ssize_t)(size * (way >= 3 ? batch : 1))) { perror("copy"); return 1; }
    }
    printf("%.0f\n", (cpu_ns() - t) / (calls * batch));
    return 0;
}
"""

#: (label, way, batched): the rows, in the order each round runs them.
WAYS = [
    ("pread from /proc/PID/mem", 0, False),
    ("pwrite to /proc/PID/mem, one piece", 1, False),
    ("pwritev to /proc/PID/mem, body then last line", 2, False),
    ("process_vm_readv, one copy per call", 3, False),
    ("process_vm_writev, body then last line, one per call", 4, False),
    ("process_vm_readv, BATCH copies per call", 3, True),
    ("process_vm_writev, BATCH (body, last line) per call", 4, True),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=9, help="copies per call in the batched rows")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not shutil.which("gcc"):
        print("needs gcc", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "copy_calls"
        src = exe.with_suffix(".c")
        src.write_text(SOURCE)
        subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(exe), str(src)], check=True)
        ns: dict[str, list[float]] = {label: [] for label, _, _ in WAYS}
        for _ in range(args.rounds):
            for label, way, batched in WAYS:
                batch = args.batch if batched else 1
                run = [str(exe), str(args.size), str(args.iters), str(batch), str(way)]
                out = subprocess.run(run, check=True, capture_output=True, text=True)
                ns[label].append(float(out.stdout))
    print(f"{args.size}-byte copies, CPU ns per copy, median of {args.rounds} interleaved rounds")
    print(f"{'way':58} {'median':>8} {'range':>13}")
    for label, values in ns.items():
        name = label.replace("BATCH", str(args.batch))
        spread = f"{min(values):.0f}-{max(values):.0f}"
        print(f"{name:58} {statistics.median(values):8.0f} {spread:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
