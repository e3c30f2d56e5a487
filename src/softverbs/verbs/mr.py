"""Memory regions and memory windows (pyverbs ``mr``)."""

from __future__ import annotations

from typing import Any

from softverbs.engine.memory import MemKey, MemKind
from softverbs.enums import (
    IBV_ACCESS_HUGETLB,
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_ON_DEMAND,
    IBV_ACCESS_RELAXED_ORDERING,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_MW_TYPE_1,
    IBV_MW_TYPE_2,
    IBV_REREG_MR_CHANGE_ACCESS,
    IBV_REREG_MR_CHANGE_PD,
    IBV_REREG_MR_CHANGE_TRANSLATION,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError, einval, eopnotsupp
from softverbs.verbs import memory
from softverbs.verbs.base import PyverbsCM, require
from softverbs.verbs.pd import PD

SUPPORTED_ACCESS = (
    IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_MW_BIND
    | IBV_ACCESS_ZERO_BASED
    | IBV_ACCESS_HUGETLB
    | IBV_ACCESS_RELAXED_ORDERING
)


def check_access(access: int, what: str = "MR") -> None:
    """The verbs rules for access flags (IBA 10.6.3.1)."""
    if access & IBV_ACCESS_ON_DEMAND:
        raise eopnotsupp(f"{what}: on-demand paging (IBV_ACCESS_ON_DEMAND) is not supported")
    unknown = access & ~SUPPORTED_ACCESS
    if unknown:
        raise einval(f"{what}: unknown access flag bits {unknown:#x}")
    if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) and not (
        access & IBV_ACCESS_LOCAL_WRITE
    ):
        raise einval(
            f"{what}: IBV_ACCESS_REMOTE_WRITE and IBV_ACCESS_REMOTE_ATOMIC require "
            "IBV_ACCESS_LOCAL_WRITE (the device writes into the region)"
        )


def inc_rkey(rkey: int) -> int:
    """``ibv_inc_rkey``: the next key byte, same index."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


class MR(PyverbsCM):
    """A memory region: ``MR(pd, length, access)``.

    Beyond pyverbs: ``MR(pd, access=..., buffer=obj)`` registers any
    writable buffer-protocol object in place (bytearray, mmap, numpy array).
    """

    close_rank = 40

    def __init__(
        self,
        creator: PD,
        length: int = 0,
        access: int = 0,
        address: int | None = None,
        implicit: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        require(creator, PD, "creator")
        creator._check_open()
        if implicit:
            raise eopnotsupp("implicit (whole address space) MRs are not supported")
        check_access(access)
        buffer = kwargs.get("buffer")
        if buffer is not None:
            mem = memory.from_buffer(buffer)
        elif address:
            mem = memory.from_address(address, length)
        else:
            if not isinstance(length, int):
                raise PyverbsUserError(f"length must be an int, got {type(length).__name__}")
            mem = creator.ctx.provider.alloc_memory(length)
        self.pd = creator
        self._ctx = creator.ctx
        self._mem = mem
        self._user_addr = buffer is not None or bool(address)
        self._key: MemKey = creator.ctx.provider.reg_mr(creator, mem, access, self)
        self.access = access
        creator.add_ref(self)

    @classmethod
    def from_buffer(cls, pd: PD, buf: object, access: int) -> MR:
        """Register ``buf`` (any writable buffer-protocol object) in place."""
        return cls(pd, access=access, buffer=buf)

    # --- pyverbs properties -----------------------------------------------------
    @property
    def buf(self) -> int:
        return self._mem.addr

    @property
    def lkey(self) -> int:
        return self._key.key

    @property
    def rkey(self) -> int:
        return self._key.key

    @property
    def length(self) -> int:
        return len(self._mem.view)

    @property
    def handle(self) -> int:
        return self._key.key >> 8

    @property
    def view(self) -> memoryview:
        """The region's bytes (a softverbs addition)."""
        self._check_open()
        return self._mem.view

    def _bounds(self, length: int, offset: int) -> None:
        if offset < 0:
            raise PyverbsUserError(f"Invalid offset {offset}")
        if length < 0 or offset + length > self.length:
            raise PyverbsUserError(f"[{offset}, +{length}) is outside the MR's {self.length} bytes")

    def write(
        self, data: bytes | str | bytearray | memoryview, length: int, offset: int = 0
    ) -> None:
        """Copy ``length`` bytes of ``data`` into the region at ``offset``."""
        self._check_open()
        if isinstance(data, str):
            data = data.encode()
        self._bounds(length, offset)
        if length > len(data):
            raise PyverbsUserError(f"length {length} is longer than the data ({len(data)} bytes)")
        self._mem.view[offset : offset + length] = memoryview(data)[:length]

    def read(self, length: int, offset: int) -> bytes:
        self._check_open()
        self._bounds(length, offset)
        return bytes(self._mem.view[offset : offset + length])

    def rereg(
        self, flags: int, pd: PD | None = None, addr: int = 0, length: int = 0, access: int = 0
    ) -> None:
        """``ibv_rereg_mr``: change the PD, the translation or the access."""
        self._check_open()
        key = self._key
        if flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD
                     | IBV_REREG_MR_CHANGE_ACCESS) or not flags:  # fmt: skip
            raise einval(f"rereg: invalid flags {flags:#x}")
        if flags & IBV_REREG_MR_CHANGE_ACCESS:
            check_access(access)
        if flags & IBV_REREG_MR_CHANGE_PD:
            require(pd, PD, "pd")
        mem = None
        if flags & IBV_REREG_MR_CHANGE_TRANSLATION:
            mem = memory.from_address(addr, length)
        self._ctx.provider.update_mr(
            key,
            mem,
            access if flags & IBV_REREG_MR_CHANGE_ACCESS else None,
            pd if flags & IBV_REREG_MR_CHANGE_PD else None,
        )
        if mem is not None:
            if not self._user_addr:
                self._mem.release()
            self._mem = mem
            self._user_addr = True
        if flags & IBV_REREG_MR_CHANGE_ACCESS:
            self.access = access
        if pd is not None and flags & IBV_REREG_MR_CHANGE_PD:
            self.pd._deps.discard(self)
            self.pd = pd
            pd.add_ref(self)

    def _release(self) -> None:
        try:
            self._ctx.provider.dereg_mr(self._key)
        except PyverbsRDMAError:
            self._closed = False
            raise
        if not self._user_addr:
            self._mem.release()

    def __str__(self) -> str:
        f = "{:22}: {:<20}\n"
        return ("MR:\n" + f.format("lkey", self.lkey) + f.format("rkey", self.rkey)
                + f.format("length", self.length) + f.format("buf", self.buf)
                + f.format("handle", self.handle))  # fmt: skip


class MWBindInfo(PyverbsCM):
    """What to bind a window to: ``MWBindInfo(mr, addr, length, mw_access_flags)``."""

    def __init__(self, mr: MR, addr: int, length: int, mw_access_flags: int) -> None:
        super().__init__()
        require(mr, MR, "mr")
        self.mr = mr
        self.addr = addr
        self.length = length
        self.mw_access_flags = mw_access_flags


class MWBind(PyverbsCM):
    """A type 1 bind request for ``QP.bind_mw``."""

    def __init__(self, info: MWBindInfo, send_flags: int, wr_id: int = 0) -> None:
        super().__init__()
        require(info, MWBindInfo, "info")
        self.info = info
        self.send_flags = send_flags
        self.wr_id = wr_id


class MW(PyverbsCM):
    """A memory window: ``MW(pd, IBV_MW_TYPE_1 | IBV_MW_TYPE_2)``."""

    close_rank = 30

    def __init__(self, pd: PD, mw_type: int) -> None:
        super().__init__()
        require(pd, PD, "pd")
        pd._check_open()
        kinds: dict[int, MemKind] = {IBV_MW_TYPE_1: MemKind.MW1, IBV_MW_TYPE_2: MemKind.MW2}
        if mw_type not in kinds:
            raise einval(f"unknown memory window type {mw_type}; use IBV_MW_TYPE_1 or _2")
        self.pd = pd
        self._ctx = pd.ctx
        self._type = mw_type
        self._key: MemKey = pd.ctx.provider.alloc_mw(pd, kinds[mw_type], self)
        pd.add_ref(self)

    @property
    def rkey(self) -> int:
        return self._key.key

    @property
    def type(self) -> int:
        return self._type

    @property
    def handle(self) -> int:
        return self._key.key >> 8

    def _release(self) -> None:
        self._ctx.provider.dealloc_mw(self._key)

    def __str__(self) -> str:
        return f"MW:\n{'Rkey':22}: {self.rkey:<20}\n{'MW Type':22}: {self._type:<20}\n"
