"""``softverbs conformance``: run rdma-core's own test suite on softverbs.

rdma-core's ``tests/`` directory is the verbs conformance suite of the field
(kernel soft-RoCE is tested against it).  It ships in the ``pyverbs`` sdist on
PyPI, which also holds pyverbs' sources.  This command:

1. fetches the sdist with ``pip download --no-deps pyverbs==VERSION`` into a
   cache directory (``--cache``, else ``$SOFTVERBS_CACHE``, else
   ``~/.cache/softverbs/conformance``), and reuses it when present;
2. unpacks ``rdma-core/tests`` next to it in the cache -- the suite is GPL and
   is never copied anywhere else (in particular not into a source tree);
3. runs ``tests/run_tests.py -v`` through ``softverbs exec`` on one device
   configuration (``--config``):

   * ``embedded`` (default): the in-process device ``sv0``, no link table.
     Fastest, and every single-process test runs exactly as it would.
   * ``udp``: a RoCEv2 UDP device bound to the loopback interface (``softverbs
     link add --netdev lo``).  Packets really are encoded, sent and decoded,
     and the device has a netdev, so tests that need an IP address run too.
   * ``service``: the same UDP device on ``lo``, served by ``softverbsd``
     (started for the run on a private socket, stopped afterwards), so the
     processes a test forks share one device, as they share kernel rxe.  This
     is the configuration closest to ``rdma link add rxe0 type rxe netdev lo``,
     and the one where rdma-core's two-process RDMA CM tests can run.

   ``udp`` and ``service`` need UDP port 4791 on the loopback addresses; the
   run stops at once, saying so, when another device holds it.

4. parses unittest's verbose output and prints, per test file and in total,
   the tests that passed, failed, errored and were skipped.  A skipped test
   never counts as passed, and a test the output does not account for (the
   run timed out, or the output could not be read) counts as an error.

Two switches choose what runs, for comparing pyverbs implementations on one suite:

* ``--suite debian`` runs the suite Debian's ``python3-pyverbs`` ships
  (``/usr/share/doc/rdma-core/tests``, rdma-core 44 on bookworm; some files
  gzipped), unpacked into the cache as the PyPI one is, instead of the PyPI
  sdist's;
* ``--pyverbs system`` runs it with the machine's pyverbs (Debian's, the real
  Cython pyverbs, under ``/usr/bin/python3``: ``--python``) through
  ``softverbs exec --system-pyverbs``, so every verb goes through softverbs' C
  libraries; it needs ``--config service`` (the C libraries reach devices only
  through softverbsd).  The default is softverbs' own pyverbs.

``--json FILE`` writes the same numbers, with each failure's and skip's
reason, for tools (``tests/conformance/test_conformance.py`` compares the
passed count with ``tests/conformance/floor.json``); ``--floor N`` makes the
exit status 1 when fewer than ``N`` tests passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_VERSION = "59.0"
CONFIGS = ("embedded", "udp", "service")
#: Test files that only run on one vendor's hardware (mlx5, EFA, irdma) or a GPU.
VENDOR_PREFIXES = ("test_mlx5", "test_efa", "test_cuda")
STATUSES = ("passed", "failed", "errors", "skipped", "xfailed")
#: environment variables that opt softverbs into vendor features (mlx5dv signature
#: offload ...): cleared, so the generic count is the generic device's
VENDOR_OPT_INS = ("SOFTVERBS_MLX5",)  #: prefixes; a new vendor opt-in variable goes here too
DEFAULT_TIMEOUT = 3600.0
SUITES = ("pypi", "debian")
#: where Debian's python3-pyverbs puts rdma-core's tests/
DEBIAN_SUITE = Path("/usr/share/doc/rdma-core/tests")
PYVERBS = ("softverbs", "system")
#: the interpreter Debian's python3-pyverbs is built for
SYSTEM_PYTHON = "/usr/bin/python3"


# --- fetching the suite ---------------------------------------------------------------------------


def cache_dir(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("SOFTVERBS_CACHE")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/softverbs/conformance").expanduser()


def fetch_sdist(cache: Path, version: str) -> Path:
    """The pyverbs sdist in ``cache``, downloaded with pip if it is not there yet."""
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / f"pyverbs-{version}.tar.gz"
    if sdist.exists():
        return sdist
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-d", str(cache), f"pyverbs=={version}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not sdist.exists():
        raise RuntimeError(
            f"pip download of pyverbs=={version} failed:\n{proc.stdout}{proc.stderr}"
        )
    return sdist


def unpack_suite(sdist: Path, cache: Path, version: str) -> Path:
    """``rdma-core/tests`` of the sdist, unpacked once under ``cache``; returns the
    directory that *contains* ``tests`` (run_tests.py imports the package ``tests``)."""
    root = cache / f"suite-{version}"
    tests = root / "tests"
    if (tests / "run_tests.py").exists():
        return root
    with _staged(cache, root) as tmp, tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts
            # pyverbs-59.0/rdma-core/tests/<file>: regular files only
            if len(parts) >= 4 and parts[1:3] == ("rdma-core", "tests") and m.isfile():
                m.name = str(Path("tests", *parts[3:]))
                members.append(m)
        if not members:
            raise RuntimeError(f"{sdist} has no rdma-core/tests")
        tar.extractall(tmp, members=members, filter="data")
    return root


@contextlib.contextmanager
def _staged(cache: Path, root: Path) -> Iterator[Path]:
    """A fresh directory under ``cache`` to fill; when the block succeeds it replaces
    ``root``, when it fails it is removed -- a half-made suite never stands at ``root``."""
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="suite-", dir=cache))
    try:
        yield tmp
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def debian_version(package: str = "python3-pyverbs") -> str:
    """The installed version of Debian's ``package``; RuntimeError if it is not installed."""
    try:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", package],
                              capture_output=True, text=True, check=False)  # fmt: skip
    except OSError:
        raise RuntimeError(f"no dpkg-query: {package} cannot be found here") from None
    words = proc.stdout.split()
    if proc.returncode or len(words) < 4 or words[2] != "installed":
        raise RuntimeError(f"Debian's {package} is not installed (apt-get install {package})")
    return words[3]


def unpack_debian_suite(cache: Path, source: Path = DEBIAN_SUITE) -> tuple[Path, str]:
    """(the directory containing ``tests``, the package version) of the suite Debian's
    python3-pyverbs ships, copied once into ``cache`` with its gzipped files unpacked."""
    import gzip

    version = debian_version()
    root = cache / f"suite-debian-{version}"
    if (root / "tests" / "run_tests.py").exists():
        return root, version
    if not (source / "run_tests.py").exists():
        raise RuntimeError(f"{source} holds no rdma-core tests (is python3-pyverbs installed?)")
    with _staged(cache, root) as tmp:
        (tmp / "tests").mkdir()
        for f in sorted(source.iterdir()):
            if f.name.endswith(".gz"):
                (tmp / "tests" / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
            elif f.is_file():
                shutil.copyfile(f, tmp / "tests" / f.name)
    return root, version


# --- parsing unittest's verbose output ------------------------------------------------------------

_HEADER = re.compile(
    r"^(?P<meth>\w+) \((?P<id>tests\.(?P<file>\w+)\.\w+\.(?P=meth))\)(?P<rest>.*)$"
)
#: a module unittest could not import or load: it reports a _FailedTest named after it
_FAILED_LOAD = re.compile(
    r"^(?P<meth>[\w.]+) \((?P<id>unittest\.loader\._FailedTest(?:\.[\w.]+)?)\)(?P<rest>.*)$"
)
_STATUS_WORDS = r"ok|FAIL|ERROR|expected failure|unexpected success|skipped (?P<reason>'.*'|\".*\")"
_STATUS = re.compile(rf" \.\.\. (?P<status>{_STATUS_WORDS})\s*$")
#: a status on a line of its own: the test printed something after unittest's " ... "
_BARE_STATUS = re.compile(rf"^(?P<status>{_STATUS_WORDS})\s*$")
_SECTION = re.compile(r"^(?P<kind>ERROR|FAIL): (?P<meth>[\w.]+) \((?P<id>[\w.]+)\)$")
#: unittest's word -> our status.  An expected failure is not a pass (it is its own
#: column), and an unexpected success is a failure, as unittest itself counts it.
_STATUS_MAP = {"ok": "passed", "FAIL": "failed", "ERROR": "errors",
               "expected failure": "xfailed", "unexpected success": "failed"}  # fmt: skip
#: the pseudo-file of results that belong to no test file (a crash while loading,
#: tests unittest ran that the output does not show)
RUNNER = "(runner)"


@dataclass
class TestResult:
    id: str
    file: str
    status: str  #: passed, failed, errors, skipped or xfailed
    reason: str = ""  #: skip reason, or the last line of the traceback


def _reason(raw: str | None) -> str:
    if not raw:
        return ""
    with contextlib.suppress(ValueError, SyntaxError):
        import ast

        return str(ast.literal_eval(raw))
    return raw.strip("'\"")


class OutputParser:
    """Reads ``unittest -v`` output line by line (as it is printed, for progress).

    :meth:`feed` returns the results a line completes; :meth:`finish` returns
    the rest and fills in each failure's reason from the FAIL:/ERROR: sections.
    A test whose status line never came (a crash, a timeout) is an error.
    """

    def __init__(self) -> None:
        self.results: dict[str, TestResult] = {}
        self.lines: list[str] = []
        self._current: TestResult | None = None
        self._dots = False  #: unittest wrote " ... " for the current test; its status may follow

    def feed(self, line: str) -> list[TestResult]:
        self.lines.append(line)
        done: list[TestResult] = []
        head = _HEADER.match(line) or _FAILED_LOAD.match(line)
        current = self._current
        if head:
            if current is not None and current.id not in self.results:
                self.results[current.id] = current  # the previous one never got a status
                done.append(current)
            file = head.groupdict().get("file") or head.group("meth").rsplit(".", 1)[-1]
            current = self._current = TestResult(head.group("id"), file, "")
            if not head.groupdict().get("file"):  # a _FailedTest: one per module
                current.id = f"{head.group('id')}:{head.group('meth')}"
            tail = head.group("rest")
            self._dots = False
        elif current is not None and not current.status:
            tail = line
        else:
            return done
        st = _STATUS.search(tail) or (_BARE_STATUS.match(tail) if self._dots else None)
        self._dots = self._dots or " ... " in tail
        if st:
            word = st.group("status")
            if word.startswith("skipped"):
                current.status, current.reason = "skipped", _reason(st.group("reason"))
            else:
                current.status = _STATUS_MAP[word]
            self.results[current.id] = current
            done.append(current)
            self._current = None
        return done

    def finish(self) -> list[TestResult]:
        """Every result, in order, each with its final status and reason."""
        current = self._current
        if current is not None and current.id not in self.results:
            self.results[current.id] = current
        tracebacks = _sections(self.lines)
        for r in self.results.values():
            if not r.status:
                r.status, r.reason = "errors", "no result in the output (crash or timeout)"
            elif r.status in ("failed", "errors"):
                r.reason = tracebacks.get(r.id.split(":")[0], r.reason)
        crash = _load_crash(self.lines) if not self.results else None
        if crash:
            self.results["(load)"] = TestResult("(load)", RUNNER, "errors", crash)
        return list(self.results.values())


def _sections(lines: list[str]) -> dict[str, str]:
    """test id -> the last line of its traceback, from the FAIL:/ERROR: sections."""
    out: dict[str, str] = {}
    current: str | None = None
    last = ""
    for line in lines:
        m = _SECTION.match(line)
        if m or line.startswith("Ran ") or line.startswith("=" * 20):
            if current is not None and last:
                out.setdefault(current, last)
            current = m.group("id") if m else None
            last = ""
            continue
        if current is not None and line.strip() and not line.startswith("-" * 20):
            last = line.strip()
    if current is not None and last:
        out.setdefault(current, last)
    return out


def _load_crash(lines: list[str]) -> str | None:
    """The error that stopped the suite before any test ran (a test module that
    fails to import crashes rdma-core's loader), or None."""
    if not any(line.startswith("Traceback") for line in lines):
        return None
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return f"the suite crashed before running any test: {last}"


def parse_output(text: str) -> list[TestResult]:
    """The results in ``unittest -v`` output, in order.  A test whose status
    line is missing (a crash, a timeout) is reported as an error."""
    parser = OutputParser()
    for line in text.splitlines():
        parser.feed(line)
    return parser.finish()


@dataclass
class Summary:
    config: str
    version: str
    seconds: float
    ran: int  #: unittest's own "Ran N tests", -1 if the run did not finish
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    generic: dict[str, int] = field(default_factory=dict)  #: without vendor/GPU files
    results: list[TestResult] = field(default_factory=list)
    #: why the count cannot be taken at face value; each problem is also an error
    problems: list[str] = field(default_factory=list)


def is_vendor(file: str) -> bool:
    return file.startswith(VENDOR_PREFIXES)


def _accounting(results: list[TestResult], ran: int) -> tuple[list[str], list[TestResult]]:
    """The runner's check of its own count: unittest's "Ran N" must equal the
    results read.  Each test not accounted for is an error of the runner."""
    tests = [r for r in results if r.file != RUNNER]
    if ran < 0:
        why = "the suite did not finish: no 'Ran N tests' line in its output"
        return [why], [TestResult("(unfinished)", RUNNER, "errors", why)]
    if ran == len(tests):
        return [], []
    why = (f"unittest ran {ran} tests but the output shows {len(tests)} results: "
           f"{abs(ran - len(tests))} unaccounted for, counted as errors")  # fmt: skip
    return [why], [TestResult(f"(unaccounted {i + 1})", RUNNER, "errors", why)
                   for i in range(abs(ran - len(tests)))]  # fmt: skip


def summarize(results: list[TestResult], config: str, version: str, seconds: float,
              ran: int) -> Summary:  # fmt: skip
    problems, extra = _accounting(results, ran)
    results = results + extra
    s = Summary(config, version, seconds, ran, results=results, problems=problems)
    s.total = dict.fromkeys(STATUSES, 0)
    s.generic = dict.fromkeys(STATUSES, 0)
    for r in results:
        s.files.setdefault(r.file, dict.fromkeys(STATUSES, 0))[r.status] += 1
        s.total[r.status] += 1
        if not is_vendor(r.file):
            s.generic[r.status] += 1
    s.files = dict(sorted(s.files.items()))
    return s


def _row(label: str, c: dict[str, int]) -> str:
    return f"{label:<26}" + "".join(f"{c[k]:>{max(len(k), 6) + 2}}" for k in STATUSES)


def format_table(s: Summary, include_vendor: bool = True) -> str:
    head = f"{'file':<26}" + "".join(f"{k:>{max(len(k), 6) + 2}}" for k in STATUSES)
    rows = [head, "-" * len(head)]
    rows += [_row(file, c) for file, c in s.files.items() if include_vendor or not is_vendor(file)]
    rows.append("-" * len(head))
    rows += [_row("generic (no vendor/GPU)", s.generic), _row("total", s.total)]
    rows += [f"runner: {p}" for p in s.problems]
    return "\n".join(rows)


def counts_line(c: dict[str, int]) -> str:
    return ", ".join(f"{c[k]} {k}" for k in STATUSES)


# --- device configurations ------------------------------------------------------------------------


def check_port_free(addr: str = "127.0.0.1") -> None:
    """RuntimeError unless UDP port 4791 on ``addr`` can be bound (the UDP configurations
    bind it; a second device on the same address would fail every test)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((addr, 4791))
        except OSError as exc:
            raise RuntimeError(f"UDP port 4791 on {addr} is in use ({exc.strerror}): another "
                               "softverbs UDP device or kernel rxe holds the loopback; "
                               "use --config embedded, or stop it") from None  # fmt: skip


@contextlib.contextmanager
def configured(config: str, work: Path,
               vendor_opt_ins: bool = False) -> Iterator[tuple[dict[str, str], str]]:  # fmt: skip
    """(environment, device name) for one configuration; cleans up afterwards.
    Vendor opt-ins are cleared unless ``vendor_opt_ins``."""
    env = {k: v for k, v in os.environ.items()
           if vendor_opt_ins or not k.startswith(VENDOR_OPT_INS)}  # fmt: skip
    for key in ("SOFTVERBS_SERVICE", "SOFTVERBS_FAULTS", "SOFTVERBS_PCAP"):
        env.pop(key, None)
    links = work / "links.json"
    env["SOFTVERBS_CONFIG"] = str(links)
    # embedded and udp are each process's own devices: without this the suite
    # would open the host device, through whatever softverbsd answers on the
    # user's default socket
    env["SOFTVERBS_SERVICE"] = "0"
    if config == "embedded":
        env["SOFTVERBS_INPROC_DEVICES"] = "sv0"
        yield env, "sv0"
        return
    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}; choose from {', '.join(CONFIGS)}")
    check_port_free()
    links.write_text(json.dumps({"links": [{"name": "svlo", "netdev": "lo"}]}))
    env["SOFTVERBS_INPROC_DEVICES"] = ""
    if config == "udp":
        yield env, "svlo"
        return
    sock = work / "softverbsd.sock"
    env["SOFTVERBS_SERVICE"] = str(sock)
    start = [sys.executable, "-m", "softverbs", "service", "start", "--socket", str(sock)]
    subprocess.run(start, env=env, check=True, capture_output=True, timeout=60)
    try:
        yield env, "svlo"
    finally:
        stop = [sys.executable, "-m", "softverbs", "service", "stop", "--socket", str(sock)]
        subprocess.run(stop, env=env, check=False, capture_output=True, timeout=60)


class Progress:
    """Per-file progress and running counts, on stderr, as the suite runs."""

    def __init__(self, files: int, quiet: bool = False) -> None:
        self.files = files
        self.quiet = quiet
        self.done_files = 0
        self.file = ""
        self.file_counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        self.total: dict[str, int] = dict.fromkeys(STATUSES, 0)
        self.start = time.monotonic()

    def add(self, r: TestResult) -> None:
        if r.file != self.file:
            self.flush()
            self.file = r.file
        self.file_counts[r.status] += 1
        self.total[r.status] += 1

    def flush(self) -> None:
        """Report the file just finished."""
        if not self.file:
            return
        self.done_files += 1
        if not self.quiet:
            counts = " ".join(f"{self.file_counts[k]}{k[0].upper()}" for k in STATUSES)
            print(f"[{self.done_files:>2}/{self.files}] {self.file:<26}{counts:<22} "
                  f"total: {counts_line(self.total)} ({time.monotonic() - self.start:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.file = ""
        self.file_counts = dict.fromkeys(STATUSES, 0)


def run_suite(root: Path, config: str, version: str, timeout: float,
              tests: Sequence[str] = (), log: Path | None = None,
              quiet: bool = True, vendor_opt_ins: bool = False,
              pyverbs: str = "softverbs", python: str = SYSTEM_PYTHON) -> Summary:  # fmt: skip
    """Run the unpacked suite under ``root`` on ``config``; parse and summarize.
    Unless ``quiet``, report each test file's counts on stderr as it finishes.
    ``pyverbs="system"`` runs it with ``python`` and the pyverbs installed there."""
    if pyverbs not in PYVERBS:
        raise ValueError(f"unknown pyverbs {pyverbs!r}; choose from {', '.join(PYVERBS)}")
    if pyverbs == "system" and config != "service":
        raise RuntimeError("the system pyverbs reaches softverbs through its C libraries, "
                           "which need softverbsd: use --config service")  # fmt: skip
    system = pyverbs == "system"
    parser = OutputParser()
    progress = Progress(len(list((root / "tests").glob("test_*.py"))), quiet)
    with (
        tempfile.TemporaryDirectory(prefix="softverbs-conformance-") as tmp,
        configured(config, Path(tmp), vendor_opt_ins) as (env, dev),
    ):
        cmd = [sys.executable, "-m", "softverbs", "exec",
               *(["--system-pyverbs"] if system else []), "--",
               python if system else sys.executable,
               str(root / "tests" / "run_tests.py"), "-v", "--dev", dev, *tests]  # fmt: skip
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace")  # fmt: skip
        # the watchdog ends a run that outlives its timeout; what it printed still counts
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                for r in parser.feed(line.rstrip("\n")):
                    progress.add(r)
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        seconds = time.monotonic() - start
    results = parser.finish()
    progress.flush()
    text = "\n".join(parser.lines) + "\n"
    if log is not None:
        log.write_text(text)
    ran = re.search(r"^Ran (\d+) tests? in", text, re.M)
    return summarize(results, config, version, seconds, int(ran.group(1)) if ran else -1)


# --- the command ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", choices=CONFIGS, default="embedded",
                        help="the device configuration to run on (default: embedded)")  # fmt: skip
    parser.add_argument("--cache", metavar="DIR",
                        help="where the suite is downloaded and unpacked (default: "
                             "$SOFTVERBS_CACHE or ~/.cache/softverbs/conformance)")  # fmt: skip
    parser.add_argument("--pyverbs-version", default=DEFAULT_VERSION, dest="suite_version",
                        help=f"the pyverbs/rdma-core release (default: {DEFAULT_VERSION})")
    parser.add_argument("--suite", choices=SUITES, default="pypi",
                        help="the suite: PyPI's pyverbs sdist (--pyverbs-version), or the one "
                             "Debian's python3-pyverbs ships (default: pypi)")  # fmt: skip
    parser.add_argument("--pyverbs", choices=PYVERBS, default="softverbs",
                        help="the pyverbs the suite imports: softverbs' own, or the machine's "
                             "(rdma-core's Cython one) over softverbs' C libraries, which "
                             "needs --config service (default: softverbs)")  # fmt: skip
    parser.add_argument("--python", default=SYSTEM_PYTHON,
                        help=f"the interpreter of --pyverbs system (default: {SYSTEM_PYTHON})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="stop the run after this many seconds")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--log", metavar="FILE", help="write the suite's raw output to FILE")
    parser.add_argument("--floor", type=int,
                        help="exit 1 when fewer generic tests than this passed")  # fmt: skip
    parser.add_argument("--generic-only", action="store_true",
                        help="leave vendor (mlx5, EFA) and GPU test files out of the table")
    parser.add_argument("--vendor-opt-ins", action="store_true",
                        help="keep SOFTVERBS_MLX5 and other vendor opt-ins from the environment "
                             "(they are cleared by default, for the generic count)")  # fmt: skip
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no per-file progress on stderr while the suite runs")  # fmt: skip
    parser.add_argument("tests", nargs="*",
                        help="run only these tests (unittest names, e.g. tests.test_cq)")


def run(args: argparse.Namespace) -> int:
    from softverbs.cli.main import UserError

    cache = cache_dir(args.cache)
    version = args.suite_version
    try:
        if args.suite == "debian":
            root, version = unpack_debian_suite(cache)
        else:
            sdist = fetch_sdist(cache, version)
            root = unpack_suite(sdist, cache, version)
    except (RuntimeError, OSError, tarfile.TarError) as exc:
        raise UserError(str(exc)) from None
    print(f"rdma-core {version} tests ({root / 'tests'}) with {args.pyverbs} pyverbs on the "
          f"{args.config} configuration ...", flush=True)  # fmt: skip
    cleared = sorted(k for k in os.environ if k.startswith(VENDOR_OPT_INS))
    if cleared and not args.vendor_opt_ins:
        print(f"softverbs conformance: {', '.join(cleared)} cleared for the generic count "
              "(--vendor-opt-ins keeps them)", file=sys.stderr)  # fmt: skip
    try:
        s = run_suite(root, args.config, version, args.timeout, args.tests,
                      Path(args.log) if args.log else None, quiet=args.quiet,
                      vendor_opt_ins=args.vendor_opt_ins, pyverbs=args.pyverbs,
                      python=args.python)  # fmt: skip
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    print(format_table(s, include_vendor=not args.generic_only))
    ran = "did not finish" if s.ran < 0 else f"unittest ran {s.ran}"
    print(f"\ngeneric: {counts_line(s.generic)}; total: {counts_line(s.total)} "
          f"({ran}) in {s.seconds:.0f} s")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(s), indent=1) + "\n")
    if args.floor is not None and s.generic["passed"] < args.floor:
        raise UserError(f"{s.generic['passed']} generic tests passed, below the floor of "
                        f"{args.floor}")  # fmt: skip
    return 0
