"""The device service: engines that outlive processes (softverbsd)."""

from __future__ import annotations

import sys

#: the module ``python -m`` runs to start the service (service/__main__.py;
#: the C library's spawn in native/csrc/conn.c names it too)
LAUNCH_MODULE = "softverbs.service"


def command(*args: str) -> list[str]:
    """The command line that starts ``softverbsd`` with *args*, in this interpreter."""
    return [sys.executable, "-m", LAUNCH_MODULE, *args]
