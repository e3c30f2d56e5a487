"""dma-buf memory (pyverbs ``dmabuf.DmaBuf`` and ``mr.DmaBufMR``).

A dma-buf is a buffer exported by another device driver -- in rdma-core's
tests, a GPU's memory allocated through ``/dev/dri/renderD*`` -- that an RDMA
device registers and then reaches by DMA, without the CPU.  softverbs has no
DMA engine: it reaches memory only through the process's own mappings, and
allocating GPU memory is outside what it does.  So both fail as pyverbs does
when built without DRM support: ``DmaBuf`` with EOPNOTSUPP ("Failed to
allocate dmabuf ..."), and registering a dma-buf MR with EOPNOTSUPP.
"""

from __future__ import annotations

import errno
from typing import Any

from softverbs.errors import PyverbsRDMAError
from softverbs.verbs.base import PyverbsCM, as_count, require
from softverbs.verbs.mr import MR
from softverbs.verbs.pd import PD


class DmaBuf(PyverbsCM):
    """A GPU dma-buf: ``DmaBuf(size, gpu=0, gtt=0)`` -- EOPNOTSUPP on softverbs."""

    def __init__(self, size: int, gpu: int = 0, gtt: int = 0) -> None:
        super().__init__()
        raise PyverbsRDMAError(
            f"Failed to allocate dmabuf of size {size} on gpu {gpu}: softverbs allocates no "
            "GPU memory",
            errno.EOPNOTSUPP,
        )


class DmaBufMR(MR):
    """``DmaBufMR(pd, length, access, dmabuf=None, offset=0, gpu=0, gtt=0)``:
    EOPNOTSUPP -- softverbs cannot reach memory it cannot map."""

    def __init__(self, pd: Any, length: int, access: int, dmabuf: Any = None,
                 offset: int = 0, gpu: int = 0, gtt: int = 0) -> None:  # fmt: skip
        PyverbsCM.__init__(self)
        require(pd, PD, "pd")
        if dmabuf is None:
            dmabuf = DmaBuf(as_count(length, "length") + as_count(offset, "offset"), gpu, gtt)
        raise PyverbsRDMAError(
            f"Failed to register a dma-buf MR. length: {length}, access flags: {access}: "
            "softverbs devices have no DMA engine to reach a dma-buf with",
            errno.EOPNOTSUPP,
        )

    def _release(self) -> None:
        """Nothing was registered."""
