"""Interop tests: ``interop``-marked tests run only on demand.

They boot a qemu guest running Linux rxe (``../shared/peer``), which takes
root, qemu and a minute or more, so a plain ``pytest`` skips them and says
how to run them: ``pytest -m interop`` (or ``SOFTVERBS_INTEROP=1``).  The
other tests here (softverbs against itself on loopback) always run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

HOW = ("interop: talks to Linux rxe in a qemu guest (../shared/peer); run on demand with "
       "'pytest -m interop' or SOFTVERBS_INTEROP=1")  # fmt: skip


def _selected(config: pytest.Config) -> bool:
    if os.environ.get("SOFTVERBS_INTEROP") == "1":
        return True
    markexpr = (config.getoption("markexpr", "") or "").replace(" ", "")
    return "interop" in markexpr and "notinterop" not in markexpr


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _selected(config):
        return
    skip = pytest.mark.skip(reason=HOW)
    for item in items:  # this directory's tests only (others decide for themselves)
        if item.get_closest_marker("interop") is not None and HERE in item.path.parents:
            item.add_marker(skip)
