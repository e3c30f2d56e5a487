"""Memory regions and memory windows (pyverbs ``mr``)."""

from __future__ import annotations

import errno
from typing import Any

from softverbs.device import core as rules
from softverbs.device import ops, records
from softverbs.enums import (
    IBV_ACCESS_ON_DEMAND,
    IBV_ACCESS_ZERO_BASED,
    IBV_MW_TYPE_1,
    IBV_MW_TYPE_2,
    IBV_REREG_MR_CHANGE_ACCESS,
    IBV_REREG_MR_CHANGE_PD,
    IBV_REREG_MR_CHANGE_TRANSLATION,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError, einval, eopnotsupp
from softverbs.verbs import memory
from softverbs.verbs.base import PyverbsCM, as_count, require
from softverbs.verbs.pd import PD
from softverbs.verbs.provider import Attach, destroy

SUPPORTED_ACCESS = rules.SUPPORTED_ACCESS
UNSUPPORTED_ACCESS = rules.UNSUPPORTED_ACCESS

#: ``MR.length`` of an implicit (whole address space) ODP MR: SIZE_MAX.
IMPLICIT_LENGTH = (1 << 64) - 1


def check_access(access: Any, what: str = "MR") -> None:
    """The verbs rules for access flags (IBA 10.6.3.1), checked early here for
    pyverbs' messages; the device checks them again (:func:`device.core.check_access`)."""
    if isinstance(access, bool) or not isinstance(access, int):
        raise PyverbsUserError(f"{what}: access must be an int, got {type(access).__name__}")
    rules.check_access(access, what)


def inc_rkey(rkey: int) -> int:
    """``ibv_inc_rkey``: the next key byte, same index."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


def _length(value: Any) -> int:
    length = as_count(value, "length")
    if length >= 1 << 64:
        raise PyverbsUserError(f"length {length} does not fit in a size_t")
    return length


class MR(PyverbsCM):
    """A memory region: ``MR(pd, length, access, address=None, implicit=False)``.

    * without ``address``: fresh zeroed page-aligned memory of ``length`` bytes;
    * with ``address``: the caller's memory at that address;
    * ``implicit=True`` (with ``IBV_ACCESS_ON_DEMAND``): the key covers the
      whole address space (``length`` is SIZE_MAX) -- any mapped address of
      the process may be used with it; ``buf`` is still a buffer of
      ``length`` bytes (or ``address``) to read and write through;
    * ``handle=h``: import the MR of that handle from the context this PD's
      context was imported from (``ibv_import_mr``); ``address`` is then the
      address ``buf`` reports, as in pyverbs.

    Beyond pyverbs: ``MR(pd, access=..., buffer=obj)`` registers any
    writable buffer-protocol object in place (bytearray, mmap, numpy array).
    On-demand paging is what softverbs always does (it never pins memory;
    see :mod:`softverbs.verbs.device_ex`), so ``IBV_ACCESS_ON_DEMAND`` MRs
    behave as any other; :meth:`prefetch` touches their pages.
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
        require(creator, PD, "creator")
        creator._check_open()
        handle = kwargs.get("handle")
        if handle is not None:
            self._import(creator, handle, address)
            return
        length = _length(length)
        fail = f"Failed to register a MR. length: {length}, access flags: {access}"
        check_access(access, fail)
        if implicit and not access & IBV_ACCESS_ON_DEMAND:
            raise einval(f"{fail}: an implicit MR must be an on-demand paging MR "
                         "(IBV_ACCESS_ON_DEMAND)")  # fmt: skip
        buffer = kwargs.get("buffer")
        if buffer is not None:
            mem = memory.from_buffer(buffer)
        elif address:
            if isinstance(address, bool) or not isinstance(address, int):
                raise PyverbsUserError(f"address must be an int, got {type(address).__name__}")
            mem = memory.from_address(address, length, access)
        else:
            if length < 0:
                raise PyverbsUserError(f"The MR buffer isn't allocated or length {length} "
                                       "is invalid")  # fmt: skip
            mem = creator.ctx.provider.alloc_memory(length)
        self._setup(creator, mem, access, user_addr=buffer is not None or bool(address),
                    implicit=implicit)  # fmt: skip

    def _setup(self, pd: PD, mem: memory.Memory, access: int, user_addr: bool,
               implicit: bool = False) -> None:  # fmt: skip
        """Register ``mem`` (and own it unless ``user_addr``)."""
        PyverbsCM.__init__(self)
        self.pd = pd
        self._ctx = pd.ctx
        self._mem = mem
        self._user_addr = user_addr
        self._imported = False
        self._implicit = implicit
        provider = pd.ctx.provider
        if access & IBV_ACCESS_ON_DEMAND and not provider.features.on_demand_paging:
            if not user_addr:
                mem.release()
            raise eopnotsupp("Failed to register a MR: this device has no on-demand paging "
                             "(ODP caps are 0)")  # fmt: skip
        length = len(mem.view)
        body = records.RegMR(mem.addr, length, mem.addr, 0, pd.device_pd, access,
                         records.REG_MR_IMPLICIT if implicit else 0, 0)  # fmt: skip
        try:
            reply = provider.call(ops.REG_MR, body, Attach(memory=None if implicit else mem))
        except BaseException:
            if not user_addr:
                mem.release()
            raise
        self.dev_handle: int = reply.mr
        self._lkey, self._rkey = reply.lkey, reply.rkey
        self._iova = 0 if access & IBV_ACCESS_ZERO_BASED else mem.addr
        self.access = access
        self._handle = pd.ctx.ucontext.add(self)
        pd.ctx.register(self, self.dev_handle)
        pd.add_ref(self)

    def _import(self, pd: PD, handle: Any, address: int | None) -> None:
        PyverbsCM.__init__(self)
        original = pd.ctx.ucontext.lookup(MR, handle, "Failed to import MR")
        self.pd = pd
        self._ctx = pd.ctx
        self.dev_handle = original.dev_handle
        self._lkey, self._rkey, self._iova = original._lkey, original._rkey, original._iova
        self._implicit = original._implicit
        self.access = original.access
        self._handle = original.handle
        self._imported = True
        self._user_addr = True
        # as ibv_import_mr: the region keeps its keys and length; its address is
        # whatever the caller says it is (pyverbs' ``address``), NULL if nothing
        view = original._mem.view
        self._mem = memory.Memory(view, address or 0, original)
        pd.add_ref(self)

    @classmethod
    def from_buffer(cls, pd: PD, buf: object, access: int) -> MR:
        """Register ``buf`` (any writable buffer-protocol object) in place."""
        return cls(pd, access=access, buffer=buf)

    # --- pyverbs properties -----------------------------------------------------
    @property
    def buf(self) -> int:
        return int(self._mem.addr)

    @property
    def lkey(self) -> int:
        return self._lkey

    @property
    def rkey(self) -> int:
        return self._rkey

    @property
    def length(self) -> int:
        return IMPLICIT_LENGTH if self._implicit else len(self._mem.view)

    @property
    def handle(self) -> int:
        return self._handle

    @property
    def view(self) -> memoryview:
        """The region's bytes (a softverbs addition)."""
        self._check_open()
        return self._mem.view

    def _bounds(self, length: Any, offset: Any) -> tuple[int, int]:
        for what, value in (("length", length), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise PyverbsUserError(f"{what} must be an int, got {type(value).__name__}")
        if offset < 0:
            raise PyverbsUserError(f"Invalid offset {offset}")
        size = len(self._mem.view)
        if length < 0 or offset + length > size:
            raise PyverbsUserError(f"The MR buffer isn't allocated or length {length} is "
                                   f"invalid: [{offset}, +{length}) is outside its {size} "
                                   "bytes")  # fmt: skip
        return length, offset

    def write(
        self, data: bytes | str | bytearray | memoryview, length: int, offset: int = 0
    ) -> None:
        """Copy ``length`` bytes of ``data`` into the region at ``offset``."""
        self._check_open()
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise PyverbsUserError(f"data must be str or bytes, got {type(data).__name__}")
        length, offset = self._bounds(length, offset)
        if length > len(data):
            raise PyverbsUserError(f"length {length} is longer than the data ({len(data)} bytes)")
        self._mem.view[offset : offset + length] = memoryview(data)[:length]

    def read(self, length: int, offset: int) -> bytes:
        self._check_open()
        length, offset = self._bounds(length, offset)
        return bytes(self._mem.view[offset : offset + length])

    def prefetch(self, addr: int, length: int, fault: bool) -> None:
        """Make ``[addr, addr+length)`` resident (``ibv_advise_mr`` PREFETCH).

        softverbs reaches memory through the process's page tables, so
        prefetching means touching one byte per page; without ``fault``
        (PREFETCH_NO_FAULT) pages that are not present are left alone.
        """
        from softverbs.errors import PyverbsRDMAError

        self._check_open()
        if not self._implicit:
            base = self._iova
            if addr < base or addr + length > base + len(self._mem.view):
                raise PyverbsRDMAError(f"Failed to advise MR: [{addr:#x}, +{length}) is "
                                       "outside the MR", errno.EINVAL)  # fmt: skip
        if fault:
            memory.touch(addr, length)

    def unimport(self) -> None:
        """``ibv_unimport_mr``: forget an imported MR without deregistering it."""
        self.close()

    def rereg(
        self, flags: int, pd: PD | None = None, addr: int = 0, length: int = 0, access: int = 0
    ) -> None:
        """``ibv_rereg_mr``: change the PD, the translation or the access."""
        self._check_open()
        fail = "Failed to rereg MR"
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise PyverbsUserError(f"flags must be an int, got {type(flags).__name__}")
        if flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD
                     | IBV_REREG_MR_CHANGE_ACCESS) or not flags:  # fmt: skip
            raise einval(f"{fail}: invalid flags {flags:#x}")
        if self._imported or self._implicit:
            raise eopnotsupp(f"{fail}: an imported or implicit MR cannot be re-registered")
        if flags & IBV_REREG_MR_CHANGE_ACCESS:
            check_access(access, fail)
        if flags & IBV_REREG_MR_CHANGE_PD:
            require(pd, PD, "pd")
        mem = None
        if flags & IBV_REREG_MR_CHANGE_TRANSLATION:
            final = access if flags & IBV_REREG_MR_CHANGE_ACCESS else self.access
            mem = memory.from_address(addr, _length(length), final)
        new_pd = pd.device_pd if pd is not None and flags & IBV_REREG_MR_CHANGE_PD else 0
        body = records.ReregMR(mem.addr if mem else 0, len(mem.view) if mem else 0, 0,
                           self.dev_handle, flags, new_pd, access, 0, 0)  # fmt: skip
        keys = self._ctx.provider.call(ops.REREG_MR, body, Attach(memory=mem))
        self._lkey, self._rkey = keys.lkey, keys.rkey
        if flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS):
            final = access if flags & IBV_REREG_MR_CHANGE_ACCESS else self.access
            base = mem.addr if mem is not None else self._iova
            self._iova = 0 if final & IBV_ACCESS_ZERO_BASED else base
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
        if self._imported:
            return
        try:
            destroy(self._ctx.provider, records.KIND_MR, self.dev_handle)
        except PyverbsRDMAError:
            self._closed = False
            raise
        self._ctx.ucontext.remove(self)
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
        kinds = (IBV_MW_TYPE_1, IBV_MW_TYPE_2)
        if not isinstance(mw_type, int) or isinstance(mw_type, bool) or mw_type not in kinds:
            raise einval(f"Failed to allocate MW: unknown memory window type {mw_type!r}; use "
                         "IBV_MW_TYPE_1 or IBV_MW_TYPE_2")  # fmt: skip
        self.pd = pd
        self._ctx = pd.ctx
        self._type = mw_type
        reply = pd.ctx.provider.call(ops.ALLOC_MW, records.AllocMW(pd.device_pd, int(mw_type)))
        self.dev_handle: int = reply.mw
        self._rkey: int = reply.rkey
        pd.add_ref(self)

    @property
    def rkey(self) -> int:
        """The window's rkey; a bind posted with a new key changes it, as the
        C library changes ``ibv_mw.rkey``."""
        return self._rkey

    @property
    def type(self) -> int:
        return self._type

    @property
    def handle(self) -> int:
        return self._rkey >> 8

    def _release(self) -> None:
        destroy(self._ctx.provider, records.KIND_MW, self.dev_handle)

    def __str__(self) -> str:
        return f"MW:\n{'Rkey':22}: {self.rkey:<20}\n{'MW Type':22}: {self._type:<20}\n"
