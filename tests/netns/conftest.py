"""Fixtures of the multi-host tests (the machinery is in :mod:`netns_kit`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from netns_kit import NS_PREFIX, Topology, build_topology, ip, remove_stale_namespaces

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here is ``netns`` (``slow`` ones run only when selected:
    tests/conftest.py)."""
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.netns)


@pytest.fixture(scope="session")
def netns_available() -> None:
    """Skip (with the reason) unless we may create namespaces; clean old leftovers."""
    if os.geteuid() != 0:
        pytest.skip("multi-host tests need root to create network namespaces (CI runs as root)")
    if shutil.which("ip") is None:
        pytest.skip("multi-host tests need iproute2's 'ip' command")
    remove_stale_namespaces()
    probe = f"{NS_PREFIX}{os.getpid()}x0h0"
    r = ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        pytest.skip(f"'ip netns add' does not work here: {r.stderr.strip()}")
    ip("netns", "del", probe, check=False)


@pytest.fixture
def make_topology(
    netns_available: None, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Topology]]:
    """``make_topology(hosts=2, mtu=9000, dad=False)``: a fresh network for this test."""
    made: list[Topology] = []

    def cleanup() -> None:
        for t in made:
            t.close()

    request.addfinalizer(cleanup)  # before anything exists: partial setups are removed too

    def make(hosts: int = 2, mtu: int = 9000, dad: bool = False) -> Topology:
        topo = Topology(request.node.name, tmp_path)
        made.append(topo)
        build_topology(topo, hosts, mtu, dad)
        return topo

    yield make
