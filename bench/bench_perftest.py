"""perftest on softverbs beside ucx_perftest over TCP, from the same run.

Debian's own perftest binaries (``ib_write_bw``, ``ib_send_lat``) run
unmodified on the host device through ``softverbs exec`` (docs/c-programs.md)
as two processes on one host, and ``ucx_perftest`` (Debian ``ucx-utils``)
runs ``ucp_put_bw`` and ``tag_lat`` over kernel TCP on loopback, for scale.
The table gives perftest's own figures (its ``BW average`` and its
``t_typical`` and 99% latency columns) and each as a ratio to UCX's.  Beside
``ib_send_lat`` it gives Open MPI's (Debian ``openmpi-bin``, ``pml ucx``)
8-byte half round trip over UCX's ``rc_verbs`` on the same device, measured by
``tests/thirdparty/mpi_pingpong.c`` (``--no-mpi`` leaves it out).

    python bench/bench_perftest.py [--sizes 4096,65536,1048576] [--plot FILE.png] [--cpu]
    python bench/bench_perftest.py --baseline DIR [--rounds 3] [--sizes ...] [--env VAR=VALUE]

``--baseline DIR`` compares this tree with another checkout of softverbs (DIR
holds its ``src/``; e.g. ``git archive main | tar -x -C DIR``) instead of UCX: each
round runs every figure once with each tree, in alternating order, each tree
on a service of its own started from its own sources, and the table gives the
median of the rounds for both and their ratio, with each service's CPU time per
``ib_write_bw`` WRITE and per one-way ``ib_send_lat`` message, and its minor page
faults per WRITE (``/proc/PID/stat``, connection set-up included; give
``--iters`` enough for the 10 ms CPU ticks;
a compiled DIR needs its built modules copied with it, ``cp -a``).
``ib_send_lat`` runs twice: where the scheduler puts its three processes, and
with the service pinned to a CPU of its own and both perftest processes to the
others (``service own core``).  On two cores the two differ by about half:
two polling perftests take turns on one core through the ``sched_yield`` of an
empty ``poll_cq``, while a service that shares a core with one of them waits for
it at every wake (docs/performance.md, *Where the three processes run*).  The
scheduler moves between these placements within a run, so its figure is
bimodal; give ``--lat-iters`` 20000 or more for a steady one.

``--env VAR=VALUE`` (repeatable) sets a variable for this tree's service and programs
only, e.g. ``SOFTVERBS_SPIN_US=50``.
``BENCH_TIMEOUT`` (seconds, default 300) bounds each program.

A benchmark, never a test: the machine is shared and noisy, so compare the
ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loopback import UCX_ENV, _free_tcp_port, ucx_outstanding, ucx_run
from progress import Progress, add_quiet

TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "300"))
LAT_SIZE = 8
MPI_PINGPONG = Path(__file__).resolve().parents[1] / "tests" / "thirdparty" / "mpi_pingpong.c"
#: Open MPI over UCX's rc_verbs on sv0 and nothing else (tests/thirdparty/test_mpi.py)
MPI_ARGS = ["--allow-run-as-root", "-np", "2", "--mca", "pml", "ucx", "--mca", "btl", "self",
            "--mca", "osc", "ucx"]  # fmt: skip
MPI_ENV = {"UCX_TLS": "rc_v,self", "UCX_NET_DEVICES": "sv0:1", "UCX_UD_ETH_DGID_CHECK": "n"}
CPU_WINDOW = 2.0  #: seconds over which --cpu samples the processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/PID/stat``; 0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
    except OSError:
        return 0


T = TypeVar("T")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (``taskset -a -p``)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def own_core_latency(env: dict[str, str], iters: int) -> list[float]:
    """``ib_send_lat``'s row with env's running service alone on the last CPU and
    perftest's two processes on the others (module docstring); needs two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    service = int(Path(env["SOFTVERBS_SERVICE"] + ".pid").read_text().split()[0])
    pin(service, {cpus[-1]})
    try:
        args = ["-s", str(LAT_SIZE), "-n", str(iters)]
        return row(perftest("ib_send_lat", args, env, cpus=set(cpus[:-1])), LAT_SIZE)
    finally:
        pin(service, set(cpus))


def perftest(tool: str, args: list[str], env: dict[str, str],
             cpu: dict[str, float] | None = None, cpus: set[int] | None = None) -> str:
    """Run ``tool`` as server and client on softverbs; the client's output.

    With ``cpu``, fill it with the cores each process used (CPU seconds per
    second) over the middle of the run: the service, the client, the server.
    With ``cpus``, both processes run on those CPUs only."""
    port = str(_free_tcp_port())
    cmd = [sys.executable, "-m", "softverbs", "exec", "--", tool, "-d", "sv0", "-x", "1",
           "-p", port, *args]  # fmt: skip
    if cpus is not None:
        cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *cmd]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # the client retries until the server listens
            client = subprocess.Popen([*cmd, "127.0.0.1"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)  # fmt: skip
            if cpu is not None:
                time.sleep(1.0)  # past the connection setup
                service = int(Path(env["SOFTVERBS_SERVICE"] + ".pid").read_text().split()[0])
                pids = {"softverbsd": service, f"{tool} client": client.pid,
                        f"{tool} server": server.pid}  # fmt: skip
                t0, before = time.monotonic(), {k: cpu_seconds(p) for k, p in pids.items()}
                time.sleep(CPU_WINDOW)
                wall = time.monotonic() - t0
                cpu.update({k: (cpu_seconds(p) - before[k]) / wall for k, p in pids.items()})
            out, _ = client.communicate(timeout=TIMEOUT)
            if client.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        server.communicate(timeout=TIMEOUT)
    finally:
        for proc in (server, client):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if client.returncode != 0:
        raise SystemExit(f"{tool} {' '.join(args)} failed:\n{out}")
    if cpu is not None and any(v == 0 for v in cpu.values()):
        raise SystemExit(f"{tool} ended within {CPU_WINDOW} s: give it more iterations (--iters)")
    return out


def mpi_half_round_trip(env: dict[str, str], iters: int) -> float | None:
    """Open MPI's 8-byte half round trip in µs over UCX ``rc_verbs`` on the host
    device, or None (with the reason on stderr) where Open MPI is not installed."""
    import shutil

    if shutil.which("mpicc.openmpi") is None or shutil.which("mpirun.openmpi") is None:
        print("Open MPI row left out: mpicc.openmpi/mpirun.openmpi not installed "
              "(Debian libopenmpi-dev, openmpi-bin)", file=sys.stderr)  # fmt: skip
        return None
    prog = os.path.join(tempfile.mkdtemp(prefix="svmpi", dir="/tmp"), "mpi_pingpong")
    subprocess.run(["mpicc.openmpi", "-O2", str(MPI_PINGPONG), "-o", prog], check=True,
                   capture_output=True, timeout=TIMEOUT)  # fmt: skip
    cmd = [sys.executable, "-m", "softverbs", "exec", "--", "mpirun.openmpi", *MPI_ARGS, prog,
           str(iters), str(LAT_SIZE)]  # fmt: skip
    r = subprocess.run(cmd, env={**env, **MPI_ENV}, capture_output=True, text=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    m = re.search(rf"^pingpong {LAT_SIZE} bytes \d+ iterations errors 0 usec/roundtrip (\S+)",
                  r.stdout, re.M)  # fmt: skip
    if r.returncode != 0 or m is None:
        raise SystemExit(f"Open MPI ping-pong failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return float(m.group(1)) / 2


def on_wrapped_service(wrapper: list[str], read: Callable[[str], T], src: str,
                       extra: dict[str, str], tool: str, size: int, iters: int) -> tuple[str, T]:
    """One ``tool`` run of ``size`` bytes on a softverbsd started from ``src`` under
    ``wrapper`` (a tracer's or profiler's argv, ``{out}`` standing for the file it
    writes), with ``extra`` in the environment; the service is stopped with SIGTERM,
    a clean exit, so the wrapper writes its file.  perftest's output and what
    ``read`` makes of that file (given its path)."""
    import shutil
    import signal

    tmp = tempfile.mkdtemp(prefix="svwrap", dir="/tmp")
    sock, out = os.path.join(tmp, "sv.sock"), os.path.join(tmp, "wrapper.out")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env.update(PYTHONPATH=src, SOFTVERBS_SERVICE=sock, **extra)
    argv = [a.replace("{out}", out) for a in wrapper]
    svc = subprocess.Popen([*argv, "-m", "softverbs.service", "--socket", sock],
                           env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert svc.stdout is not None
        line = svc.stdout.readline()  # "softverbsd: serving on ..."
        if "serving" not in line:
            raise SystemExit(f"the service did not start: {line!r}")
        output = perftest(tool, ["-s", str(size), "-n", str(iters)], env)
    finally:
        pid = int(Path(sock + ".pid").read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        svc.wait(timeout=60)
    time.sleep(0.2)
    got = read(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return output, got


def row(out: str, size: int) -> list[float]:
    """perftest's result row for ``size`` (the numbers after #bytes #iterations)."""
    m = re.search(rf"^\s*{size}\s+\d+\s+(.*)$", out, re.M)
    if m is None:
        raise SystemExit(f"no result row for {size} bytes in:\n{out}")
    return [float(x) for x in m.group(1).split()]


def compare(args: argparse.Namespace, sizes: list[int]) -> int:
    """``--baseline``: this tree beside another checkout, interleaved (module docstring)."""
    import statistics

    trees = {"baseline": str(Path(args.baseline).resolve() / "src"),
             "this tree": str(Path(__file__).resolve().parents[1] / "src")}  # fmt: skip
    envs: dict[str, dict[str, str]] = {}
    for name, src in trees.items():
        if not (Path(src) / "softverbs").is_dir():
            raise SystemExit(f"--baseline: no softverbs sources in {src}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
        env["PYTHONPATH"] = src  # before the installed (editable) softverbs
        if name == "this tree":
            for setting in args.env:
                var, _, value = setting.partition("=")
                env[var] = value
        env["SOFTVERBS_SERVICE"] = os.path.join(tempfile.mkdtemp(prefix="svpt", dir="/tmp"),
                                                "sv.sock")  # fmt: skip
        envs[name] = env
    for env in envs.values():  # started before the rounds: its start-up is in no figure
        subprocess.run([sys.executable, "-m", "softverbs", "service", "start"], env=env,
                       capture_output=True, check=True, timeout=60)  # fmt: skip
    figures: dict[str, dict[str, list[float]]] = {}
    progress = Progress(args.rounds * 2 * (len(sizes) + 1), args.quiet)
    for r in range(args.rounds):
        order = list(envs) if r % 2 == 0 else list(reversed(envs))
        for name in order:
            env = envs[name]
            service = int(Path(env["SOFTVERBS_SERVICE"] + ".pid").read_text().split()[0])
            for size in sizes:
                n = args.iters or max(100, min(5000, (64 << 20) // size))
                progress.step(f"round {r + 1}: ib_write_bw {size} B, {name}")
                busy, faults = cpu_seconds(service), minor_faults(service)
                bw = row(perftest("ib_write_bw", ["-s", str(size), "-n", str(n)], env), size)[1]
                # the service's CPU time and page faults over the run, per WRITE
                busy = (cpu_seconds(service) - busy) / n * 1e6
                faults = (minor_faults(service) - faults) / n
                for label, value in ((f"ib_write_bw {size} B, MB/s", bw),
                                     (f"  svc CPU us/WRITE {size} B", busy),
                                     (f"  svc faults/WRITE {size} B", faults)):  # fmt: skip
                    figures.setdefault(label, {}).setdefault(name, []).append(value)
            progress.step(f"round {r + 1}: ib_send_lat {LAT_SIZE} B, {name}")
            busy = cpu_seconds(service)
            lat = row(perftest("ib_send_lat", ["-s", str(LAT_SIZE), "-n", str(args.lat_iters)],
                               env), LAT_SIZE)  # fmt: skip
            # the service's CPU time over the run (connection set-up included) per one-way message
            busy = (cpu_seconds(service) - busy) / (2 * args.lat_iters) * 1e6
            rows = [(f"ib_send_lat {LAT_SIZE} B typical, us", lat[2]),
                    (f"ib_send_lat {LAT_SIZE} B 99%, us", lat[5]),
                    ("softverbsd CPU us per message", busy)]  # fmt: skip
            if len(os.sched_getaffinity(0)) >= 2:
                own = own_core_latency(env, args.lat_iters)
                rows.append(("  service own core: typical, us", own[2]))
            for label, value in rows:
                figures.setdefault(label, {}).setdefault(name, []).append(value)
    for env in envs.values():
        subprocess.run([sys.executable, "-m", "softverbs", "service", "stop"], env=env,
                       capture_output=True, check=False, timeout=60)  # fmt: skip
    print(f"this tree beside the baseline {args.baseline}: median of {args.rounds} "
          f"interleaved rounds")  # fmt: skip
    print(f"{'figure':<34}{'baseline':>12}{'this tree':>12}{'ratio':>8}")
    for label, by in figures.items():
        base, ours = statistics.median(by["baseline"]), statistics.median(by["this tree"])
        print(f"{label:<34}{base:>12.1f}{ours:>12.1f}{ours / base:>8.3f}")
    print("every round (baseline / this tree):")
    for label, by in figures.items():
        rounds = zip(by["baseline"], by["this tree"], strict=True)
        pairs = "  ".join(f"{b:.1f}/{o:.1f}" for b, o in rounds)
        print(f"  {label:<32}{pairs}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,65536,1048576")
    ap.add_argument("--iters", type=int, default=0, help="iterations per size (default: ~64 MiB)")
    ap.add_argument("--lat-iters", type=int, default=2000)
    ap.add_argument("--plot", metavar="FILE.png")
    ap.add_argument("--cpu", action="store_true",
                    help="also print the cores the service and the two perftest processes "
                         "use during ib_write_bw at the largest size")  # fmt: skip
    ap.add_argument("--no-mpi", dest="mpi", action="store_false",
                    help="leave out Open MPI's ping-pong over UCX rc_verbs")
    ap.add_argument("--baseline", metavar="DIR",
                    help="compare with the softverbs checkout in DIR instead of UCX")
    ap.add_argument("--rounds", type=int, default=3, help="--baseline: interleaved rounds")
    ap.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                    help="--baseline: set VAR for this tree's service and programs")
    add_quiet(ap)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.baseline:
        return compare(args, sizes)
    progress = Progress(2 * len(sizes) + 3 + args.mpi, args.quiet)
    run_dir = tempfile.mkdtemp(prefix="svpt", dir="/tmp")
    # the service runs in the mode asked of this run (SOFTVERBS_PURE, bench_modes.py)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SOFTVERBS_") or k == "SOFTVERBS_PURE"}  # fmt: skip
    env["SOFTVERBS_SERVICE"] = os.path.join(run_dir, "sv.sock")  # a fresh service, this run's
    bw: dict[int, tuple[float, float]] = {}
    cpu: dict[str, float] = {}
    for size in sizes:
        n = args.iters or max(100, min(5000, (64 << 20) // size))
        progress.step(f"ib_write_bw {size} B on softverbs")
        sample = cpu if args.cpu and size == max(sizes) else None
        if sample is not None:
            n = max(n, (8 << 30) // size)  # 8 GiB: seconds of steady state to sample
        ours = row(perftest("ib_write_bw", ["-s", str(size), "-n", str(n)], env, sample),
                   size)[1]  # fmt: skip
        progress.step(f"ucx_perftest ucp_put_bw {size} B over TCP")
        ucx = ucx_run(["-t", "ucp_put_bw", "-s", str(size), "-n", str(n), "-w", str(n // 10),
                       "-O", str(ucx_outstanding(size))], TIMEOUT)[7] * size / 1e6  # fmt: skip
        bw[size] = (ours, ucx)
    progress.step("ib_send_lat 8 B on softverbs")
    lat_args = ["-s", str(LAT_SIZE), "-n", str(args.lat_iters)]
    lat = row(perftest("ib_send_lat", lat_args, env), LAT_SIZE)
    own = None
    if len(os.sched_getaffinity(0)) >= 2:
        progress.step("ib_send_lat 8 B on softverbs, the service on a core of its own")
        own = own_core_latency(env, args.lat_iters)
    # ib_send_lat: t_min t_max t_typical t_avg t_stdev 99% 99.9% (usec, one way)
    progress.step("ucx_perftest tag_lat 8 B over TCP")
    ucx_lat = {rank: ucx_run(["-t", "tag_lat", "-s", str(LAT_SIZE), "-n", str(args.lat_iters),
                              "-R", str(rank)], TIMEOUT)[1] for rank in (50, 99)}  # fmt: skip
    mpi = None
    if args.mpi:
        progress.step("Open MPI over UCX rc_verbs, 8 B ping-pong on softverbs")
        mpi = mpi_half_round_trip(env, args.lat_iters)
    subprocess.run([sys.executable, "-m", "softverbs", "service", "stop"], env=env,
                   capture_output=True, check=False, timeout=60)  # fmt: skip
    print(f"perftest on softverbs (host device, two processes) vs ucx_perftest over TCP "
          f"({UCX_ENV.get('UCX_TLS', 'tcp')}), one run")
    print(f"{'bandwidth, MB/s':<22}{'ib_write_bw':>14}{'ucp_put_bw':>14}{'ratio':>9}")
    for size, (ours, ucx) in bw.items():
        print(f"{size:>10} B{'':<10}{ours:>14.1f}{ucx:>14.1f}{ours / ucx:>9.3f}")
    print(f"{'latency, us (8 B)':<22}{'ib_send_lat':>14}{'tag_lat':>14}{'ratio':>9}")
    print(f"{'  typical / median':<22}{lat[2]:>14.1f}{ucx_lat[50]:>14.1f}"
          f"{lat[2] / ucx_lat[50]:>9.1f}")  # fmt: skip
    print(f"{'  99%':<22}{lat[5]:>14.1f}{ucx_lat[99]:>14.1f}{lat[5] / ucx_lat[99]:>9.1f}")
    if own is not None:
        print(f"{'  service own core':<22}{own[2]:>14.1f}{ucx_lat[50]:>14.1f}"
              f"{own[2] / ucx_lat[50]:>9.1f}   (typical; 99%: {own[5]:.1f})")  # fmt: skip
    if mpi is not None:
        print(f"{'  Open MPI, UCX rc_verbs':<22}{mpi:>14.1f}{ucx_lat[50]:>14.1f}"
              f"{mpi / ucx_lat[50]:>9.1f}   (half round trip, mean)")  # fmt: skip
    if cpu:
        print(f"cores used during ib_write_bw at {max(sizes)} B (CPU s per s, over {CPU_WINDOW} s)")
        for name, cores in cpu.items():
            print(f"  {name:<22}{cores:>6.2f}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = list(bw)
        ax.plot(xs, [bw[s][0] for s in xs], "o-", label="ib_write_bw on softverbs")
        ax.plot(xs, [bw[s][1] for s in xs], "s--", label="ucx_perftest ucp_put_bw, TCP")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("MB/s")
        ax.legend()
        ax.set_title("perftest on softverbs beside UCX over TCP (one run)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
