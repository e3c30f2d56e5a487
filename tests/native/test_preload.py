"""libsoftverbs_preload.so, the device-node section: ``/dev/infiniband/softverbsN``
without root (csrc/preload.c; docs/c-programs.md, UCX).

``preload_check.c`` makes every path call the library interposes on the
node and on names that are not a node, and says "ok" or "FAIL" for each: with
the library the node is a readable, writable character device that opens,
and the other names are untouched; without it the node is absent (so the
checks can fail).  It runs with the library as built, under ``softverbs
exec``, and built with AddressSanitizer and UBSan.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_c_tools import TIMEOUT, exec_cmd

from softverbs import native

HERE = Path(__file__).parent
#: the nodes preload_check.c asks for (not softverbs0, which a root test may make)
NODES = [Path("/dev/infiniband/softverbs7"), Path("/dev/infiniband/softverbs12")]
#: 13 calls on each of the two nodes and the five other names (12 in the ASan
#: build, which leaves out __xstat)
CHECKS = {False: 13 * 7, True: 12 * 7}


@pytest.fixture(scope="module")
def cc() -> str:
    cc = native.compiler()
    if cc is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler: CI must build the C library")
        pytest.skip("no C compiler")
    for node in NODES:
        if node.exists():
            pytest.skip(f"{node} exists on this machine: the checks need it absent")
    return cc


def _build(cc: str, out: Path, sanitize: bool) -> Path:
    flags = native.SANITIZE if sanitize else []
    r = subprocess.run([cc, "-std=gnu11", "-g", "-Wall", "-Wextra", "-Werror", *flags,
                        str(HERE / "preload_check.c"), "-o", str(out)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


def _check(argv: list[str], env: dict[str, str], expect: str, asan: bool = False) -> None:
    r = subprocess.run([*argv, expect], env=env, capture_output=True, text=True,
                       timeout=TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("ok ") == CHECKS[asan], r.stdout + r.stderr
    assert not r.stderr, r.stderr


def test_the_node_is_there_with_the_library_only(cc: str, tmp_path: Path) -> None:
    prog = _build(cc, tmp_path / "preload_check", sanitize=False)
    lib = native.library_dir() / native.PRELOAD
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    _check([str(prog)], env, "absent")
    _check([str(prog)], dict(env, LD_PRELOAD=str(lib)), "present")


def test_softverbs_exec_preloads_it(cc: str, tmp_path: Path, host_service: str) -> None:
    prog = _build(cc, tmp_path / "preload_check", sanitize=False)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    _check(exec_cmd(str(prog)), dict(env, SOFTVERBS_SERVICE=host_service), "present")


def test_under_address_sanitizer(cc: str, tmp_path: Path) -> None:
    """The library built with ASan and UBSan, preloaded after the runtimes, into
    a program built with them too."""
    libdir = native.build(tmp_path / "asan", sanitize=True, werror=True)
    prog = _build(cc, tmp_path / "preload_check", sanitize=True)
    runtimes = [subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True,
                               check=True).stdout.strip()
                for lib in ("libasan.so", "libubsan.so")]  # fmt: skip
    if not all(os.path.isabs(r) for r in runtimes):
        pytest.skip(f"{cc} has no ASan/UBSan runtime to preload")
    env = dict(os.environ, LD_PRELOAD=" ".join([*runtimes, str(libdir / native.PRELOAD)]),
               ASAN_OPTIONS="detect_leaks=1:exitcode=23",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")  # fmt: skip
    _check([str(prog)], env, "present", asan=True)


def test_exec_lets_an_asan_program_run(cc: str, tmp_path: Path, host_service: str) -> None:
    """A program linked with ASan runs under ``softverbs exec`` although the
    preload library comes before the runtime."""
    prog = _build(cc, tmp_path / "preload_check", sanitize=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    _check(exec_cmd(str(prog)), dict(env, SOFTVERBS_SERVICE=host_service), "present", asan=True)
