"""Interop tests: ``interop``-marked tests run only on demand.

They boot a qemu guest running Linux rxe (``../shared/peer``), which takes
root, qemu and a minute or more, so a plain ``pytest`` skips them and says
how to run them: ``pytest -m interop`` (or ``SOFTVERBS_INTEROP=1``; the
skip is tests/conftest.py's, for every on-demand marker).  The
other tests here (softverbs against itself on loopback) always run.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from rxe_kit import DEV, GUEST, OUT, PEER, RUN, Peer, _skip_unless_possible


@pytest.fixture(scope="session")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    _skip_unless_possible()
    if not (OUT / "vmlinuz").exists() or not (OUT / "initramfs.cpio.gz").exists():
        r = subprocess.run(["bash", str(PEER / "build.sh")], capture_output=True, text=True,
                           timeout=1200, check=False)  # fmt: skip
        assert r.returncode == 0, f"build.sh failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    cfg = tmp_path_factory.mktemp("peer") / "links.json"
    cfg.write_text(json.dumps({"links": [{"name": DEV, "netdev": "br-peer"}]}))
    env = {**os.environ, "SOFTVERBS_CONFIG": str(cfg), "PYTHONUNBUFFERED": "1"}
    for var in ("SOFTVERBS_FAULTS", "SOFTVERBS_PCAP"):
        env.pop(var, None)
    p = Peer(PEER / "boot.sh", env)
    try:
        p.start()
        yield p
    finally:
        if (RUN / f"{GUEST}.pid").exists():
            p.keep_console("end")
        p.sh("down")


@pytest.fixture
def clean(peer: Peer) -> Iterator[Peer]:
    """The guest with no ping-pong left over; after the test, a guest that still answers
    on its network, or this test errors with what the link looked like and the guest is
    booted again (the tests after it would otherwise all fail: docs/status.md)."""
    peer.clean_guest()
    yield peer
    silent = peer.silent()
    if silent:
        report = peer.recover("after this test")
        pytest.fail(f"the guest stopped answering on its network during this test "
                    f"({silent}):\n{report}", pytrace=False)  # fmt: skip
