"""Indirect memory keys and block signatures: a key that transforms data as it moves.

An *indirect key* (an mlx5dv "mkey") is a memory key whose address space is
not one buffer but a **layout** over registered regions -- a list of pieces,
or an interleaved pattern repeated ``repeat`` times -- optionally with a
**block signature** configuration.  The key table hands the engine a view of
it like any other key (:meth:`IndirectKey.view`); nothing else in the engine
knows what it is.

Three byte streams
------------------
* **memory** -- the layout's bytes, in layout order.  With a memory-domain
  signature it is made of blocks ``[B data][signature]``;
* **data** -- the memory stream without its signature fields;
* **wire** -- what the transfer carries: the data, with a wire-domain
  signature field after every wire block.

Addresses and lengths on an indirect key (SGEs, remote addresses) count
**wire bytes**, from 0 -- the key is zero-based.  So a key over 516 bytes of
memory holding one 512-byte block plus its CRC32, with no wire signature, is
512 bytes long; a key over 512 bytes of memory with a T10-DIF wire signature
is 520 bytes long.  This is how Linux ULPs size signature transfers
(``rdma_rw_ctx_signature_init``).

Moving data
-----------
* **Memory to wire** (the key is gathered: a local SEND/WRITE source, or the
  target of a remote READ): :meth:`IndirectKey.view` builds the wire bytes at
  once.  Memory-domain signatures are checked (``check_mask``) and stripped;
  wire-domain signatures are generated, or copied from the memory field where
  ``copy_mask`` says so.
* **Wire to memory** (the key is scattered: a receive buffer, a READ target,
  the target of a remote WRITE): the view is a :class:`SigWriter`; as bytes
  arrive, each whole wire block's signature is checked and stripped, the
  data is stored, and memory-domain signatures are generated (or copied).

A block is checked or generated only when the transfer covers it entirely
(for memory to wire: when the transfer includes the block's last byte); the
data of partly covered blocks moves unchecked.  The first error is kept in
:attr:`IndirectKey.error` until :meth:`IndirectKey.take_error` (``mkey_check``)
clears it, and every error counts in the key table's ``integrity_errors``, which
is how a requester learns that a WQE's transfer failed its check (signature
pipelining).

Signature formats
-----------------
* CRC32 (IEEE 802.3; FC-PH) and CRC32C (Castagnoli; iSCSI): a 4-byte field,
  big-endian; ``seed`` (0 or 0xFFFFFFFF) is the initial register, and the
  result is inverted, so seed 0xFFFFFFFF gives the standard CRCs.
* T10-DIF: 8 bytes, big-endian: a 2-byte guard (CRC16, polynomial 0x8BB7,
  initial value ``bg`` 0 or 0xFFFF), a 2-byte application tag and a 4-byte
  reference tag.  With ``ref_remap`` block *i* of the key carries
  ``ref_tag + i``.  The escapes skip every check of a block whose application
  tag is 0xFFFF (``app_escape``), or whose application tag is 0xFFFF and
  reference tag 0xFFFFFFFF (``app_ref_escape``).

``check_mask`` and ``copy_mask`` have one bit per byte of the field: bit 7 is
its first byte.  A mismatch is reported as a bad guard, then a bad
application tag, then a bad reference tag (T10 order), with the value found
in the field as ``expected`` and the value the device computed as ``actual``
(mlx5dv_mkey_check(3)), and ``offset`` the data offset of the block in the
key (a multiple of the block size).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, cast

from softverbs.engine.memory import Bytes, readable
from softverbs.wire.codec import crc32 as _icrc_crc32

if TYPE_CHECKING:
    from softverbs.engine.memory import KeyTable, MemKey

# --- CRCs ------------------------------------------------------------------------------
#
# Native CRCs: ISA-L's CRC-32 (as the ICRC) and fastcrc's CRC-32C and T10-DIF,
# each about 0.1-0.2 us per 4 KiB block (bench/bench_crc.py).  Where a
# platform has no wheel of fastcrc, a table-driven fallback keeps the device
# correct, at about 3,000x the cost; ``NATIVE_CRCS`` says which is in use.

try:
    from fastcrc import crc16 as _crc16
    from fastcrc import crc32 as _crc32

    NATIVE_CRCS = True
except ImportError:  # pragma: no cover - exercised by test_signature's fallback test
    NATIVE_CRCS = False


def crc32(data: bytes | bytearray | memoryview, seed: int = 0xFFFFFFFF) -> int:
    """CRC-32 (IEEE): initial register ``seed``, reflected, output inverted."""
    return _icrc_crc32(data, seed ^ 0xFFFFFFFF)


def crc32c(data: bytes | bytearray | memoryview, seed: int = 0xFFFFFFFF) -> int:
    """CRC-32C (Castagnoli): initial register ``seed``, reflected, output inverted."""
    if NATIVE_CRCS:
        return _crc32.iscsi(data, seed ^ 0xFFFFFFFF)
    return crc32c_table(data, seed)


def crc16_t10dif(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """The T10-DIF guard: CRC16, polynomial 0x8BB7, not reflected, no final XOR."""
    if NATIVE_CRCS:
        return _crc16.t10_dif(data, seed)
    return crc16_t10dif_table(data, seed)


def _reflected_table(poly: int) -> tuple[int, ...]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        out.append(c)
    return tuple(out)


def _t10_table() -> tuple[int, ...]:
    out = []
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x8BB7) if c & 0x8000 else c << 1
        out.append(c & 0xFFFF)
    return tuple(out)


_CRC32C_TABLE = _reflected_table(0x82F63B78)
_T10DIF_TABLE = _t10_table()


def crc32c_table(data: bytes | bytearray | memoryview, seed: int = 0xFFFFFFFF) -> int:
    """:func:`crc32c` by table, for platforms without fastcrc (and as its reference)."""
    table = _CRC32C_TABLE
    crc = seed
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc16_t10dif_table(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """:func:`crc16_t10dif` by table, for platforms without fastcrc (and as its reference)."""
    table = _T10DIF_TABLE
    crc = seed
    for b in bytes(data):
        crc = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ b]
    return crc


# --- signature domains -------------------------------------------------------------------


class SigKind(IntEnum):
    CRC32 = 0
    CRC32C = 1
    T10DIF = 2


class SigErrType(IntEnum):
    """What a check found (values of ``mlx5dv_mkey_err_type``)."""

    NONE = 0
    BAD_GUARD = 1
    BAD_REFTAG = 2
    BAD_APPTAG = 3


class Escape(IntEnum):
    NONE = 0
    APP = 1  #: application tag 0xFFFF: skip the block's checks
    APP_REF = 2  #: application tag 0xFFFF and reference tag 0xFFFFFFFF: skip


#: check/copy mask bits of each T10-DIF part (bit 7 is the field's first byte)
MASK_GUARD = 0xC0
MASK_APPTAG = 0x30
MASK_REFTAG = 0x0F
MASK_CRC32 = 0xF0


@dataclass(frozen=True, slots=True)
class SigDomain:
    """The signature of one domain (memory or wire): what every block carries."""

    kind: SigKind
    block_size: int
    seed: int = 0  #: CRC: initial register (0 or 0xFFFFFFFF); T10-DIF: guard seed bg
    app_tag: int = 0
    ref_tag: int = 0
    ref_remap: bool = False
    escape: Escape = Escape.NONE

    @property
    def size(self) -> int:
        """Bytes of the signature field after each block."""
        return 8 if self.kind is SigKind.T10DIF else 4

    def guard(self, data: bytes | bytearray | memoryview) -> int:
        if self.kind is SigKind.CRC32:
            return crc32(data, self.seed)
        if self.kind is SigKind.CRC32C:
            return crc32c(data, self.seed)
        return crc16_t10dif(data, self.seed)

    def ref(self, block: int) -> int:
        return (self.ref_tag + block) & 0xFFFFFFFF if self.ref_remap else self.ref_tag

    def field(self, data: bytes | bytearray | memoryview, block: int) -> bytes:
        """The signature field the device generates for ``data``, block ``block``."""
        if self.kind is SigKind.T10DIF:
            return (
                self.guard(data).to_bytes(2, "big")
                + self.app_tag.to_bytes(2, "big")
                + self.ref(block).to_bytes(4, "big")
            )
        return self.guard(data).to_bytes(4, "big")

    def check(
        self, field: bytes, data: bytes | bytearray | memoryview, block: int, mask: int
    ) -> tuple[SigErrType, int, int] | None:
        """Compare ``field`` with the generated one on the bytes ``mask`` selects.

        Returns (error type, value in the field, value computed) or None."""
        if self.kind is not SigKind.T10DIF:
            if not mask & MASK_CRC32:
                return None
            want = self.field(data, block)
            if _differ(field, want, mask, 0, 4):
                return (SigErrType.BAD_GUARD, int.from_bytes(field, "big"),
                        int.from_bytes(want, "big"))  # fmt: skip
            return None
        if not mask & (MASK_GUARD | MASK_APPTAG | MASK_REFTAG):
            return None
        app = int.from_bytes(field[2:4], "big")
        ref = int.from_bytes(field[4:8], "big")
        if app == 0xFFFF and (
            self.escape is Escape.APP or (self.escape is Escape.APP_REF and ref == 0xFFFFFFFF)
        ):
            return None
        guard = self.guard(data) if mask & MASK_GUARD else 0
        want = (
            guard.to_bytes(2, "big")
            + self.app_tag.to_bytes(2, "big")
            + self.ref(block).to_bytes(4, "big")
        )
        if _differ(field, want, mask, 0, 2):
            return SigErrType.BAD_GUARD, int.from_bytes(field[:2], "big"), guard
        if _differ(field, want, mask, 2, 4):
            return SigErrType.BAD_APPTAG, app, self.app_tag
        if _differ(field, want, mask, 4, 8):
            return SigErrType.BAD_REFTAG, ref, self.ref(block)
        return None


def _differ(got: bytes, want: bytes, mask: int, lo: int, hi: int) -> bool:
    """Whether ``got`` and ``want`` differ in a byte of ``[lo, hi)`` that ``mask``
    selects (bit 7 selects the field's first byte, bit 0 its eighth)."""
    return any((mask >> (7 - i)) & 1 and got[i] != want[i] for i in range(lo, hi))


def _merge(generated: bytes, source: bytes, copy_mask: int) -> bytes:
    """``generated`` with the bytes ``copy_mask`` selects taken from ``source``."""
    n = len(generated)
    return bytes(source[i] if (copy_mask >> (7 - i)) & 1 else generated[i] for i in range(n))


def protect(data: bytes | bytearray | memoryview, dom: SigDomain | None) -> bytes:
    """``data`` as domain ``dom`` lays it out: each whole block followed by the
    signature field the device would generate for it (a trailing partial
    block has none).  With no domain, ``data`` itself."""
    data = bytes(data)
    if dom is None:
        return data
    b = dom.block_size
    full = len(data) // b
    out = bytearray()
    for j in range(full):
        chunk = data[j * b : (j + 1) * b]
        out += chunk
        out += dom.field(chunk, j)
    out += data[full * b :]
    return bytes(out)


def same_structure(mem: SigDomain | None, wire: SigDomain | None) -> bool:
    """Both domains carry the same kind of signature on the same block size."""
    return (
        mem is not None
        and wire is not None
        and mem.kind is wire.kind
        and mem.block_size == wire.block_size
    )


def auto_copy_mask(mem: SigDomain | None, wire: SigDomain | None) -> int:
    """The copy mask the device works out itself (mlx5dv_wr_set_mkey_sig_block(3))."""
    if mem is None or wire is None or not same_structure(mem, wire):
        return 0
    if mem.kind is not SigKind.T10DIF:
        return MASK_CRC32
    mask = 0
    if mem.seed == wire.seed:
        mask |= MASK_GUARD
    if mem.app_tag == wire.app_tag:
        mask |= MASK_APPTAG
    if mem.ref_tag == wire.ref_tag:
        mask |= MASK_REFTAG
    return mask


@dataclass(frozen=True, slots=True)
class SigBlock:
    """A key's block signature configuration."""

    mem: SigDomain | None
    wire: SigDomain | None
    check_mask: int = 0
    copy_mask: int = 0  #: effective: automatic, or the one given


@dataclass(slots=True)
class SigError:
    """The first signature error a key saw (mlx5dv_sig_err)."""

    err_type: SigErrType
    expected: int  #: the value in the signature field
    actual: int  #: the value computed from the data (or the configured tag)
    offset: int  #: data offset of the bad block in the key
    domain: str  #: "memory" or "wire"


# --- layouts ---------------------------------------------------------------------------------


class LayoutGone(Exception):
    """A region under the layout was deregistered or changed (the key is unusable)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """``count`` bytes at ``offset`` of region ``key``; the next repetition is
    ``count + skip`` bytes further."""

    key: MemKey
    offset: int
    count: int
    skip: int = 0


class Layout:
    """The memory stream of an indirect key: ``segments`` repeated ``repeat`` times."""

    __slots__ = ("_prefix", "length", "period", "repeat", "segments")

    def __init__(self, segments: list[Segment], repeat: int = 1) -> None:
        self.segments = segments
        self.repeat = repeat
        self._prefix: list[int] = []
        total = 0
        for seg in segments:
            self._prefix.append(total)
            total += seg.count
        self.period = total
        self.length = total * repeat

    def runs(self, m0: int, m1: int) -> Iterator[Bytes]:
        """The region slices holding memory-stream bytes ``[m0, m1)``, in order."""
        period = self.period
        pos = m0
        while pos < m1:
            rep, within = divmod(pos, period)
            i = bisect_right(self._prefix, within) - 1
            seg = self.segments[i]
            skip = within - self._prefix[i]
            # bisect_right never picks a zero-length segment while period > 0
            take = min(seg.count - skip, m1 - pos)
            key = seg.key
            view = key.view
            off = seg.offset + rep * (seg.count + seg.skip) + skip
            if not key.valid or view is None or off + take > len(view):
                raise LayoutGone(f"region {key.key:#x} under the layout was deregistered or shrank")
            yield view[off : off + take]
            pos += take

    def read(self, m0: int, m1: int) -> bytes:
        return b"".join(readable(run) for run in self.runs(m0, m1))

    def write(self, m0: int, data: bytes | bytearray | memoryview) -> None:
        pos = 0
        for run in self.runs(m0, m0 + len(data)):
            n = len(run)
            run[:] = data[pos : pos + n]
            pos += n

    def direct(self, m0: int, n: int) -> memoryview | None:
        """A region slice of exactly ``[m0, m0+n)`` when one piece holds it all."""
        if n == 0:
            return memoryview(bytearray())
        runs = self.runs(m0, m0 + n)
        first = next(runs)
        return first if len(first) == n and isinstance(first, memoryview) else None


# --- the key ---------------------------------------------------------------------------------


class _Geometry:
    """Where blocks and signature fields sit in the three streams."""

    __slots__ = ("bm", "bw", "data_len", "full_m", "full_w", "mem_len", "ms", "tail_w",
                 "um", "uw", "wire_len", "ws")  # fmt: skip

    def __init__(self, mem_len: int, sig: SigBlock | None) -> None:
        self.mem_len = mem_len
        mem = sig.mem if sig is not None else None
        wire = sig.wire if sig is not None else None
        if mem is not None:
            self.bm, self.ms = mem.block_size, mem.size
            self.um = self.bm + self.ms
            self.full_m, tail = divmod(mem_len, self.um)
            self.data_len = self.full_m * self.bm + min(tail, self.bm)
        else:
            self.bm, self.ms, self.um, self.full_m = 0, 0, 0, 0
            self.data_len = mem_len
        if wire is not None:
            self.bw, self.ws = wire.block_size, wire.size
            self.uw = self.bw + self.ws
            self.full_w, self.tail_w = divmod(self.data_len, self.bw)
            self.wire_len = self.full_w * self.uw + self.tail_w
        else:
            self.bw, self.ws, self.uw, self.full_w, self.tail_w = 0, 0, 0, 0, 0
            self.wire_len = self.data_len

    def d2m(self, d: int) -> int:
        """Memory offset of data byte ``d``."""
        if not self.bm:
            return d
        j, r = divmod(d, self.bm)
        return j * self.um + r

    def w2d(self, w: int) -> int:
        """How many data bytes come before wire offset ``w``."""
        if not self.bw:
            return w
        k, r = divmod(w, self.uw)
        return k * self.bw + min(r, self.bw)


class IndirectKey:
    """The transform behind an indirect key (see the module docstring)."""

    def __init__(self, table: KeyTable) -> None:
        self.table = table
        self.layout: Layout | None = None
        self.sig: SigBlock | None = None
        self.error: SigError | None = None
        self.geo = _Geometry(0, None)

    # --- configuration (a WQE executed in send-queue order) ---------------------------------
    def configure(
        self,
        mk: MemKey,
        pd: object,
        entries: list[tuple[int, int, int, int]] | None,
        repeat: int,
        access: int | None,
        sig: SigBlock | None,
        set_sig: bool,
    ) -> str | None:
        """Apply a configuration to key ``mk``; None on success, else why not.

        ``entries`` (lkey, address, count, skip) replace the layout unless None;
        ``access`` replaces the access flags unless None; with ``set_sig``,
        ``sig`` replaces the signature configuration (None removes it)."""
        from softverbs.engine.memory import MemKind
        from softverbs.enums import IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE

        new_access = mk.access if access is None else access
        layout = self.layout
        if entries is not None:
            segments = []
            for n, (lkey, addr, count, skip) in enumerate(entries):
                region = self.table.find(lkey)
                where = f"layout entry #{n} (lkey {lkey:#x})"
                if region is None or region.kind is not MemKind.MR or not region.valid:
                    return f"{where} is not a registered memory region"
                if region.view is None:
                    return f"{where} is an implicit region; a layout needs real regions"
                if region.pd is not pd:
                    return f"{where} belongs to another protection domain"
                span = (repeat - 1) * (count + skip) + count if count else 0
                view = region.slice(addr, span)
                if isinstance(view, str):
                    return f"{where}: {view}"
                segments.append(Segment(region, addr - region.iova, count, skip))
            layout = Layout(segments, repeat)
        if layout is None:
            layout = Layout([], 1)  # configured without a layout: zero bytes long
        if new_access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE):
            for seg in layout.segments:
                if not seg.key.access & IBV_ACCESS_LOCAL_WRITE:
                    return (f"writable access needs regions with IBV_ACCESS_LOCAL_WRITE; "
                            f"region {seg.key.key:#x} lacks it")  # fmt: skip
        self.layout = layout
        if set_sig:
            self.sig = sig
        self.geo = _Geometry(layout.length, self.sig)
        mk.access = new_access
        mk.iova = 0
        mk.length = self.geo.wire_len
        mk.valid = True
        return None

    # --- errors --------------------------------------------------------------------------------
    def report(self, err: tuple[SigErrType, int, int], offset: int, domain: str) -> None:
        self.table.integrity_errors += 1
        if self.error is None:
            self.error = SigError(err[0], err[1], err[2], offset, domain)

    def take_error(self) -> SigError | None:
        """The error kept since the last call (``mkey_check``), cleared."""
        err, self.error = self.error, None
        return err

    # --- data movement -----------------------------------------------------------------------
    def view(self, addr: int, length: int, write: bool, atomic: bool) -> memoryview | str:
        """Wire bytes ``[addr, addr+length)``: built now (read), or a writer (write)."""
        layout = self.layout
        geo = self.geo
        if layout is None:
            return "the key has no layout"
        if addr < 0 or length < 0 or addr + length > geo.wire_len:
            return f"[{addr:#x}, +{length}) is outside the indirect key's [0x0, +{geo.wire_len})"
        sig = self.sig
        plain = sig is None or (sig.mem is None and sig.wire is None)
        try:
            if plain:
                direct = layout.direct(addr, length)
                if direct is not None:
                    return direct
                if atomic:
                    return "an atomic target must lie in one piece of the indirect key's layout"
                if write:
                    return cast(memoryview, _LayoutWriter(layout, addr, length))
                return memoryview(layout.read(addr, addr + length))
            if atomic:
                return "atomic operations cannot target a key with a signature"
            if write:
                writer = SigWriter(self, addr, length)
                return cast(memoryview, writer)
            return self._gather(addr, length)
        except LayoutGone as exc:
            return str(exc)

    def read_data(self, d0: int, d1: int) -> bytes:
        """Data bytes ``[d0, d1)`` from memory (memory signature fields left out)."""
        geo = self.geo
        layout = self.layout
        assert layout is not None
        if d1 <= d0:
            return b""
        if not geo.bm:
            return layout.read(d0, d1)
        m0 = geo.d2m(d0)
        raw = memoryview(layout.read(m0, geo.d2m(d1 - 1) + 1))
        out = bytearray()
        d = d0
        while d < d1:
            j, r = divmod(d, geo.bm)
            take = min(geo.bm - r, d1 - d)
            off = j * geo.um + r - m0
            out += raw[off : off + take]
            d += take
        return bytes(out)

    def write_data(self, d: int, data: bytes | bytearray | memoryview) -> None:
        """Store data bytes from data offset ``d`` (around the memory signature fields)."""
        geo = self.geo
        layout = self.layout
        assert layout is not None
        if not geo.bm:
            layout.write(d, data)
            return
        pos = 0
        n = len(data)
        while pos < n:
            j, r = divmod(d + pos, geo.bm)
            take = min(geo.bm - r, n - pos)
            layout.write(j * geo.um + r, data[pos : pos + take])
            pos += take

    def mem_field(self, j: int) -> bytes:
        geo = self.geo
        assert self.layout is not None
        start = j * geo.um + geo.bm
        return self.layout.read(start, start + geo.ms)

    def _gather(self, a: int, n: int) -> memoryview:
        """Memory to wire (see the module docstring)."""
        sig = self.sig
        assert sig is not None
        geo = self.geo
        mem, wire = sig.mem, sig.wire
        c0, c1 = geo.w2d(a), geo.w2d(a + n)
        if wire is not None and n:
            k0, k1 = a // geo.uw, (a + n - 1) // geo.uw
            dlo, dhi = k0 * geo.bw, min((k1 + 1) * geo.bw, geo.data_len)
        else:
            k0, k1 = 0, -1
            dlo, dhi = c0, c1
        jlo = jhi = 0
        if mem is not None and sig.check_mask:
            # every memory block whose last byte this transfer carries is checked
            jlo, jhi = c0 // geo.bm, min(c1 // geo.bm, geo.full_m)
            if jhi > jlo:
                dlo, dhi = min(dlo, jlo * geo.bm), max(dhi, jhi * geo.bm)
        data = self.read_data(dlo, dhi)
        for j in range(jlo, jhi):
            assert mem is not None
            chunk = data[j * geo.bm - dlo : (j + 1) * geo.bm - dlo]
            err = mem.check(self.mem_field(j), chunk, j, sig.check_mask)
            if err is not None:
                self.report(err, j * geo.bm, "memory")
        if wire is None:
            return memoryview(data[c0 - dlo : c1 - dlo])
        copy = sig.copy_mask if same_structure(mem, wire) else 0
        out = bytearray()
        for k in range(k0, k1 + 1):
            chunk = data[k * geo.bw - dlo : min((k + 1) * geo.bw, geo.data_len) - dlo]
            out += chunk
            if k < geo.full_w:
                fld = wire.field(chunk, k)
                if copy and k < geo.full_m:
                    fld = _merge(fld, self.mem_field(k), copy)
                out += fld
        start = a - k0 * geo.uw
        return memoryview(bytes(out[start : start + n]))


class _LayoutWriter:
    """A writable view of ``[addr, addr+n)`` of a plain layout spanning pieces."""

    __slots__ = ("addr", "layout", "n")

    def __init__(self, layout: Layout, addr: int, n: int) -> None:
        self.layout = layout
        self.addr = addr
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> _LayoutWriter:
        start, stop, _ = key.indices(self.n)
        return _LayoutWriter(self.layout, self.addr + start, max(0, stop - start))

    def __setitem__(self, key: slice, value: Any) -> None:
        start, stop, _ = key.indices(self.n)
        if len(value) != stop - start:
            raise ValueError("a slice assignment must keep the view's size")
        self.layout.write(self.addr + start, value)


class SigWriter:
    """Wire bytes ``[a, a+n)`` arriving for a signature key (wire to memory).

    The engine writes through it as through a memoryview, in order (a
    restart from 0 -- a UC message resent -- begins again).  Bytes are
    staged, and processed as the received prefix grows."""

    def __init__(self, key: IndirectKey, a: int, n: int) -> None:
        self.key = key
        self.a = a
        self.n = n
        self.stage = bytearray(n)
        self.filled = 0  #: bytes received from the start, without a gap
        self.ahead: list[tuple[int, int]] = []  #: ranges received beyond a gap
        self.pos = 0  #: bytes processed
        geo = key.geo
        if key.sig is not None and key.sig.mem is not None:
            c0, c1 = geo.w2d(a), geo.w2d(a + n)
            self.j0 = -(-c0 // geo.bm)  # memory blocks whose data lies wholly in this transfer
            self.jend = min(c1 // geo.bm, geo.full_m)
        else:
            self.j0 = self.jend = 0
        self.jnext = self.j0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> _SubWriter:
        start, stop, _ = key.indices(self.n)
        return _SubWriter(self, start, max(0, stop - start))

    def __setitem__(self, key: slice, value: Any) -> None:
        start, stop, _ = key.indices(self.n)
        if len(value) != stop - start:
            raise ValueError("a slice assignment must keep the view's size")
        if start < self.pos:  # the message starts over
            self.pos = self.filled = 0
            self.jnext = self.j0
            self.ahead.clear()
        self.stage[start:stop] = value
        if start > self.filled:  # beyond a gap (the engine writes in order; be safe)
            self.ahead.append((start, stop))
            return
        self.filled = max(self.filled, stop)
        while True:  # pieces received beyond the gap join once it is filled
            joined = [r for r in self.ahead if r[0] <= self.filled]
            if not joined:
                break
            self.ahead = [r for r in self.ahead if r[0] > self.filled]
            self.filled = max(self.filled, *(r[1] for r in joined))
        self._process()

    def _process(self) -> None:
        key = self.key
        sig = key.sig
        assert sig is not None
        geo = key.geo
        a = self.a
        upto = self.filled
        stage = self.stage
        while self.pos < upto:
            w = a + self.pos
            if sig.wire is None:
                key.write_data(w, stage[self.pos : upto])
                self.pos = upto
            else:
                k, r = divmod(w, geo.uw)
                dlen = geo.bw if k < geo.full_w else geo.tail_w
                if r < dlen:
                    seg = min(upto - self.pos, dlen - r)
                    key.write_data(k * geo.bw + r, stage[self.pos : self.pos + seg])
                else:
                    seg = min(upto - self.pos, geo.uw - r)
                self.pos += seg
                if k < geo.full_w and a + self.pos == (k + 1) * geo.uw and k * geo.uw >= a:
                    self._wire_block(k)
            self._mem_blocks()

    def _wire_block(self, k: int) -> None:
        """Wire block ``k`` has arrived whole: check its signature."""
        key = self.key
        sig = key.sig
        assert sig is not None and sig.wire is not None
        geo = key.geo
        off = k * geo.uw - self.a
        data = self.stage[off : off + geo.bw]
        fld = bytes(self.stage[off + geo.bw : off + geo.uw])
        if sig.check_mask:
            err = sig.wire.check(fld, data, k, sig.check_mask)
            if err is not None:
                key.report(err, k * geo.bw, "wire")

    def _mem_blocks(self) -> None:
        """Write the signature of every memory block whose data is now complete."""
        key = self.key
        sig = key.sig
        assert sig is not None
        mem, wire = sig.mem, sig.wire
        if mem is None:
            return
        geo = key.geo
        done = geo.w2d(self.a + self.pos)
        copy = sig.copy_mask if same_structure(mem, wire) else 0
        while self.jnext < self.jend and (self.jnext + 1) * geo.bm <= done:
            j = self.jnext
            src = None
            if copy:
                end = (j + 1) * geo.uw  # the wire field to copy from, if this transfer has it
                if j * geo.uw >= self.a and end <= self.a + self.n:
                    if self.a + self.pos < end:
                        return  # wait for it
                    off = end - geo.ws - self.a
                    src = bytes(self.stage[off : off + geo.ws])
            fld = mem.field(key.read_data(j * geo.bm, (j + 1) * geo.bm), j)
            if src is not None:
                fld = _merge(fld, src, copy)
            assert key.layout is not None
            key.layout.write(j * geo.um + geo.bm, fld)
            self.jnext += 1


class _SubWriter:
    """``writer[i:j]``: the same writer, offset (an 8-byte atomic target, say)."""

    __slots__ = ("n", "off", "parent")

    def __init__(self, parent: SigWriter, off: int, n: int) -> None:
        self.parent = parent
        self.off = off
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __setitem__(self, key: slice, value: Any) -> None:
        start, stop, _ = key.indices(self.n)
        self.parent[self.off + start : self.off + stop] = value
