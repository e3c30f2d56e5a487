"""Test-wide settings.

softverbs' devices are, by default, the host's: served by softverbsd, started
on demand on the user's socket.  The test suite must never touch a service
the user runs, nor leave one behind, so every test process -- and every
program it starts -- gets devices of its own (``SOFTVERBS_SERVICE=0``) unless
a test asks for a private service of its own (the host-device tests do).

The folders mirror ``src/softverbs`` (``tests/engine`` tests ``softverbs.engine``,
``tests/test_sim.py`` tests ``softverbs/sim.py``), beside the folders of tests
that cross the layers: scenarios, conformance, interop, thirdparty, netns,
native (the C libraries), sig, sanitizer and fuzz.  Helpers that tests in
several folders share live in ``tests/kits``, which is on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["SOFTVERBS_SERVICE"] = "0"

#: The markers whose tests run only on demand, with what a plain run prints for each
#: skipped test.  ``pytest -m slow`` (or ``SOFTVERBS_SLOW=1``) selects one; a test may
#: say why it is slow with ``@pytest.mark.slow(reason=...)``.
ON_DEMAND = {
    "slow": "slow: select it with -m slow",
    "interop": ("interop: talks to Linux rxe in a qemu guest (../shared/peer); run on demand "
                "with 'pytest -m interop' or SOFTVERBS_INTEROP=1"),
}


def selected(config: pytest.Config, marker: str) -> bool:
    """Whether this run asked for the on-demand ``marker`` (its name in ``-m``, not
    negated, or ``SOFTVERBS_<MARKER>=1``)."""
    if os.environ.get(f"SOFTVERBS_{marker.upper()}") == "1":
        return True
    expr = (config.getoption("markexpr", "") or "").replace(" ", "")
    return marker in expr and f"not{marker}" not in expr


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip each on-demand test the run did not select, saying how to select it."""
    for marker, how in ON_DEMAND.items():
        if selected(config, marker):
            continue
        for item in items:
            mark = item.get_closest_marker(marker)
            if mark is not None:
                why = mark.kwargs.get("reason")
                reason = f"{marker} ({why}): select it with -m {marker}" if why else how
                item.add_marker(pytest.mark.skip(reason=reason))

#: the helpers that tests in several folders share (sim_kit, engine_kit, svkit, ...)
KITS = Path(__file__).resolve().parent / "kits"
sys.path.insert(0, str(KITS))


@pytest.fixture(scope="session")
def host_service() -> Iterator[str]:
    """A private softverbsd for the session (its socket path): the host device
    the tests that run on every kind of device use as the 'host' kind."""
    import shutil
    import subprocess
    import tempfile
    import time

    from softverbs.config import service_command

    d = tempfile.mkdtemp(prefix="svsc", dir="/tmp")  # a Unix socket path is short
    path = os.path.join(d, "sv.sock")
    env = {k: v for k, v in os.environ.items() if k != "SOFTVERBS_SERVICE"}
    proc = subprocess.Popen(service_command("--socket", path),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    end = time.monotonic() + 20
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > end:
            err = proc.stderr.read() if proc.stderr else b""
            raise RuntimeError(f"softverbsd did not start: {err!r}")
        time.sleep(0.02)
    yield path
    proc.terminate()
    proc.wait(20)
    shutil.rmtree(d, ignore_errors=True)
