"""Device memory (pyverbs ``DM``, ``AllocDmAttr``, ``DMMR``): ``ibv_alloc_dm``.

Device memory is memory that belongs to the device, not to the process:
the program reaches it only through ``copy_to_dm`` / ``copy_from_dm``
(``ibv_memcpy_to_dm`` / ``ibv_memcpy_from_dm``) and, once registered as a
:class:`DMMR` (``ibv_reg_dm_mr``), through work requests.  A softverbs device
has :data:`MAX_DM_SIZE` bytes of it, owned by the device's provider (the
engine's side), allocated first-fit with the requested alignment.

Rules, as a device with word-addressed on-chip memory has them:

* copies move whole 32-bit words: ``dm_offset`` and ``length`` must be
  multiples of 4 (EINVAL), and stay inside the allocation (EFAULT);
* a DM MR is zero-based (``IBV_ACCESS_ZERO_BASED`` is required, EINVAL
  otherwise): work requests address it by offset, and its ``buf`` is 0;
* it must fit inside its DM (EINVAL).

A DM can be imported into a context imported from this one's ``cmd_fd``
(``DM(ctx, handle=dm.handle)``, ``ibv_import_dm``).
"""

from __future__ import annotations

import errno
from typing import Any

from softverbs.enums import IBV_ACCESS_ZERO_BASED
from softverbs.errors import PyverbsRDMAError, PyverbsUserError
from softverbs.verbs import memory
from softverbs.verbs.base import PyverbsCM, PyverbsObject, as_count, require
from softverbs.verbs.device import Context
from softverbs.verbs.memory import DM_WORD, DmPool
from softverbs.verbs.mr import MR, check_access
from softverbs.verbs.pd import PD


class AllocDmAttr(PyverbsObject):
    """``ibv_alloc_dm_attr``: ``AllocDmAttr(length, log_align_req=0, comp_mask=0)``."""

    def __init__(self, length: int, log_align_req: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        self.length = length
        self.log_align_req = log_align_req
        self.comp_mask = comp_mask


class DM(PyverbsCM):
    """Device memory: ``DM(ctx, AllocDmAttr(length))`` or ``DM(ctx, handle=h)``."""

    close_rank = 45

    def __init__(self, context: Context, dm_attr: AllocDmAttr | None = None, **kwargs: Any):
        super().__init__()
        require(context, Context, "context")
        context._check_open()
        self._imported = False
        handle = kwargs.get("handle")
        if handle is not None:
            original = context.ucontext.lookup(DM, handle, "Failed to import DM")
            self._pool: DmPool = original._pool
            self._start: int = original._start
            self._length: int = original._length
            self._handle: int = original.handle
            self._imported = True
        else:
            self._alloc(context, dm_attr)
            self._handle = context.ucontext.add(self)
        self.context = context
        self._ctx = context
        context.add_ref(self)

    def _alloc(self, context: Context, dm_attr: AllocDmAttr | None) -> None:
        max_size = context.query_device_ex().max_dm_size
        if max_size <= 0:
            raise PyverbsUserError("Device doesn't support dm allocation")
        require(dm_attr, AllocDmAttr, "dm_attr")
        assert dm_attr is not None
        length = as_count(dm_attr.length, "length")
        log_align = as_count(dm_attr.log_align_req, "log_align_req")
        fail = (f"Failed to allocate device memory of size {dm_attr.length}. "
                f"Max available size {max_size}.")  # fmt: skip
        if dm_attr.comp_mask or not 0 <= log_align < 32 or length <= 0:
            raise PyverbsRDMAError(fail, errno.EINVAL)
        pool: DmPool = context.provider.dm_pool()
        start = pool.alloc(length, log_align) if length <= max_size else None
        if start is None:
            raise PyverbsRDMAError(fail, errno.ENOMEM)
        self._pool = pool
        self._start = start
        self._length = length

    @property
    def handle(self) -> int:
        return self._handle

    @property
    def length(self) -> int:
        return self._length

    def view(self, offset: int, length: int) -> memoryview:
        """The device memory ``[offset, offset+length)`` (for registration)."""
        return self._pool.view(self._start + offset, length)

    def _check_range(self, dm_offset: Any, length: Any, fail: str) -> tuple[int, int]:
        dm_offset = as_count(dm_offset, "dm_offset")
        length = as_count(length, "length")
        if dm_offset < 0 or length < 0 or dm_offset + length > self._length:
            raise PyverbsRDMAError(f"{fail}: [{dm_offset}, +{length}) is outside the "
                                   f"{self._length} bytes of device memory",
                                   errno.EFAULT)  # fmt: skip
        if dm_offset % DM_WORD or length % DM_WORD:
            raise PyverbsRDMAError(f"{fail}: device memory is copied in {DM_WORD}-byte words; "
                                   f"offset {dm_offset} and length {length} must be multiples "
                                   f"of {DM_WORD}", errno.EINVAL)  # fmt: skip
        return dm_offset, length

    def copy_to_dm(self, dm_offset: int, data: bytes | str, length: int) -> None:
        """``ibv_memcpy_to_dm``."""
        fail = "Failed to copy to dm"
        self._check_open()
        if not isinstance(data, (str, bytes, bytearray, memoryview)):
            raise PyverbsUserError(f"{fail}: data must be str or bytes, got {type(data).__name__}")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        dm_offset, length = self._check_range(dm_offset, length, fail)
        if length > len(raw):
            raise PyverbsUserError(f"{fail}: length {length} is longer than the data "
                                   f"({len(raw)} bytes)")  # fmt: skip
        with self._ctx.lock:
            self.view(dm_offset, length)[:] = raw[:length]

    def copy_from_dm(self, dm_offset: int, length: int) -> bytes:
        """``ibv_memcpy_from_dm``."""
        self._check_open()
        dm_offset, length = self._check_range(dm_offset, length, "Failed to copy from dm")
        with self._ctx.lock:
            return bytes(self.view(dm_offset, length))

    def unimport(self) -> None:
        """``ibv_unimport_dm``: forget an imported DM without freeing it."""
        self.close()

    def _release(self) -> None:
        if not self._imported:
            self._ctx.ucontext.remove(self)
            self._pool.free(self._start)


class DMMR(MR):
    """A memory region on device memory: ``DMMR(pd, length, access, dm, offset)``."""

    def __init__(self, pd: PD, length: int, access: int, dm: DM, offset: int) -> None:
        require(pd, PD, "pd")
        require(dm, DM, "dm")
        pd._check_open()
        dm._check_open()
        fail = f"Failed to register a device MR. length: {length}, access flags: {access}"
        length = as_count(length, "length")
        offset = as_count(offset, "offset")
        check_access(access, fail)
        if not access & IBV_ACCESS_ZERO_BASED:
            raise PyverbsRDMAError(f"{fail}: a device memory MR must be zero based "
                                   "(IBV_ACCESS_ZERO_BASED)", errno.EINVAL)  # fmt: skip
        if offset < 0 or length < 0 or offset + length > dm.length:
            raise PyverbsRDMAError(f"{fail}: [{offset}, +{length}) does not fit in the "
                                   f"{dm.length} bytes of the DM", errno.EINVAL)  # fmt: skip
        pool = dm._pool
        mem = memory.Memory(dm.view(offset, length), 0, dm, pool.region, dm._start + offset)
        self._setup(pd, mem, access, user_addr=True)
        self.dm = dm
        dm.add_ref(self)

    def write(self, data: bytes | str | bytearray | memoryview, length: int,
              offset: int = 0) -> None:  # fmt: skip
        """As pyverbs: a DMMR's write copies to its DM at ``offset``."""
        self.dm.copy_to_dm(offset, bytes(data) if not isinstance(data, str) else data, length)

    def read(self, length: int, offset: int) -> bytes:
        return self.dm.copy_from_dm(offset, length)
