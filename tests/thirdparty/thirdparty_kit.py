"""Helpers of the third-party tests (tests/thirdparty/)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest


def need(program: str, package: str) -> str:
    """The path of ``program``; skip (fail under CI) when it is not installed."""
    path = shutil.which(program)
    if path is None:
        msg = f"{program} is not installed (Debian {package}; scripts/apt-packages.txt)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def exec_cmd(*argv: str) -> list[str]:
    """``argv`` run through ``softverbs exec``."""
    return [sys.executable, "-m", "softverbs", "exec", "--", *argv]
