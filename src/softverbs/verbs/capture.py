"""An explicit pcap tap on one device: ``softverbs.capture(ctx, path)``.

``SOFTVERBS_PCAP`` captures everything a process's runtimes carry.  A
program that wants one device's traffic, for one part of its run, asks for
it::

    with softverbs.capture(ctx, "rc.pcap"):
        ...                       # the packets sent or received by ctx's device

    cap = softverbs.capture(ctx, "rc.pcap")
    ...
    cap.close()                   # stops the tap and closes the file

The tap records every packet whose source or destination GID is one of the
device's GIDs, as full Ethernet/IP/UDP/RoCEv2 frames with a valid ICRC (see
:mod:`softverbs.fabric.pcap`), at the point where the fabric takes it from a
device -- before the fault layer, so a packet the fault layer drops is still
in the file -- and, on the UDP fabric, also when it arrives.  In a
:class:`~softverbs.sim.Simulation` the timestamps are virtual seconds.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO

from softverbs.errors import eopnotsupp
from softverbs.fabric.pcap import PcapWriter
from softverbs.fabric.runtime import Runtime

if TYPE_CHECKING:
    from softverbs.verbs.device import Context

__all__ = ["Capture", "capture"]


class Capture:
    """A running tap on one device (see the module docstring)."""

    def __init__(self, ctx: Context, path: str | os.PathLike[str] | BinaryIO) -> None:
        runtime = ctx.runtime
        if ctx.hca is None or not isinstance(runtime, Runtime):
            raise eopnotsupp(
                f"capture: device {ctx.name} is served by softverbsd, not run in this "
                "process; set SOFTVERBS_PCAP for the service instead"
            )
        self.path = path if isinstance(path, (str, os.PathLike)) else None
        self.gids = frozenset(bytes(g) for g in ctx.hca.gids)
        self._runtime = runtime
        self._writer = PcapWriter(path)
        runtime.add_tap(self._writer, self.gids)
        self.closed = False

    def close(self) -> None:
        """Stop tapping and close the file (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._runtime.remove_tap(self._writer)
        self._writer.close()

    def __enter__(self) -> Capture:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def capture(ctx: Context, path: str | os.PathLike[str] | BinaryIO) -> Capture:
    """Write the packets of ``ctx``'s device to the pcap file ``path`` until ``close()``."""
    return Capture(ctx, path)
