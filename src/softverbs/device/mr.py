"""Memory: regions, windows and indirect mkeys.

A memory region is a span of its owner's memory -- a memfd the request
passed, or the process's own memory through ``/proc/<pid>/mem``, pinned as
``ib_umem_get`` pins (every access checks the range is still mapped as it
was), or followed as it changes for an on-demand paging region -- under a
key of the device's key table (:class:`~softverbs.engine.memory.KeyTable`).
A memory window is a key with no memory until a bind WQE gives it part of a
region.  An indirect mkey (mlx5dv) is a key whose layout and signature
offload a driver WQE configures (:func:`mkey_configure`).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from softverbs.device import records
from softverbs.device.core import Host, Obj, Owner, Resources, check_access, kind_class
from softverbs.device.memory import WRITABLE_ACCESS, mapped
from softverbs.device.pd import PDObj
from softverbs.device.records import KIND_MKEY, KIND_MR, KIND_MW
from softverbs.engine.hca import HCA
from softverbs.engine.memory import Bytes, MemKey, MemKind
from softverbs.engine.signature import IndirectKey
from softverbs.enums import (
    IBV_ACCESS_ON_DEMAND,
    IBV_ACCESS_ZERO_BASED,
    IBV_MW_TYPE_1,
    IBV_MW_TYPE_2,
    IBV_REREG_MR_CHANGE_ACCESS,
    IBV_REREG_MR_CHANGE_PD,
    IBV_REREG_MR_CHANGE_TRANSLATION,
)
from softverbs.errors import PyverbsRDMAError, ebusy, einval, eopnotsupp


@kind_class
class MRObj(Obj):
    KIND = KIND_MR
    __slots__ = ()

    engine: MemKey

    def __init__(self, owner: Owner, pd: PDObj, key: MemKey) -> None:
        super().__init__(owner, pd.device, pd.ctx)
        self.engine = key

    def teardown(self, hca: HCA) -> None:
        key = self.engine
        if key.binds:
            raise ebusy(f"Failed to dereg MR: {key.binds} memory window(s) are still bound "
                        "to it; invalidate or deallocate them first")  # fmt: skip
        hca.keys.unregister(key)
        key.view = None  # the mapping it sliced can close now
        key.owner = None

    def describe(self, entry: dict[str, object]) -> None:
        key = self.engine
        entry.update(lkey=key.key, rkey=key.key, length=key.length, iova=key.iova)


@kind_class
class MWObj(Obj):
    KIND = KIND_MW
    __slots__ = ()

    engine: MemKey

    def __init__(self, owner: Owner, pd: PDObj, key: MemKey) -> None:
        super().__init__(owner, pd.device, pd.ctx)
        self.engine = key

    def uses(self, other: Obj) -> bool:
        """A window bound to a region uses it."""
        return isinstance(other, MRObj) and self.engine.mr is other.engine

    def teardown(self, hca: HCA) -> None:
        key = self.engine
        if key.mr is not None:
            key.mr.binds -= 1
            key.mr = None
        hca.keys.unregister(key)


@kind_class
class MkeyObj(Obj):
    """An indirect mkey; its release (set at creation) unregisters the key."""

    KIND = KIND_MKEY
    __slots__ = ("max_entries", "xform")

    engine: MemKey

    def __init__(self, owner: Owner, pd: PDObj, key: MemKey, xform: IndirectKey,
                 max_entries: int) -> None:  # fmt: skip
        super().__init__(owner, pd.device, pd.ctx)
        self.engine = key
        self.xform = xform
        self.max_entries = max_entries


def _span(owner: Owner, res: Resources, addr: int, length: int,
          access: int) -> Bytes:  # fmt: skip
    if res.span is not None:
        if len(res.span) != length:
            raise einval(f"the memory passed holds {len(res.span)} bytes, not {length}")
        return res.span
    memory = res.memory if res.memory is not None else owner.memory
    if memory is None:
        raise eopnotsupp("this process did not give the device access to its memory "
                         "(HELLO without /proc/self/mem): pass the region as a memfd")
    if addr + length > 1 << 64:
        raise einval(f"[{addr:#x}, +{length}) is not a valid address range")
    pid = memory.pid
    writable = bool(access & WRITABLE_ACCESS)
    if pid and not mapped(addr, length, pid, writable):
        what = "mapped writable" if writable else "mapped"
        raise PyverbsRDMAError(f"Failed to register memory: [{addr:#x}, +{length}) is not "
                               f"{what} in process {pid}", errno.EFAULT)  # fmt: skip
    # As ib_umem_get pins a region: every access first checks that the range is
    # still backed as it was registered.  An ODP region follows the mapping instead;
    # the device's own process (pid 0) holds its caller's pages itself.
    span = memory.span(addr, length, pinned=bool(pid) and not access & IBV_ACCESS_ON_DEMAND)
    if isinstance(span, str):
        raise PyverbsRDMAError(f"Failed to register memory: {span}", errno.EFAULT)
    return span


def reg_mr(host: Host, owner: Owner, req: records.RegMR, res: Resources) -> records.RegMRReply:
    pd = host.obj(owner, req.pd, PDObj)
    dev = pd.device
    fail = f"Failed to register a MR. length: {req.length}, access flags: {req.access}"
    check_access(req.access, fail)
    implicit = req.flags & records.REG_MR_IMPLICIT
    if req.access & IBV_ACCESS_ON_DEMAND and not dev.info.features.on_demand_paging:
        raise eopnotsupp(f"{fail}: this device has no on-demand paging")
    with host.on(dev):
        if implicit:
            mem = res.memory if res.memory is not None else owner.memory
            if mem is None:
                raise eopnotsupp(f"{fail}: an implicit ODP MR needs the process's memory")

            def resolve(addr: int, length: int) -> Bytes | str:
                if addr + length > 1 << 64:
                    return f"[{addr:#x}, +{length}) is not a valid address range"
                return mem.span(addr, length)

            key = dev.hca.keys.register_implicit(pd.engine, resolve, req.access)
        else:
            span = _span(owner, res, req.addr, req.length, req.access)
            key = dev.hca.keys.register(MemKind.MR, pd.engine, span, req.iova, req.access)
        rec = host.add(MRObj(owner, pd, key), (pd,))
        rec.release = res.release
        key.owner = rec
    return records.RegMRReply(rec.handle, key.key, key.key, 0)


def rereg_mr(host: Host, owner: Owner, req: records.ReregMR, res: Resources) -> records.Keys:
    rec = host.obj(owner, req.mr, MRObj)
    dev = rec.device
    key = rec.engine
    change = req.change
    if change & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD
                  | IBV_REREG_MR_CHANGE_ACCESS) or not change:  # fmt: skip
        raise einval(f"rereg MR: bad flags {change:#x}")
    new_pd = host.obj(owner, req.pd, PDObj, dev) if change & IBV_REREG_MR_CHANGE_PD else None
    access = check_access(req.access, "rereg MR") if change & IBV_REREG_MR_CHANGE_ACCESS \
        else None  # fmt: skip
    with host.on(dev):
        if key.binds:
            raise ebusy("rereg: memory windows are bound to this MR")
        if change & IBV_REREG_MR_CHANGE_TRANSLATION:
            final = access if access is not None else key.access
            span = _span(owner, res, req.addr, req.length, final)
            key.view = span
            key.length = req.length
            for close in rec.release:
                close()
            rec.release = res.release
        if access is not None:
            key.access = access
        if change & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS):
            base = req.addr if change & IBV_REREG_MR_CHANGE_TRANSLATION else key.iova
            key.iova = 0 if key.access & IBV_ACCESS_ZERO_BASED else base
        if new_pd is not None:
            old = rec.parents[0]
            old.users -= 1
            new_pd.users += 1
            rec.parents[0] = new_pd
            key.pd = new_pd.engine
        if change & IBV_REREG_MR_CHANGE_TRANSLATION:
            # new memory behind the region: a new key byte, so a peer holding
            # the old rkey never reaches it.  An access or PD change keeps the
            # keys, as on mlx5 (UMR) and rxe, and as rdma-core's tests expect
            # (test_mr_rereg_access uses the rkey exchanged before).
            dev.hca.keys.rekey(key)
    return records.Keys(key.key, key.key)


def alloc_mw(host: Host, owner: Owner, req: records.AllocMW,
             res: Resources) -> records.AllocMWReply:  # fmt: skip
    pd = host.obj(owner, req.pd, PDObj)
    dev = pd.device
    kinds = {int(IBV_MW_TYPE_1): MemKind.MW1, int(IBV_MW_TYPE_2): MemKind.MW2}
    if req.type not in kinds:
        raise einval(f"Failed to allocate MW: type {req.type} is not 1 or 2")
    with host.on(dev):
        key = dev.hca.keys.register(kinds[req.type], pd.engine, None, 0, 0)
        rec = host.add(MWObj(owner, pd, key), (pd,))
        key.owner = rec
    return records.AllocMWReply(rec.handle, key.key)


def create_mkey(host: Host, owner: Owner, req: records.CreateMkey,
                res: Resources) -> records.MkeyReply:  # fmt: skip
    """An indirect mkey on the PD: invalid until a driver WQE configures it."""
    pd = host.obj(owner, req.pd, PDObj)
    dev = pd.device
    if req.flags & ~records.MKEY_BLOCK_SIGNATURE:
        raise eopnotsupp(f"Failed to create mkey: flags {req.flags & ~records.MKEY_BLOCK_SIGNATURE:#x} "  # noqa: E501
                         "are not offered")  # fmt: skip
    if not 1 <= req.max_entries <= 0xFFFF:
        raise einval(f"Failed to create mkey: max_entries={req.max_entries} is not 1..65535")
    keys = dev.hca.keys
    with host.on(dev):
        key = keys.register(MemKind.MKEY, pd.engine, None, 0, 0, owner)
        key.valid = False
        xform = key.xform = IndirectKey(keys)
        rec = host.add(MkeyObj(owner, pd, key, xform, req.max_entries), (pd,))

    def release() -> None:
        key.xform = None
        keys.unregister(key)

    rec.release = [release]
    return records.MkeyReply(rec.handle, key.key)


def mkey_check(host: Host, owner: Owner, req: records.Handle,
               res: Resources) -> records.MkeyErr:  # fmt: skip
    rec = host.obj(owner, req.handle, MkeyObj)
    with host.on(rec.device):
        err = rec.xform.take_error()
    if err is None:
        return records.MkeyErr(0, 0, 0, 0, 0)
    return records.MkeyErr(int(err.err_type), 0 if err.domain == "memory" else 1, err.expected,
                       err.actual, err.offset)  # fmt: skip


def mkey_configure(key: Any, pd: object, data: bytes) -> Callable[[], str | None]:
    """The local operation of an mkey-configuring driver WQE: ``data`` (its
    inline bytes) decoded -- ValueError if malformed -- into what configures
    ``key`` when the WQE runs (in send-queue order)."""
    from softverbs.engine.signature import Escape, SigBlock, SigDomain, SigKind, auto_copy_mask

    head = records.MkeyConf.size()
    if len(data) < head:
        raise ValueError(f"an mkey configuration needs {head} bytes, the WQE has {len(data)}")
    conf: records.MkeyConf = records.MkeyConf.unpack(data)
    esize, dsize = records.MkeyEntry.size(), records.MkeySigDomain.size()
    need = head + conf.nentries * esize + (2 * dsize if conf.flags & records.MKEY_CONF_SIG else 0)
    if len(data) < need or conf.flags & ~15 or not 1 <= conf.repeat <= 0xFFFF:
        raise ValueError("the mkey configuration is malformed")
    entries = None
    if conf.flags & records.MKEY_CONF_LAYOUT:
        entries = []
        for i in range(conf.nentries):
            e: records.MkeyEntry = records.MkeyEntry.unpack(data, head + i * esize)
            entries.append((e.lkey, e.addr, e.count, e.skip))
    sig = None
    set_sig = bool(conf.flags & records.MKEY_CONF_SIG)
    if set_sig:
        base = head + conf.nentries * esize
        domains: list[SigDomain | None] = []
        for i in range(2):
            d: records.MkeySigDomain = records.MkeySigDomain.unpack(data, base + i * dsize)
            if not d.present:
                domains.append(None)
                continue
            if d.kind > 2 or d.escape > 2 or d.block_size not in (512, 4096):
                raise ValueError("a signature domain of the mkey configuration is malformed")
            domains.append(SigDomain(SigKind(d.kind), d.block_size, d.seed, d.app_tag, d.ref_tag,
                                     bool(d.ref_remap), Escape(d.escape)))  # fmt: skip
        if domains[0] is not None or domains[1] is not None:
            copy = conf.copy_mask
            if conf.flags & records.MKEY_CONF_AUTO_COPY:
                copy = auto_copy_mask(domains[0], domains[1])
            sig = SigBlock(domains[0], domains[1], conf.check_mask, copy)
    access = conf.access if conf.flags & records.MKEY_CONF_ACCESS else None
    repeat = conf.repeat
    xform = key.xform  # an IndirectKey (a test gives a stand-in: hence Any)

    def configure() -> str | None:
        if key.xform is not xform:
            return "the mkey was destroyed"
        result: str | None = xform.configure(key, pd, entries, repeat, access, sig, set_sig)
        return result

    return configure
