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

On a served device (the host device ``softverbsd`` runs) the service writes
the file, handed to it open, so the capture holds the packets of every
process on that device; a file object must then have a descriptor.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import BinaryIO

from softverbs.device import ops, records
from softverbs.verbs.device import Context
from softverbs.verbs.provider import Attach, destroy

__all__ = ["Capture", "capture"]


class Capture:
    """A running tap on one device (see the module docstring).

    The device writes the file -- in this process, or in ``softverbsd`` for
    a served device, which is handed the open file -- so the same call
    works on both, and a served device's capture sees the packets of every
    process on it."""

    def __init__(self, ctx: Context, path: str | os.PathLike[str] | BinaryIO) -> None:
        self.path = path if isinstance(path, (str, os.PathLike)) else None
        self._owned = self.path is not None
        self._file: BinaryIO
        if isinstance(path, (str, os.PathLike)):
            self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        else:
            self._file = path
        self._ctx = ctx
        self._provider = ctx.provider
        try:
            req = records.CaptureReq(ctx.handle, 0)
            self.handle = self._provider.call(ops.CAPTURE, req, Attach(file=self._file)).handle
        except BaseException:
            if self._owned:
                self._file.close()
            raise
        self.closed = False

    def close(self) -> None:
        """Stop tapping and close the file (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            if not self._ctx.closed:  # closing the context ended the capture already
                destroy(self._provider, records.KIND_CAPTURE, self.handle)
        finally:
            if self._owned:
                self._file.close()
            else:
                self._file.flush()

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
