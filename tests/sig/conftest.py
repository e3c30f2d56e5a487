"""The signature tests run on both kinds of device: in this process, and the
host device served by softverbsd (a private one for the session)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sig_kit import open_ctx

from softverbs.ext.mlx5dv import Mlx5Context


@pytest.fixture(params=["inproc", "host"])
def ctx(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mlx5Context]:
    from softverbs.verbs import registry, world

    reg: registry.Registry | object
    if request.param == "host":
        from softverbs.verbs.served import ServiceRegistry

        path = request.getfixturevalue("host_service")
        monkeypatch.setenv("SOFTVERBS_SERVICE", path)
        reg = ServiceRegistry(path)
    else:
        reg = registry.Registry()
    world.push(reg)  # type: ignore[arg-type]
    try:
        c = open_ctx()
        yield c
        c.close()
    finally:
        world.pop(reg)  # type: ignore[arg-type]
        reg.shutdown()  # type: ignore[union-attr]
