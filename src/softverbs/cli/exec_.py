"""``softverbs exec [--] CMD [ARGS...]``: run a pyverbs program on softverbs.

How it works. softverbs ships rdma-core's ``pyverbs`` module tree as
``softverbs.compat.pyverbs``. The tree is thin aliases onto softverbs'
own objects (see :mod:`softverbs.compat`). Installing softverbs never
creates a top-level ``pyverbs``, so a real pyverbs installed on the same
machine keeps working. For a single child process, ``exec`` does three things:

1. It puts the directory that holds the compat package (``softverbs/compat``)
   first on ``PYTHONPATH``. Python puts ``PYTHONPATH`` entries ahead of
   site-packages, so in the child ``import pyverbs`` finds softverbs' tree
   even when a real pyverbs is installed. Only ``bin`` (scripts, not a
   package anyone imports) lives next to it, so no other top-level name
   changes.
2. It sets ``SOFTVERBS_EXEC=1``, so a program (or a test suite) can tell
   that it runs on softverbs.
3. It puts ``compat/bin`` first on ``PATH``.  That directory holds an
   ``rdma`` command answering ``rdma link show`` / ``rdma dev show`` for
   softverbs devices (:mod:`softverbs.cli.rdma`), which programs use to find
   a device's netdev.  The script runs this interpreter
   (``SOFTVERBS_PYTHON``).
4. It puts softverbs' C libraries first on ``LD_LIBRARY_PATH``: its
   ``libibverbs.so.1`` (a client of the host device) and the ``libmlx5`` and
   ``libefa`` stubs (:mod:`softverbs.native`), so an unmodified C program --
   ``ibv_rc_pingpong``, perftest -- runs on softverbs.  The libraries are
   built on first use if the install did not build them; with no C compiler a
   C program (an ELF executable) is refused with the reason, and a Python
   program runs as before.
5. It adds ``libsoftverbs_preload.so`` to ``LD_PRELOAD`` (after any entries
   already there).  For the C library's path calls (stat, access, open) it
   makes ``/dev/infiniband/softverbsN`` -- the node UCX requires before it
   lists a device -- the path ``/dev/null``, so UCX, and Open MPI and MPICH
   over it, run without root (docs/c-programs.md, UCX).  A program built with
   AddressSanitizer gets ``verify_asan_link_order=0`` added to
   ``ASAN_OPTIONS``: a preloaded library comes before the runtime it links.
6. It replaces itself with CMD (``os.execvpe``, which searches ``PATH``). No
   wrapper process stays behind, so signals go straight to CMD and CMD's
   exit status, or the signal that killed it, is what the caller sees.

The soft device needs no setup. In the child, ``get_device_list()`` shows
the host device ``sv0`` (softverbsd, started on first use).

``--system-pyverbs`` leaves step 1 out (and takes the compat directory off an
inherited ``PYTHONPATH``): the program imports the pyverbs installed on the
machine -- rdma-core's Cython one, Debian's ``python3-pyverbs`` -- which is a
C extension over ``libibverbs.so.1`` and so reaches softverbs through the C
libraries of step 4, as any C program does.

Limits. An interpreter started with ``-E`` or ``-I`` ignores
``PYTHONPATH``. A directory named ``pyverbs`` next to the script (or in the
current directory, for ``python -m``) comes before ``PYTHONPATH`` and wins.
The child's Python must be able to import softverbs, which holds when it is
the interpreter softverbs is installed in.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from collections.abc import Mapping

import softverbs.compat
from softverbs.native import PRELOAD
from softverbs.trace import ENV as TRACE_ENV

#: Set in the child's environment; "1" means "running under softverbs exec".
EXEC_ENV = "SOFTVERBS_EXEC"
#: The interpreter the compat scripts (``rdma``) run softverbs with.
PYTHON_ENV = "SOFTVERBS_PYTHON"

#: Shell conventions for a command that cannot run.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


def compat_dir() -> str:
    """The directory that contains softverbs' ``pyverbs`` package."""
    return os.path.dirname(os.path.abspath(softverbs.compat.__file__))


def bin_dir() -> str:
    """The directory of the commands ``exec`` puts first on PATH (``rdma``)."""
    path = os.path.join(compat_dir(), "bin")
    script = os.path.join(path, "rdma")
    # an install may have dropped the mode bits of package data
    if os.path.exists(script) and not os.access(script, os.X_OK):
        with contextlib.suppress(OSError):
            os.chmod(script, 0o755)
    return path


def _prepend(value: str, first: str) -> str:
    # A nested ``softverbs exec`` must not pile up copies of the entry.
    rest = [p for p in value.split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])


def _append(value: str, last: str) -> str:
    # LD_PRELOAD: the caller's entries first (a sanitizer runtime must stay first)
    rest = [p for p in value.replace(":", " ").split() if p != last]
    return " ".join([*rest, last])


def child_env(environ: Mapping[str, str], libdir: str | None = None,
              compat_pyverbs: bool = True) -> dict[str, str]:  # fmt: skip
    """``environ`` changed for the child: compat dir first on PYTHONPATH (or, without
    ``compat_pyverbs``, not on it at all), compat commands first on PATH, the C
    libraries (``libdir``) first on LD_LIBRARY_PATH and the preload library last on
    LD_PRELOAD, marker set."""
    env = dict(environ)
    if compat_pyverbs:
        env["PYTHONPATH"] = _prepend(env.get("PYTHONPATH", ""), compat_dir())
    else:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != compat_dir()]
        env["PYTHONPATH"] = os.pathsep.join(rest)
        if not rest:
            del env["PYTHONPATH"]
    env["PATH"] = _prepend(env.get("PATH", os.defpath), bin_dir())
    if libdir is not None:
        env["LD_LIBRARY_PATH"] = _prepend(env.get("LD_LIBRARY_PATH", ""), libdir)
        env["LD_PRELOAD"] = _append(env.get("LD_PRELOAD", ""), os.path.join(libdir, PRELOAD))
    env.setdefault(PYTHON_ENV, sys.executable)
    env[EXEC_ENV] = "1"
    return env


def is_native(command: str, path: str | None) -> bool:
    """Is ``command`` (found on ``path``) an ELF executable, a C program?"""
    found = shutil.which(command, path=path)
    if found is None:
        return False
    try:
        with open(found, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def links_asan(command: str, path: str | None) -> bool:
    """Does ``command`` (found on ``path``) name AddressSanitizer's runtime
    among its libraries?  Its dynamic string table, which holds the names of
    the libraries it needs, comes before the code: the first MiB holds it."""
    found = shutil.which(command, path=path)
    if found is None:
        return False
    try:
        with open(found, "rb") as f:
            head = f.read(1 << 20)
    except OSError:
        return False
    return head[:4] == b"\x7fELF" and b"libasan.so" in head


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("%(prog)s [-h] [--trace FILE] [--sanitize[=OPTIONS]] [--system-pyverbs] "
                    "[--] CMD [ARGS...]")  # fmt: skip
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="record what CMD's QPs do to FILE (sets SOFTVERBS_TRACE=FILE for CMD; "
        "render it with 'softverbs trace FILE')",
    )
    parser.add_argument(
        "--sanitize",
        metavar="OPTIONS",
        nargs="?",
        const="1",
        help="turn on the verbs sanitizer for CMD: sets SOFTVERBS_SANITIZE=OPTIONS "
        "(default 1; e.g. json, 1:halt_on_error=1; see docs/sanitizer.md)",
    )
    parser.add_argument(
        "--system-pyverbs",
        action="store_true",
        help="let CMD import the pyverbs installed on the machine (rdma-core's, e.g. "
        "Debian's python3-pyverbs), which then runs on softverbs' C libraries, instead "
        "of softverbs' own pyverbs",
    )
    parser.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="CMD [ARGS...]",
        help="the program to run, e.g. python3 -m pytest tests/ (put -- before it "
        "if it starts with '-')",
    )


def run(args: argparse.Namespace) -> int:
    argv: list[str] = list(args.argv)
    # argparse keeps the "--" separator in a REMAINDER list; it is ours, not CMD's
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("softverbs exec: no command given; usage: softverbs exec [--] CMD [ARGS...]",
              file=sys.stderr)  # fmt: skip
        return 2
    from softverbs import native, sanitizer

    if args.sanitize is not None:
        try:
            sanitizer.parse(args.sanitize)
        except sanitizer.SanitizeError as exc:
            print(f"softverbs exec: --sanitize: {exc}", file=sys.stderr)
            return 2

    try:
        libdir: str | None = str(native.library_dir())
    except native.BuildError as exc:
        libdir = None
        if is_native(argv[0], os.environ.get("PATH")):
            print(f"softverbs exec: {argv[0]} is a C program, and {exc}", file=sys.stderr)
            return 1
    env = child_env(os.environ, libdir, compat_pyverbs=not args.system_pyverbs)
    if libdir is not None and links_asan(argv[0], env.get("PATH")):
        # ASan insists on coming first among the loaded libraries; the preload
        # library only forwards calls, so the order is harmless here
        opts = env.get("ASAN_OPTIONS", "")
        env["ASAN_OPTIONS"] = f"{opts}:verify_asan_link_order=0" if opts else \
            "verify_asan_link_order=0"  # fmt: skip
    if args.trace:
        env[TRACE_ENV] = os.path.abspath(args.trace)  # CMD may change directory
    if args.sanitize is not None:
        env[sanitizer.ENV] = args.sanitize
    # exec discards this process's buffers: flush what has been printed so far
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        print(f"softverbs exec: {argv[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as exc:  # found but not runnable: a directory, no x bit, bad format
        print(f"softverbs exec: {argv[0]}: cannot run: {exc.strerror}", file=sys.stderr)
        return EXIT_NOT_EXECUTABLE
