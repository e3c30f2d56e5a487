"""Third-party programs on softverbs: each one unmodified, from Debian
(scripts/apt-packages.txt), run through ``softverbs exec`` on a private
softverbsd (the session's ``host_service``, tests/conftest.py) and judged by
its own verdict (helpers: thirdparty_kit.py).  A missing program skips the test with the package to
install; under CI (``$CI`` set) it fails, since CI installs them."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def service_env(host_service: str) -> dict[str, str]:
    """The environment of a program on the session's private softverbsd."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env["SOFTVERBS_SERVICE"] = host_service
    return env
