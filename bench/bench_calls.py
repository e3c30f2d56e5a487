"""Python calls softverbsd makes per message, counted by cProfile.

A private softverbsd runs interpreted (``SOFTVERBS_PURE=1``, so every Python
function is a call cProfile sees) under ``python -m cProfile`` while Debian's
``ib_send_lat`` (8 B SENDs) -- or with ``--bw`` ``ib_write_bw`` (4 KiB WRITEs)
-- runs through it twice, with ``--iters`` and with twice as many iterations;
the difference between the two counts, divided by the extra one-way messages,
is what one message costs the service without the setup both runs share, by
module (``builtins`` for C functions such as ``len`` or ``dict.get``).

    python bench/bench_calls.py [--bw] [--iters 1000] [--src DIR/src]

``--src`` counts another checkout's service.  A benchmark, never a test: the
counts are exact for a given run, but how many WRITEs one wake-up of the
service serves depends on timing, so ``--bw`` moves by a call or two.
"""

from __future__ import annotations

import argparse
import pstats
import shutil
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_perftest import LAT_SIZE, on_wrapped_service


def profiled_run(src: str, tool: str, size: int, iters: int) -> Counter[str]:
    """One interpreted service under cProfile serving one perftest run: its calls by module."""
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
    _, stats = on_wrapped_service(
        [sys.executable, "-m", "cProfile", "-o", "{out}"],
        lambda out: pstats.Stats(out).stats,  # type: ignore[attr-defined]
        src, {"SOFTVERBS_PURE": "1"}, tool, size, iters)
    by: Counter[str] = Counter()
    for (filename, _line, _name), (_prim, calls, _tt, _ct, _callers) in stats.items():
        if "softverbs/" in filename:
            module = "softverbs/" + filename.split("softverbs/")[-1]
        else:
            module = "builtins" if filename == "~" else "other Python (stdlib)"
        by[module] += calls
    return by


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=1000, help="iterations (and 2x)")
    ap.add_argument("--bw", action="store_true",
                    help="ib_write_bw 4 KiB WRITEs instead of ib_send_lat 8 B SENDs")  # fmt: skip
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    args = ap.parse_args()
    if shutil.which("ib_send_lat") is None:
        print("needs perftest (scripts/apt-packages.txt)", file=sys.stderr)
        return 1
    tool, size = ("ib_write_bw", 4096) if args.bw else ("ib_send_lat", LAT_SIZE)
    one = profiled_run(args.src, tool, size, args.iters)
    two = profiled_run(args.src, tool, size, 2 * args.iters)
    messages = args.iters * (1 if args.bw else 2)  # the extra one-way messages
    per = {m: (two[m] - one[m]) / messages for m in set(one) | set(two)}
    print(f"softverbsd ({args.src}, interpreted): Python calls per one-way {size} B message "
          f"of {tool} ({args.iters} more iterations)")  # fmt: skip
    for module, calls in sorted(per.items(), key=lambda kv: -kv[1]):
        if abs(calls) >= 0.05:
            print(f"  {calls:8.1f}  {module}")
    print(f"  {sum(per.values()):8.1f}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
