"""tshark as the tests that decode softverbs' captures with it run it.

``TSHARK`` is the tool's path (None when it is not installed: those tests
skip, apt package ``tshark``).  :func:`payload_dissector_args` keeps tshark's
heuristic dissectors off RoCE payloads, so a payload is never read as some
other protocol and flagged malformed.
"""

from __future__ import annotations

import shutil
import subprocess

TSHARK = shutil.which("tshark")


def payload_dissector_args() -> list[str]:
    """``--disable-protocol`` for each heuristic on InfiniBand payloads.

    ``-G heuristic-decodes`` lists the protocols, not the heuristics' short
    names that ``--disable-heuristic`` wants, so the protocols are disabled
    instead -- all but ``ethertype``, which Ethernet itself needs.
    """
    assert TSHARK is not None
    out = subprocess.run([TSHARK, "-G", "heuristic-decodes"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    args: list[str] = []
    for line in out.splitlines():
        cols = line.split("\t")
        if len(cols) >= 2 and cols[0] == "infiniband.payload" and cols[1] != "ethertype":
            args += ["--disable-protocol", cols[1]]
    return args
