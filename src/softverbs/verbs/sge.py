"""The scatter/gather element (pyverbs ``wr.SGE``): an address, a length and
the local key of the MR that covers them.

It sits below the work requests (:mod:`.wr`, which re-exports it) because a
PD uses SGEs too (``ibv_advise_mr`` takes a list of them), and the work
requests name AHs and memory windows, which are made on a PD.
"""

from __future__ import annotations

from softverbs import hostmem
from softverbs.verbs.base import PyverbsCM, c_checked, c_member, c_store


class SGE(PyverbsCM):
    """A scatter/gather element: ``SGE(addr, length, lkey)``.

    Compiled, an extension type whose members are typed slots (sge.pxd), so the
    post path reads them as C struct fields; it keeps an instance dictionary for
    anything else a program hangs on it.  Setting a member checks it as the C
    member takes it (``c_member``, the rule of every C struct the verbs mirror).
    """

    _c_fields = {"addr": 64, "length": 32, "lkey": 32}
    addr: int
    length: int
    lkey: int

    def __init__(self, addr: int, length: int, lkey: int) -> None:
        # one per buffer, often one per WR: checked here and stored (compiled: C
        # stores into the typed slots)
        self.addr = c_member(self, "addr", addr)
        self.length = c_member(self, "length", length)
        self.lkey = c_member(self, "lkey", lkey)

    def __setattr__(self, name: str, value: object) -> None:
        c_store(self, name, c_checked(self, name, value))

    def read(self, length: int, offset: int) -> bytes:
        """Read memory at the SGE's address (EFAULT if it is not mapped)."""
        return hostmem.read(self.addr, length, offset)

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
