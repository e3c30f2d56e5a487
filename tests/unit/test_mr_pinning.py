"""Registering memory by address checks it as the kernel's ``ib_umem_get`` pins it:
pages that are not mapped are EFAULT, and so are read-only pages when the access
lets anything write them (LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC, MW_BIND).
Without the check, a RECV or an RDMA WRITE into such memory would crash the
process that holds an in-process device (C programs on the served device are
checked by tests/native/resize.c)."""

from __future__ import annotations

import errno
import mmap
from collections.abc import Iterator

import pytest

from softverbs import MR, PD, Context, PyverbsRDMAError, hostmem
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_REREG_MR_CHANGE_TRANSLATION,
)

PAGE = mmap.PAGESIZE


@pytest.fixture
def pd() -> Iterator[PD]:
    with Context(name="sv0") as ctx:
        p = PD(ctx)
        yield p
        p.close()


@pytest.fixture
def read_only() -> Iterator[int]:
    addr = hostmem.mmap(length=PAGE, prot=mmap.PROT_READ)
    yield addr
    hostmem.munmap(addr, PAGE)


def test_read_only_pages_register_for_reading_only(pd: PD, read_only: int) -> None:
    MR(pd, PAGE, IBV_ACCESS_REMOTE_READ, address=read_only).close()
    with pytest.raises(PyverbsRDMAError) as exc:
        MR(pd, PAGE, IBV_ACCESS_LOCAL_WRITE, address=read_only)
    assert exc.value.error_code == errno.EFAULT
    assert "not mapped writable" in str(exc.value)


def test_pages_not_mapped_are_efault(pd: PD) -> None:
    addr = hostmem.mmap(length=2 * PAGE)
    hostmem.munmap(addr + PAGE, PAGE)  # the second page goes
    try:
        MR(pd, PAGE, IBV_ACCESS_LOCAL_WRITE, address=addr).close()
        with pytest.raises(PyverbsRDMAError) as exc:
            MR(pd, 2 * PAGE, 0, address=addr)
        assert exc.value.error_code == errno.EFAULT
    finally:
        hostmem.munmap(addr, PAGE)


def test_rereg_to_read_only_pages_for_writing_is_efault(pd: PD, read_only: int) -> None:
    mr = MR(pd, PAGE, IBV_ACCESS_LOCAL_WRITE)
    with pytest.raises(PyverbsRDMAError) as exc:
        mr.rereg(IBV_REREG_MR_CHANGE_TRANSLATION, addr=read_only, length=PAGE)
    assert exc.value.error_code == errno.EFAULT
    mr.close()
