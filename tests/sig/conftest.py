"""The signature tests run on both kinds of device: in this process, and the
host device served by softverbsd (a private one for the session)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import sig_kit
from sig_kit import open_ctx

from softverbs import testing
from softverbs.ext.mlx5dv import Mlx5Context


@pytest.fixture(params=["inproc", "host"])
def ctx(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mlx5Context]:
    """An mlx5dv context with signature offload on ``sv0`` of a
    :func:`softverbs.testing.world`; the kit's waits use that world."""
    kind = request.param
    socket = request.getfixturevalue("host_service") if kind == "host" else None
    monkeypatch.setenv("SOFTVERBS_SERVICE", socket or "0")
    with testing.world(kind, socket=socket) as w:
        sig_kit.current = w
        try:
            yield w.context(0, open_ctx)
        finally:
            sig_kit.current = None
