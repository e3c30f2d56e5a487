"""``softverbs service``: start, stop and inspect the device service.

::

    softverbs service start [--socket PATH] [--foreground] [-v]
    softverbs service status [--socket PATH] [-j]
    softverbs service stop [--socket PATH] [--timeout SECONDS]

The service (``softverbsd``, :mod:`softverbs.service.server`) owns the
devices that several processes share -- XRC domains and receive QPs that
outlive the process that made them.  Applications use it when
``SOFTVERBS_SERVICE`` is set (to its socket path, or to ``1`` for the
default path); they start it on demand if it is not running.

``start`` daemonizes: the service runs in a new session with its output in
``<socket>.log``, and ``start`` returns once the service answers on its
socket.  The service writes ``<socket>.pid`` and keeps it locked while it
lives, so a second ``start`` on the same socket refuses, naming the running
service.  ``--foreground`` serves in this process until SIGTERM or Ctrl-C.

``stop`` sends SIGTERM and waits for the service to exit; the service
disconnects its clients (releasing what they held, as if they had exited),
and removes its socket and pidfile.  A service that does not exit within
``--timeout`` is killed, and ``stop`` removes what it left behind.

``status`` prints the service's clients and live objects, from the service's
own counters; it never starts the service.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from softverbs import config
from softverbs.config import service_command
from softverbs.device import protocol

START_TIMEOUT = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = sub.add_parser("start", help="start softverbsd in the background")
    stop = sub.add_parser("stop", help="stop softverbsd")
    status = sub.add_parser("status", help="show softverbsd's clients and live objects")
    for p in (start, stop, status):
        p.add_argument("--socket", metavar="PATH", help=config.SOCKET_HELP)
    start.add_argument("--foreground", action="store_true",
                       help="serve in this process instead of daemonizing")  # fmt: skip
    start.add_argument("-v", "--verbose", action="store_true", help="log every request")
    stop.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                      help="how long to wait before killing it (default 10)")  # fmt: skip
    status.add_argument("-j", "--json", action="store_true", help="JSON output")


def run(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.socket or protocol.default_socket_path())
    if args.action == "start":
        config.ensure_socket_dir(path, "--socket" if args.socket else "SOFTVERBS_SERVICE")
        return _start(path, args.foreground, args.verbose)
    if args.action == "stop":
        return _stop(path, args.timeout)
    return _status(path, args.json)


def _say(msg: str) -> None:
    print(f"softverbs service: {msg}", file=sys.stderr)


# --- finding the service ---------------------------------------------------------------


def _pidfile(path: str) -> str:
    return path + ".pid"


def _locked_pid(path: str) -> int | None:
    """The pid of the service holding the pidfile lock, or None if no one does."""
    from softverbs.service.server import read_pid

    try:
        fd = os.open(_pidfile(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_pid(_pidfile(path)) or -1
    finally:
        os.close(fd)
    return None


def _service_pid(path: str) -> int | None:
    """The pid of the service on ``path``: the pidfile lock's holder (-1 when its
    pid cannot be read), else the pid a service answering there reports, else
    None.  Raises :class:`ServiceError` for a socket that answers wrongly."""
    pid = _locked_pid(path)
    if pid is None:
        stats = fetch_status(path)
        pid = int(stats["pid"]) if stats else None
    return pid


class ServiceError(Exception):
    """A service listens on the socket but the exchange failed (it refused
    this user, or answered with an error): the message says what happened."""


def fetch_status(path: str) -> dict[str, Any] | None:
    """The service's STATUS -- its clients, their objects, its counters -- if it
    answers on ``path``; None if nothing listens there (no socket, or a socket
    nobody accepts on); never starts it.  ServiceError for anything else: a
    running service is never reported as not running.  `softverbs res` and
    `softverbs stat qp` read the same."""
    from softverbs.errors import PyverbsRDMAError
    from softverbs.verbs.served import Connection

    try:
        conn = Connection(path, spawn=False)
    except PyverbsRDMAError as exc:
        if exc.error_code == errno.ECONNREFUSED:
            return None
        raise ServiceError(f"softverbsd on {path}: {_reason(exc)}") from None
    try:
        from softverbs.device import ops, records

        _, tail = conn.call(ops.STATUS, records.Empty())
        stats: dict[str, Any] = json.loads(tail)
        stats.setdefault("pid", conn.service_pid)
        return stats
    except PyverbsRDMAError as exc:
        raise ServiceError(f"softverbsd on {path} (pid {conn.service_pid}) did not give its "
                           f"status: {_reason(exc)}") from None  # fmt: skip
    except ValueError as exc:
        raise ServiceError(f"softverbsd on {path} sent a status that is not JSON: {exc}") from None
    finally:
        conn.close()


def _reason(exc: Exception) -> str:
    """An error's message with its errno name (pyverbs' '. Errno: N, text' dropped)."""
    code = getattr(exc, "error_code", 0)
    text = str(exc).split(". Errno:")[0]
    return f"{text} ({errno.errorcode.get(code, code)})" if code else text


def _alive(pid: int) -> bool:
    """Does ``pid`` run (a zombie does not)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _is_softverbsd(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"softverbs" in f.read()
    except OSError:
        return True  # no /proc: trust the pidfile


def _remove_leftovers(path: str) -> None:
    if _locked_pid(path) is not None:
        return  # a live service owns them
    for leftover in (path, _pidfile(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)


# --- start ---------------------------------------------------------------------------------


def _start(path: str, foreground: bool, verbose: bool) -> int:
    try:
        pid = _service_pid(path)
    except ServiceError as exc:
        _say(f"a service already answers on {path}: {exc}")
        return 1
    if pid is not None:
        _say(f"softverbsd is already running on {path} (pid {pid}); "
             "stop it first with 'softverbs service stop'")  # fmt: skip
        return 1
    argv = ["--socket", path] + (["-v"] if verbose else [])
    if foreground:
        from softverbs.service.server import main

        return main(argv)
    log_path = path + ".log"
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            service_command(*argv),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        rc = child.poll()
        if rc is not None:
            _say(f"softverbsd exited with status {rc}: {_last_line(log_path)}")
            return 1
        try:
            stats = fetch_status(path) if os.path.exists(path) else None
        except ServiceError as exc:
            _say(f"softverbsd (pid {child.pid}) started but {exc}")
            return 1
        if stats is not None:
            print(f"softverbsd started on {path} (pid {stats['pid']}), log in {log_path}")
            return 0
        time.sleep(0.05)
    _say(f"softverbsd (pid {child.pid}) did not answer on {path} within {START_TIMEOUT:g} s; "
         f"see {log_path}")  # fmt: skip
    return 1


def _last_line(log_path: str) -> str:
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


# --- stop ------------------------------------------------------------------------------------


def _stop(path: str, timeout: float) -> int:
    try:
        pid = _service_pid(path)
    except ServiceError as exc:
        _say(f"cannot stop it: {exc}")
        return 1
    if pid is None or pid < 0:
        stale = os.path.exists(path) or os.path.exists(_pidfile(path))
        _remove_leftovers(path)
        _say(f"softverbsd is not running on {path}"
             + (" (removed a stale socket/pidfile)" if stale else ""))  # fmt: skip
        return 1
    if not _is_softverbsd(pid):
        _say(f"pid {pid} in {_pidfile(path)} is not softverbsd; not signalling it")
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        _say(f"cannot signal softverbsd (pid {pid}): {os.strerror(exc.errno or errno.EPERM)}")
        return 1
    if _wait_gone(pid, path, timeout):
        _remove_leftovers(path)
        print(f"softverbsd (pid {pid}) stopped")
        return 0
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, path, 5.0)
    _remove_leftovers(path)
    _say(f"softverbsd (pid {pid}) did not stop within {timeout:g} s; killed it")
    return 1


def _wait_gone(pid: int, path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid) and _locked_pid(path) is None:
            return True
        time.sleep(0.02)
    return False


# --- status ------------------------------------------------------------------------------------


def _status(path: str, as_json: bool) -> int:
    try:
        stats = fetch_status(path)
    except ServiceError as exc:
        _say(str(exc))
        return 1
    if stats is None:
        _say(f"softverbsd is not running on {path}")
        return 1
    stats.pop("id", None)
    stats["socket"] = path
    if as_json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    print(f"softverbsd: running on {path} (pid {stats['pid']})")
    print(f"mode: {stats.get('mode', 'unknown')}")
    print(f"devices: {', '.join(stats.get('devices', [])) or 'none open'}")
    print(f"clients: {stats['clients']}")
    for proc in stats.get("processes", []):
        print(f"  pid {proc['pid']}: {_kinds(proc['objects'])}{_copies(proc.get('copies'))}")
    print(f"live objects: {_kinds(stats['objects'])}")
    holders = stats.get("xrc_holders", {})
    xrc = ", ".join(f"{qpn} ({n} holder{'s' if n != 1 else ''})" for qpn, n in holders.items())
    print(f"engine QPs: {stats['engine_qps']}, memory keys: {stats['keys']}, "
          f"XRC SRQs: {stats.get('xrc_srqs', 0)}, XRC domains: {stats.get('xrcds', 0)}")
    print(f"XRC receive QPs: {stats['xrc_qps']}" + (f": {xrc}" if xrc else ""))
    counts = stats.get("stats", {})
    if counts:
        print("service counters: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


def _copies(copies: dict[str, Any] | None) -> str:
    """How the service copies a client's memory (``ProcessMemory.copies``), or nothing."""
    if not copies:
        return ""
    if copies["path"] == "process_vm":
        way = f"process_vm_readv/writev ({copies['process_vm_copies']} large copies)"
    else:
        way = f"/proc/PID/mem only ({copies['why']})"
    return f"; memory copies: {way}, {copies['faults']} faulted"


def _kinds(objects: dict[str, int]) -> str:
    if not objects:
        return "none"
    total = sum(objects.values())
    return f"{total} (" + ", ".join(f"{k} {v}" for k, v in sorted(objects.items())) + ")"
