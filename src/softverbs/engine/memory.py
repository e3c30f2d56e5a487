"""Memory keys: the only way the engine touches memory.

Every memory region (MR) and memory window (MW) is a :class:`MemKey` in the
device's :class:`KeyTable`.  A key is 32 bits, as on ConnectX: a 24-bit table
index and an 8-bit *key byte* (``key = index << 8 | byte``).  The device draws
the byte at random when it registers a region or allocates a window, and draws
a different one when a region is re-registered onto new memory; a window's bind carries the
byte the driver chose (``ibv_inc_rkey`` for a type 1 bind, the application's
for a type 2 bind, IBA 10.6.7).  So a stale key never matches, and a key of
another process's region cannot be guessed from its neighbours' (a guessable
rkey would let any host that can send RoCE packets to the device write into
memory).  The random bytes come from a source the device injects (the engine
does no I/O and imports no randomness): an ``os.urandom``-seeded generator,
or in a :class:`~softverbs.sim.Simulation` one seeded from the simulation's
seed, so a seeded run stays reproducible.

The engine asks two questions, and gets either a ``memoryview`` of exactly
the requested bytes or a short string saying why not:

* :meth:`KeyTable.local` -- may this QP use ``lkey`` for ``[addr, addr+len)``?
* :meth:`KeyTable.remote` -- may a remote requester use ``rkey`` for it,
  with the given remote access right?

Nothing outside a registered region is reachable: the view handed back is a
slice of the region's own buffer, bounds-checked first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, MutableMapping
from enum import IntEnum
from typing import Any, Protocol

from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
)

KEY_INDEX_SHIFT = 8
KEY_BYTE_MASK = 0xFF
MAX_KEYS = 1 << 24

#: Where key bytes come from: each call returns a random integer (its low 8 bits
#: are used).  Injected by whoever builds the device.
KeyByteSource = Callable[[], int]

# Plain ints for the checks made on every access (IntFlag arithmetic builds an
# enum member per operation).
LOCAL_WRITE = int(IBV_ACCESS_LOCAL_WRITE)
MW_BIND = int(IBV_ACCESS_MW_BIND)
REMOTE_READ = int(IBV_ACCESS_REMOTE_READ)
REMOTE_WRITE = int(IBV_ACCESS_REMOTE_WRITE)
REMOTE_ATOMIC = int(IBV_ACCESS_REMOTE_ATOMIC)
ZERO_BASED = int(IBV_ACCESS_ZERO_BASED)
REMOTE_ACCESS = REMOTE_READ | REMOTE_WRITE | REMOTE_ATOMIC
# the rights KeyTable.remote compares with, per remote access (compiled: C constants)
_REMOTE_READ = REMOTE_READ
_REMOTE_ATOMIC = REMOTE_ATOMIC


class MemKind(IntEnum):
    MR = 0
    MW1 = 1  #: type 1 window: bound with ibv_bind_mw, checked against the PD
    MW2 = 2  #: type 2 window: bound by a BIND_MW WR, checked against the QP
    MKEY = 3  #: indirect key: a layout over regions, maybe transforming (engine/signature.py)


class Span(Protocol):
    """Registered bytes that are not this process's memoryview (the device
    service's view of a client's memory): the engine slices them and stores
    into them as into a memoryview, and reads them with :meth:`read`."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: slice) -> Span: ...
    def __setitem__(self, index: slice, data: bytes | bytearray | memoryview) -> None: ...
    def place(self, offset: int, data: bytes | bytearray | memoryview, tail: int) -> None:
        """``self[offset : offset + len(data)] = data`` with its last ``tail`` bytes
        stored after the rest (``engine.rings.place``), in one store if it can."""

    def read(self) -> memoryview: ...
    def still_mapped(self) -> bool: ...
    def fetch(self, offset: int, length: int) -> memoryview | None:
        """``self[offset : offset + length].read()`` if that part is still backed
        as registered (:meth:`still_mapped`), else None: a read access's check and
        copy in one call, with no span made for the part."""

    def part(self, offset: int, length: int) -> Span | None:
        """``self[offset : offset + length]`` if that part is still backed as
        registered, else None: a write access's check and target in one call."""


#: What a memory key covers: this process's bytes, or another process's.
Bytes = memoryview | Span


class WriteBack(bytearray):
    """A snapshot of a :class:`Span` that stores back what is assigned into it:
    what an atomic reads (``int.from_bytes``) and then writes (``cell[:] = v``)."""

    def __init__(self, span: Span) -> None:
        super().__init__(span.read())
        self.span = span

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        if isinstance(index, slice):
            start, stop, _ = index.indices(len(self))
            self.span[start:stop] = bytes(self[start:stop])


def readable(view: Bytes) -> memoryview:
    """Bytes the device reads (to send): a slice, or a span's current contents."""
    return view if isinstance(view, memoryview) else view.read()


class KeyTransform(Protocol):
    """What an indirect key resolves through instead of one buffer.

    ``view`` returns the bytes of ``[addr, addr+length)`` -- built for a read,
    or (``write``) an object the engine stores into as into a memoryview:
    ``len()``, slicing, slice assignment -- or a sentence saying why not."""

    def view(self, addr: int, length: int, write: bool, atomic: bool) -> memoryview | str: ...


class MemKey:
    """One registered region or window."""

    __slots__ = (
        "access",
        "binds",
        "iova",
        "key",
        "kind",
        "length",
        "mr",
        "owner",
        "pd",
        "qpn",
        "resolver",
        "unmapped",
        "valid",
        "view",
        "xform",
    )

    def __init__(self, kind: MemKind, key: int, pd: object, owner: Any = None) -> None:
        self.kind = kind
        self.key = key
        self.pd = pd
        self.owner = owner  #: the verbs object (MR or MW), for diagnostics
        self.iova = 0  #: address the region is addressed by on the wire
        self.length = 0
        self.access = 0
        self.view: Bytes | None = None
        self.valid = kind is MemKind.MR
        #: its owner unmapped or replaced the memory (:meth:`KeyTable.unmapped`)
        self.unmapped = False
        self.qpn = -1  #: type 2 windows: the QP they are bound to
        self.mr: MemKey | None = None  #: windows: the region they are bound to
        self.binds = 0  #: regions: number of windows bound to them
        #: implicit (whole address space) regions: addr, length -> view or why not
        self.resolver: Callable[[int, int], Bytes | str] | None = None
        #: indirect keys: the transform every access goes through
        self.xform: KeyTransform | None = None

    def slice(self, addr: int, length: int) -> Bytes | str:
        """The bytes ``[addr, addr+length)`` or why they are out of bounds."""
        if self.resolver is not None:
            if addr < 0 or length < 0:
                return f"[{addr:#x}, +{length}) is not a valid range"
            return self.resolver(addr, length)
        assert self.view is not None
        off = addr - self.iova
        if off < 0 or length < 0 or off + length > self.length:
            return _outside(self, addr, length)
        return self.view[off : off + length]


def _outside(mk: MemKey, addr: int, length: int) -> str:
    """Why ``[addr, addr+length)`` is out of ``mk``'s bounds."""
    return f"[{addr:#x}, +{length}) is outside key {mk.key:#x} [{mk.iova:#x}, +{mk.length})"


# MemKind members as module constants: KeyTable.local and .remote run for
# every SGE and every remote access, and a class attribute lookup of an enum
# member costs several times a global's
_MR = MemKind.MR
_MKEY = MemKind.MKEY
_MW2 = MemKind.MW2
# the same as C globals when compiled (memory.pxd): read without a dict lookup per SGE
_SHIFT = KEY_INDEX_SHIFT
_LOCAL_WRITE = LOCAL_WRITE


class KeyTable:
    """All keys of one device, by index."""

    def __init__(
        self, key_byte: KeyByteSource, counters: MutableMapping[str, int] | None = None
    ) -> None:
        #: the device's counters (``mr_unmapped``): its ``DeviceCounters``, or a ``Counter``
        self.counters: MutableMapping[str, int] = Counter() if counters is None else counters
        #: told of each key whose memory was found unmapped (the sanitizer's mr-unmapped)
        self.on_unmapped: Callable[[MemKey, str], None] | None = None
        self._keys: dict[int, MemKey] = {}
        self._next_index = 1
        self._key_byte = key_byte
        #: data integrity (signature) errors seen by transforming keys; a requester
        #: whose data movement raised it knows that WQE failed its check
        self.integrity_errors = 0

    def __len__(self) -> int:
        return len(self._keys)

    def _alloc_index(self) -> int:
        for _ in range(MAX_KEYS):
            index = self._next_index
            self._next_index = index + 1 if index + 1 < MAX_KEYS else 1
            if index not in self._keys:
                return index
        raise MemoryError("no free memory key")

    def register(
        self,
        kind: MemKind,
        pd: object,
        view: Bytes | None,
        addr: int,
        access: int,
        owner: Any = None,
    ) -> MemKey:
        """Add a region (``view`` of real memory at ``addr``) or an unbound window."""
        index = self._alloc_index()
        mk = MemKey(kind, (index << KEY_INDEX_SHIFT) | (self._key_byte() & KEY_BYTE_MASK), pd,
                    owner)  # fmt: skip
        if view is not None:
            mk.view = view
            mk.length = len(view)
            mk.iova = 0 if access & ZERO_BASED else addr
        mk.access = int(access)
        self._keys[index] = mk
        return mk

    def register_implicit(
        self,
        pd: object,
        resolver: Callable[[int, int], Bytes | str],
        access: int,
        owner: Any = None,
    ) -> MemKey:
        """Add an implicit region: every address ``resolver`` can map, with one key."""
        mk = self.register(MemKind.MR, pd, None, 0, access, owner)
        mk.resolver = resolver
        mk.length = 1 << 64
        return mk

    def rekey(self, mk: MemKey) -> int:
        """A new key byte for ``mk`` (re-registration): same index, another byte,
        so the old key no longer matches.  The new key."""
        byte = self._key_byte() & KEY_BYTE_MASK
        if byte == mk.key & KEY_BYTE_MASK:
            byte = (byte + 1) & KEY_BYTE_MASK
        mk.key = (mk.key & ~KEY_BYTE_MASK) | byte
        return mk.key

    def unregister(self, mk: MemKey) -> None:
        mk.valid = False
        self._keys.pop(mk.key >> KEY_INDEX_SHIFT, None)

    def find(self, key: int) -> MemKey | None:
        mk = self._keys.get(key >> KEY_INDEX_SHIFT)
        if mk is None or mk.key != key:
            return None
        return mk

    def local(self, lkey: int, pd: object, addr: int, length: int, write: bool) -> Any:
        """Resolve a local SGE: the bytes to read (a memoryview), or -- with
        ``write`` -- what the device stores into; or a sentence saying why not."""
        mk = self._keys.get(lkey >> _SHIFT)
        if mk is None or mk.key != lkey or (mk.kind is not _MR and mk.kind is not _MKEY):
            return f"lkey {lkey:#x} is not a registered memory region"
        if not mk.valid:
            return f"lkey {lkey:#x} was invalidated"
        if mk.pd is not pd:
            return f"lkey {lkey:#x} belongs to another protection domain"
        if write and not mk.access & _LOCAL_WRITE:
            return f"lkey {lkey:#x} lacks IBV_ACCESS_LOCAL_WRITE"
        if mk.xform is not None:
            return mk.xform.view(addr, length, write, False)
        return self._access(mk, addr, length, write, "lkey", lkey)

    def remote(self, rkey: int, pd: object, qpn: int, va: int, length: int, right: int) -> Any:
        """Resolve a remote access with ``right`` (one IBV_ACCESS_REMOTE_* bit):
        bytes to read for a READ, a target to store into for a WRITE, an
        8-byte cell for an atomic; or a sentence saying why not."""
        mk = self._keys.get(rkey >> _SHIFT)
        if mk is None or mk.key != rkey:
            return f"rkey {rkey:#x} is not valid on this device"
        if not mk.valid:
            return f"rkey {rkey:#x} was invalidated"
        if mk.pd is not pd:
            return f"rkey {rkey:#x} belongs to another protection domain"
        if mk.kind is _MW2 and mk.qpn != qpn:
            return f"rkey {rkey:#x} is a type 2 window bound to QP {mk.qpn:#x}, not {qpn:#x}"
        if not mk.access & right:
            return f"rkey {rkey:#x} does not grant {_right_name(right)}"
        if mk.xform is not None:
            return mk.xform.view(
                va, length, right != _REMOTE_READ, right == _REMOTE_ATOMIC
            )
        got = self._access(mk, va, length, right != _REMOTE_READ, "rkey", rkey)
        if right == _REMOTE_ATOMIC and not isinstance(got, (str, memoryview)):
            return WriteBack(got)  # a Span: the atomic reads a copy and stores it back
        return got

    def _access(self, mk: MemKey, addr: int, length: int, write: bool, name: str,
                key: int) -> Any:  # fmt: skip
        """The bytes ``[addr, addr+length)`` of ``mk`` (whose rights were checked):
        a copy to read, or -- with ``write`` -- the target to store into; or why not.

        A region of this process's memory is a slice of its memoryview.  A region of
        another process's (a :class:`Span`) is checked for its bounds here, then in
        one call for its mapping with the copy (``fetch``) or the target (``part``):
        no span is made for a read, and none is sliced before its check.  An
        implicit region resolves the range, then checks what it got."""
        span = mk.view
        if mk.resolver is None and span is not None:
            off = addr - mk.iova
            if off < 0 or length < 0 or off + length > mk.length:
                return _outside(mk, addr, length)
            if isinstance(span, memoryview):
                return span[off : off + length]
            if not mk.unmapped:
                got = span.part(off, length) if write else span.fetch(off, length)
                if got is not None:
                    return got
            return self.unmapped(mk, f"{name} {key:#x}")
        view = mk.slice(addr, length)
        if isinstance(view, (str, memoryview)):
            return view
        if mk.unmapped or not view.still_mapped():
            return self.unmapped(mk, f"{name} {key:#x}")
        return view if write else view.read()

    def unmapped(self, mk: MemKey, what: str) -> str:
        """``mk``'s memory is no longer what was registered (its owner unmapped or
        replaced it): the key stays invalid for every later access, and each
        refused access counts (``mr_unmapped``).  Why, for the failed WR."""
        region = mk.mr if mk.mr is not None else mk
        first = not region.unmapped
        region.unmapped = mk.unmapped = True
        self.counters["mr_unmapped"] += 1
        why = (f"{what}: the memory of region [{region.iova:#x}, +{region.length}) was "
               f"unmapped or replaced by its owner after registration (mr-unmapped)")
        if first and self.on_unmapped is not None:
            self.on_unmapped(region, why)
        return why

    # --- windows -----------------------------------------------------------
    def bind(
        self,
        mw: MemKey,
        mr: MemKey,
        new_key: int,
        addr: int,
        length: int,
        access: int,
        qpn: int,
        pd: object,
    ) -> str | None:
        """Bind window ``mw`` to ``[addr, addr+length)`` of ``mr``; None on success."""
        if mr.kind is not MemKind.MR or not mr.valid:
            return "the region to bind is not a valid memory region"
        if mr.pd is not pd or mw.pd is not pd:
            return "window, region and QP must share one protection domain"
        if not mr.access & MW_BIND:
            return "the region was not registered with IBV_ACCESS_MW_BIND"
        if access & (REMOTE_WRITE | REMOTE_ATOMIC) and not (
            mr.access & LOCAL_WRITE
        ):
            return "remote write/atomic rights need a region with IBV_ACCESS_LOCAL_WRITE"
        if mw.kind is MemKind.MW2 and mw.valid:
            return "a type 2 window must be invalidated before it is bound again"
        if (new_key >> KEY_INDEX_SHIFT) != (mw.key >> KEY_INDEX_SHIFT):
            return "a bind may change only the key byte of the window's rkey"
        view = mr.slice(addr, length)
        if isinstance(view, str):
            return view
        if mw.mr is not None:
            mw.mr.binds -= 1
        mw.key = new_key
        mw.view = view
        mw.iova = 0 if access & ZERO_BASED else addr
        mw.length = length
        mw.access = access & REMOTE_ACCESS
        mw.mr = mr
        mw.qpn = qpn if mw.kind is MemKind.MW2 else -1
        mr.binds += 1
        # A type 1 window with zero length is unbound (IBA 10.6.7.2.1).
        mw.valid = length > 0 or mw.kind is MemKind.MW2
        return None

    def invalidate(self, rkey: int, pd: object, qpn: int | None = None) -> str | None:
        """LOCAL_INV / SEND_WITH_INV of a type 2 window (or LOCAL_INV of an
        indirect key); None on success."""
        mk = self.find(rkey)
        if mk is None:
            return f"rkey {rkey:#x} is not valid on this device"
        if mk.pd is not pd:
            return f"rkey {rkey:#x} belongs to another protection domain"
        if mk.kind is MemKind.MKEY:
            if qpn is not None:
                return f"rkey {rkey:#x} is an indirect key; it cannot be invalidated remotely"
            if not mk.valid:
                return f"key {rkey:#x} is already invalid"
            mk.valid = False
            return None
        if mk.kind is not MemKind.MW2:
            return f"rkey {rkey:#x} is not a type 2 memory window; only those can be invalidated"
        if not mk.valid:
            return f"rkey {rkey:#x} is already invalid"
        if qpn is not None and mk.qpn != qpn:
            return f"rkey {rkey:#x} is bound to QP {mk.qpn:#x}, not {qpn:#x}"
        mk.valid = False
        if mk.mr is not None:
            mk.mr.binds -= 1
            mk.mr = None
        return None


_RIGHT_NAMES: dict[int, str] = {
    IBV_ACCESS_REMOTE_READ: "IBV_ACCESS_REMOTE_READ",
    IBV_ACCESS_REMOTE_WRITE: "IBV_ACCESS_REMOTE_WRITE",
    IBV_ACCESS_REMOTE_ATOMIC: "IBV_ACCESS_REMOTE_ATOMIC",
}


def _right_name(right: int) -> str:
    return _RIGHT_NAMES.get(right, hex(right))


# --- the service's passes over process memory -----------------------------------------------

#: The service's count of messages served (:func:`new_pass`): what a
#: :class:`~softverbs.device.memory.ProcessMemory` with ``reuse`` keys its answers by.
_pass = 0


def new_pass() -> None:
    """The service is about to serve a message (a request, a doorbell, a
    packet): mappings checked before now must be checked again.

    Between two calls, the engine's accesses to one process's memory ask
    the kernel once per mapping, not once per access: a burst of WQEs on
    one region costs one ``PROCMAP_QUERY``.  That is sound because nothing
    the service serves in between can carry news of an unmap: a program
    that unmaps a region and then tells anyone (a post, a message to a
    peer that then posts) does it in a message the service has not read
    yet, and an unmap that races the service's access was a race before
    too -- the query and the copy are two system calls
    (docs/architecture.md, *Registered memory and munmap*)."""
    global _pass
    _pass += 1


def current_pass() -> int:
    """The pass :func:`new_pass` last began."""
    return _pass

