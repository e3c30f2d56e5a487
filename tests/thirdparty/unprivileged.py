"""Run softverbs and a third-party program as a user who is not root.

The users a soft device is for run in CI jobs and containers without root,
so the programs that checked for root-made state (UCX's device node) are
tested as such a user.  When the tests run as root, :func:`unprivileged`
drops to ``nobody`` (uid/gid 65534) with ``setpriv --reuid --regid
--clear-groups``; otherwise they already run as one and nothing changes.

Everything the user touches lives in one private directory that it owns:
its ``HOME``, its softverbsd (``SOFTVERBS_SERVICE`` -- started by the user's
first ``softverbs exec``, so the service runs unprivileged too, and stopped
at the end), and ``XDG_CACHE_HOME`` with a copy of the C libraries built for
this checkout.  The interpreter is this one if the user may run it; a
virtualenv under ``/root`` is not reachable, so then it is a system
``python3`` of the same version given this checkout's source and this
environment's site-packages on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import softverbs
from softverbs import native

NOBODY = 65534


@dataclass
class User:
    """How to run a command as the unprivileged user."""

    prefix: list[str]  #: the setpriv command line, or nothing
    python: str  #: an interpreter the user can run softverbs with
    env: dict[str, str]
    home: Path  #: the user's private directory (readable by all, owned by the user)

    def exec_cmd(self, *argv: str) -> list[str]:
        """``softverbs exec -- argv`` as the user."""
        return [*self.prefix, self.python, "-m", "softverbs", "exec", "--", *argv]

    def run(self, argv: list[str], env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run ``argv`` (already prefixed) to the end; on a timeout kill its
        whole process group (an MPI launcher and its ranks) and fail."""
        proc = subprocess.Popen(argv, env=env or self.env, cwd=self.home, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"{' '.join(argv)} did not finish in {timeout} s:\n{out}")
        return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def _src_dir() -> str:
    return str(Path(softverbs.__file__).resolve().parent.parent)


@contextmanager
def unprivileged() -> Iterator[User]:
    """A :class:`User` for the duration of the block (see the module docstring)."""
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run as a user who is not root")
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if root \
        else []  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix="svuser", dir="/tmp"))  # a short socket path
    try:
        home.chmod(0o755)
        cache = home / "cache"
        libs = cache / "softverbs" / "native" / native.sources_hash()
        shutil.copytree(native.library_dir(), libs)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SOFTVERBS_", "UCX_", "LD_", "OMPI_", "PMIX_", "HYDRA_"))}
        env.update(HOME=str(home), XDG_CACHE_HOME=str(cache), TMPDIR="/tmp",
                   SOFTVERBS_SERVICE=str(home / "sv.sock"))  # fmt: skip
        if root:
            for path in [home, *home.rglob("*")]:
                os.chown(path, NOBODY, NOBODY)
        python = _interpreter(prefix, env)
        if python != sys.executable:
            paths = [_src_dir(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        user = User(prefix, python, env, home)
        try:
            yield user
        finally:
            subprocess.run([*prefix, python, "-m", "softverbs", "service", "stop"], env=env,
                           capture_output=True, timeout=60, check=False)  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _interpreter(prefix: list[str], env: dict[str, str]) -> str:
    """This interpreter if the user can import softverbs with it, else a
    system one of the same version given this checkout on PYTHONPATH."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    extra = os.pathsep.join(dict.fromkeys([_src_dir(), sysconfig.get_paths()["purelib"],
                                           sysconfig.get_paths()["platlib"]]))  # fmt: skip
    tried = []
    for python, pythonpath in ((sys.executable, None), (f"/usr/bin/{version}", extra),
                               (f"/usr/local/bin/{version}", extra)):  # fmt: skip
        if not os.path.exists(python):
            continue
        e = dict(env, PYTHONPATH=pythonpath) if pythonpath else env
        # through a shell: a process of the user's must be able to run it (a
        # path under /root can pass when setpriv itself executes it)
        probe = 'exec "$0" -c "import softverbs.service.server"'
        r = subprocess.run([*prefix, "/bin/sh", "-c", probe, python], env=e, text=True,
                           capture_output=True, timeout=60, check=False)  # fmt: skip
        if r.returncode == 0:
            return python
        tried.append(f"{python}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    pytest.skip("no Python interpreter the unprivileged user can run softverbs with "
                f"({'; '.join(tried)}); install softverbs where uid {NOBODY} can read it")
