"""The scatter/gather element (pyverbs ``wr.SGE``): an address, a length and
the local key of the MR that covers them.

It sits below the work requests (:mod:`.wr`, which re-exports it) because a
PD uses SGEs too (``ibv_advise_mr`` takes a list of them), and the work
requests name AHs and memory windows, which are made on a PD.
"""

from __future__ import annotations

from softverbs import hostmem
from softverbs.verbs.base import CMember, PyverbsCM, c_member


class SGE(PyverbsCM):
    """A scatter/gather element: ``SGE(addr, length, lkey)``.

    Its members (``CMember``) keep their values in slots of their own (``_addr``,
    ...): setting one checks it as the C member takes it (``c_member``, the rule of every C
    struct the verbs mirror).  Compiled, an extension type (sge.pxd): the slots are
    C struct fields that the post path reads directly, and an instance
    dictionary holds anything else a program hangs on an SGE.
    """

    _c_fields = {"addr": 64, "length": 32, "lkey": 32}
    _addr: int
    _length: int
    _lkey: int
    # the C members: each reads its slot, and a store checks the value (c_member)
    addr = CMember("addr")
    length = CMember("length")
    lkey = CMember("lkey")

    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self._addr = c_member(self, "addr", addr)
        self._length = c_member(self, "length", length)
        self._lkey = c_member(self, "lkey", lkey)

    def read(self, length: int, offset: int) -> bytes:
        """Read memory at the SGE's address (EFAULT if it is not mapped)."""
        return hostmem.read(self._addr, length, offset)

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"SGE(addr={self.addr:#x}, length={self.length}, lkey={self.lkey:#x})"

    def __str__(self) -> str:
        f = "{:22}: {:<20}\n"
        return (
            f.format("Address", hex(self.addr))
            + f.format("Length", self.length)
            + f.format("Key", hex(self.lkey))
        )
