"""Indirect keys in the engine: layouts and block-signature transforms.

These drive :class:`softverbs.engine.signature.IndirectKey` through the key
table exactly as the requester and responder do -- ``KeyTable.local`` /
``remote`` return built wire bytes for a read, or a writer for a write -- and
compare with a reference model: the memory image of data ``D`` under a
domain is ``[block][field(block, j)]...`` plus an unsigned tail.
"""

from __future__ import annotations

import functools
import random

import pytest

from softverbs.engine.memory import KeyTable, MemKey, MemKind
from softverbs.engine.signature import (
    MASK_CRC32,
    Escape,
    IndirectKey,
    SigBlock,
    SigDomain,
    SigErrType,
    SigKind,
    auto_copy_mask,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
)

ADDR = 0x10000
RW = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE
QPN = 0x11


def image(data: bytes, dom: SigDomain | None) -> bytes:
    """The reference stream of ``data`` under ``dom``: blocks, each with its field."""
    if dom is None:
        return data
    b = dom.block_size
    full = len(data) // b
    out = bytearray()
    for j in range(full):
        chunk = data[j * b : (j + 1) * b]
        out += chunk + dom.field(chunk, j)
    return bytes(out + data[full * b :])


class Rig:
    """A key table with one region, and an indirect key laid over it in ``pieces``
    scrambled slices (so every transfer also crosses layout pieces)."""

    def __init__(self, mem_len: int, sig: SigBlock | None, pieces: int = 3, seed: int = 0):
        self.keys = KeyTable(functools.partial(random.Random(0).getrandbits, 8))
        self.pd = object()
        self.buf = bytearray(mem_len + 64)
        self.mr = self.keys.register(MemKind.MR, self.pd, memoryview(self.buf), ADDR, RW)
        # cut [0, mem_len) of the region into pieces and lay them out in another order
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, mem_len), pieces - 1)) if pieces > 1 else []
        bounds = [0, *cuts, mem_len]
        spans = [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]
        order = list(range(len(spans)))
        rng.shuffle(order)
        self.entries = [(self.mr.key, ADDR + spans[i][0], spans[i][1], 0) for i in order]
        self.mk: MemKey = self.keys.register(MemKind.MKEY, self.pd, None, 0, 0)
        self.mk.valid = False
        self.xk = IndirectKey(self.keys)
        self.mk.xform = self.xk
        assert self.configure(sig) is None

    def configure(self, sig: SigBlock | None, access: int = RW) -> str | None:
        return self.xk.configure(self.mk, self.pd, self.entries, 1, access, sig, True)

    def stream(self) -> bytes:
        """The memory stream, in layout order."""
        return b"".join(bytes(self.buf[a - ADDR : a - ADDR + n]) for _, a, n, _ in self.entries)

    def set_stream(self, data: bytes) -> None:
        pos = 0
        for _, a, n, _ in self.entries:
            self.buf[a - ADDR : a - ADDR + n] = data[pos : pos + n]
            pos += n

    def read(self, a: int, n: int) -> bytes:
        got = self.keys.local(self.mk.key, self.pd, a, n, False)
        assert not isinstance(got, str), got
        return bytes(got)

    def write(self, a: int, data: bytes, chunks: list[int] | None = None) -> None:
        got = self.keys.remote(self.mk.key, self.pd, QPN, a, len(data), IBV_ACCESS_REMOTE_WRITE)
        assert not isinstance(got, str), got
        pos = 0
        for size in chunks or [len(data)]:
            got[pos : pos + size] = data[pos : pos + size]
            pos += size
        assert pos == len(data)


def crc(kind: SigKind, bs: int = 512, seed: int = 0xFFFFFFFF) -> SigDomain:
    return SigDomain(kind, bs, seed)


def t10(bs: int = 512, **kw: object) -> SigDomain:
    return SigDomain(SigKind.T10DIF, bs, 0, app_tag=0x1234, ref_tag=100, ref_remap=True, **kw)  # type: ignore[arg-type]


DOMAINS = [
    (crc(SigKind.CRC32), None),
    (None, t10()),
    (crc(SigKind.CRC32C), crc(SigKind.CRC32C)),
    (t10(), t10()),
    (t10(4096), crc(SigKind.CRC32, 512, 0)),
    (crc(SigKind.CRC32C, 512), t10(4096)),
    (None, crc(SigKind.CRC32, 4096)),
]


def _chunks(total: int, rng: random.Random) -> list[int]:
    out = []
    while total:
        n = min(total, rng.choice([1, 7, 513, 1024, 4096]))
        out.append(n)
        total -= n
    return out


@pytest.mark.parametrize(("mem", "wire"), DOMAINS)
def test_round_trip_against_the_reference(mem: SigDomain | None, wire: SigDomain | None) -> None:
    rng = random.Random(1)
    data = rng.randbytes(2 * 4096 + 512 + 37)
    sig = SigBlock(mem, wire, 0xFF, auto_copy_mask(mem, wire))
    mem_img, wire_img = image(data, mem), image(data, wire)
    # memory to wire: a local gather / a remote READ
    rig = Rig(len(mem_img), sig)
    assert rig.mk.length == len(wire_img)
    rig.set_stream(mem_img)
    assert rig.read(0, len(wire_img)) == wire_img
    for _ in range(20):  # any sub-range is the same slice of the wire stream
        a = rng.randrange(len(wire_img))
        n = rng.randrange(len(wire_img) - a + 1)
        assert rig.read(a, n) == wire_img[a : a + n]
    assert rig.xk.take_error() is None
    # wire to memory: a receive / a remote WRITE / a READ response, packet by packet
    rig2 = Rig(len(mem_img), sig, seed=2)
    rig2.write(0, wire_img, _chunks(len(wire_img), rng))
    assert rig2.stream() == mem_img
    assert rig2.xk.take_error() is None
    assert rig.keys.integrity_errors == rig2.keys.integrity_errors == 0


def test_memory_check_reports_the_first_bad_block() -> None:
    dom = crc(SigKind.CRC32, 512, 0)
    data = bytes(range(256)) * 8  # 4 blocks
    mem_img = bytearray(image(data, dom))
    mem_img[2 * 516 + 512] ^= 0xFF  # block 2's CRC
    mem_img[3 * 516 + 10] ^= 0x01  # block 3's data
    rig = Rig(len(mem_img), SigBlock(dom, None, MASK_CRC32))
    rig.set_stream(bytes(mem_img))
    out = rig.read(0, 2048)
    assert out[:1546] == data[:1546] and out[1546] == data[1546] ^ 1  # data still moves
    err = rig.xk.take_error()
    assert err is not None
    assert (err.err_type, err.offset, err.domain) == (SigErrType.BAD_GUARD, 1024, "memory")
    good = dom.guard(data[1024:1536])
    assert err.actual == good and err.expected == good ^ 0xFF000000
    assert rig.keys.integrity_errors == 2  # both bad blocks counted
    assert rig.xk.take_error() is None  # taking it cleared it
    # a check only looks at blocks whose last byte the transfer carries
    assert rig.read(0, 1500) and rig.xk.take_error() is None
    assert rig.read(1500, 48) and rig.xk.take_error() is not None


def test_wire_check_strips_and_memory_gets_a_fresh_signature() -> None:
    mem, wire = crc(SigKind.CRC32C), t10()
    data = random.Random(3).randbytes(1024)
    wire_img = bytearray(image(data, wire))
    wire_img[520 + 512 + 2] ^= 0x10  # block 1's application tag
    rig = Rig(len(image(data, mem)), SigBlock(mem, wire, 0xFF))
    rig.write(0, bytes(wire_img), [100, 900, 40])
    assert rig.stream() == image(data, mem)
    err = rig.xk.take_error()
    assert err is not None
    assert (err.err_type, err.expected, err.actual) == (SigErrType.BAD_APPTAG, 0x0234, 0x1234)
    assert (err.offset, err.domain) == (512, "wire")


def test_check_mask_zero_checks_nothing() -> None:
    dom = crc(SigKind.CRC32, 512, 0)
    rig = Rig(516, SigBlock(dom, None, 0))
    rig.set_stream(bytes(516))  # zeros: a wrong CRC for these data
    assert rig.read(0, 512) == bytes(512)
    assert rig.xk.take_error() is None


def test_same_structure_copies_the_signature() -> None:
    mem = wire = crc(SigKind.CRC32)
    data = bytes(512)
    garbage = b"\xde\xad\xbe\xef"
    # automatic copy mask: the memory CRC goes to the wire as it is
    rig = Rig(516, SigBlock(mem, wire, 0, auto_copy_mask(mem, wire)))
    rig.set_stream(data + garbage)
    assert rig.read(0, 516) == data + garbage
    # an explicit empty copy mask: the wire CRC is generated
    assert rig.configure(SigBlock(mem, wire, 0, 0)) is None
    assert rig.read(0, 516) == data + mem.field(data, 0)
    # T10-DIF: only the parts with equal parameters are copied
    m = SigDomain(SigKind.T10DIF, 512, 0, app_tag=1, ref_tag=7)
    w = SigDomain(SigKind.T10DIF, 512, 0, app_tag=2, ref_tag=7)
    assert auto_copy_mask(m, w) == 0xCF
    rig = Rig(520, SigBlock(m, w, 0, auto_copy_mask(m, w)))
    rig.set_stream(data + b"\x11\x22\x33\x44\x55\x66\x77\x88")
    assert rig.read(0, 520)[512:] == b"\x11\x22\x00\x02\x55\x66\x77\x88"


def test_t10dif_escape_and_ref_remap_through_a_key() -> None:
    wire = SigDomain(
        SigKind.T10DIF,
        512,
        0xFFFF,
        app_tag=5,
        ref_tag=0xFFFFFFFE,
        ref_remap=True,
        escape=Escape.APP,
    )
    data = bytes(range(256)) * 6
    img = image(data, wire)
    assert img[520 + 516 : 520 + 520] == b"\xff\xff\xff\xff"  # block 1: the tag wraps
    assert img[2 * 520 + 516 : 2 * 520 + 520] == b"\x00\x00\x00\x00"
    rig = Rig(len(data), SigBlock(None, wire, 0xFF))
    bad = bytearray(img)
    bad[512:520] = b"\x00\x00\xff\xff" + b"\x00" * 4  # escaped: app tag 0xFFFF
    rig.write(0, bytes(bad))
    assert rig.stream() == data and rig.xk.take_error() is None


def test_block_sizes_may_differ_between_domains() -> None:
    mem, wire = crc(SigKind.CRC32, 4096), t10(512)
    data = random.Random(5).randbytes(8192)
    rig = Rig(len(image(data, mem)), SigBlock(mem, wire, 0xFF))
    rig.set_stream(image(data, mem))
    assert rig.read(0, len(image(data, wire))) == image(data, wire)
    rig2 = Rig(len(image(data, mem)), SigBlock(mem, wire, 0xFF))
    rig2.write(0, image(data, wire), [1024] * 8 + [128])
    assert rig2.stream() == image(data, mem)


def test_partly_covered_blocks_move_unchecked() -> None:
    # the rdma-core T10-DIF test moves 512 wire bytes of a 520-byte wire block
    wire = t10()
    rig = Rig(512, SigBlock(None, wire, 0xFF))
    rig.set_stream(b"c" * 512)
    assert rig.mk.length == 520
    assert rig.read(0, 512) == b"c" * 512  # the DIF would follow
    rig.write(0, b"s" * 512)
    assert rig.stream() == b"s" * 512 and rig.xk.take_error() is None


def test_writer_restarts_from_zero() -> None:
    """A UC message whose packet was lost is received again from its start."""
    dom = crc(SigKind.CRC32)
    data = bytes(range(256)) * 4
    rig = Rig(2 * 516, SigBlock(dom, None, 0))
    w = rig.keys.local(rig.mk.key, rig.pd, 0, 1024, True)
    assert not isinstance(w, str)
    w[0:700] = b"x" * 700
    w[0:1024] = data
    assert rig.stream() == image(data, dom)


def test_plain_layouts() -> None:
    """Without a signature a key is a layout: list or interleaved (the man page's example)."""
    keys = KeyTable(functools.partial(random.Random(0).getrandbits, 8))
    pd = object()
    b1, b2 = bytearray(2048), bytearray(64)
    mr1 = keys.register(MemKind.MR, pd, memoryview(b1), 0x1000, RW | IBV_ACCESS_REMOTE_ATOMIC)
    mr2 = keys.register(MemKind.MR, pd, memoryview(b2), 0x9000, RW)
    mk = keys.register(MemKind.MKEY, pd, None, 0, 0)
    xk = IndirectKey(keys)
    mk.xform = xk
    entries = [(mr1.key, 0x1000, 512, 4), (mr2.key, 0x9000, 8, 0)]
    assert xk.configure(mk, pd, entries, 2, RW, None, True) is None
    assert mk.length == 2 * 520
    view = keys.remote(mk.key, pd, QPN, 0, 1040, IBV_ACCESS_REMOTE_WRITE)
    assert not isinstance(view, str)
    view[0:1040] = bytes([1]) * 512 + bytes([2]) * 8 + bytes([3]) * 512 + bytes([4]) * 8
    assert b1[:512] == bytes([1]) * 512 and b1[512:516] == bytes(4)
    assert b1[516:1028] == bytes([3]) * 512
    assert b2[:16] == bytes([2]) * 8 + bytes([4]) * 8
    # a range inside one piece is the region's own memory (no copy)
    one = keys.local(mk.key, pd, 600, 100, True)
    assert isinstance(one, memoryview) and one.obj is not None
    one[0:1] = b"\xaa"
    assert b1[516 + 80] == 0xAA
    assert bytes(keys.local(mk.key, pd, 510, 4, False)) == bytes([1, 1, 2, 2])  # type: ignore[arg-type]
    # atomics need one piece; out-of-range accesses are refused
    assert isinstance(keys.remote(mk.key, pd, QPN, 8, 8, IBV_ACCESS_REMOTE_ATOMIC), str)
    assert "outside" in str(keys.local(mk.key, pd, 1000, 41, False))


def test_refusals() -> None:
    dom = crc(SigKind.CRC32)
    rig = Rig(516, SigBlock(dom, None, 0xF0))
    assert rig.configure(SigBlock(dom, None, 0xF0), access=RW | IBV_ACCESS_REMOTE_ATOMIC) is None
    keys, pd, key = rig.keys, rig.pd, rig.mk.key
    assert "signature" in str(keys.remote(key, pd, QPN, 0, 8, IBV_ACCESS_REMOTE_ATOMIC))
    # access follows the configuration
    assert rig.configure(None, access=IBV_ACCESS_LOCAL_WRITE) is None
    assert "does not grant" in str(keys.remote(key, pd, QPN, 0, 8, IBV_ACCESS_REMOTE_READ))
    # LOCAL_INV invalidates; only locally
    assert keys.invalidate(key, pd, QPN) is not None
    assert keys.invalidate(key, pd) is None
    assert "invalidated" in str(keys.local(key, pd, 0, 8, False))
    assert keys.invalidate(key, pd) is not None
    # a region under the layout that goes away makes the key unusable, not unsafe
    assert rig.configure(None) is None
    keys.unregister(rig.mr)
    assert "deregistered" in str(keys.local(key, pd, 0, 8, False))
    # a layout must name valid regions of the same PD
    other = keys.register(MemKind.MR, object(), memoryview(bytearray(8)), 0, RW)
    bad = rig.xk.configure(rig.mk, pd, [(other.key, 0, 8, 0)], 1, RW, None, True)
    assert bad is not None and "protection domain" in bad
    bad = rig.xk.configure(rig.mk, pd, [(0x12345, 0, 8, 0)], 1, RW, None, True)
    assert bad is not None and "not a registered" in bad


def test_writer_accepts_pieces_out_of_order() -> None:
    mem, wire = crc(SigKind.CRC32), t10()
    data = random.Random(9).randbytes(1024)
    img = image(data, wire)
    rig = Rig(len(image(data, mem)), SigBlock(mem, wire, 0xFF))
    w = rig.keys.local(rig.mk.key, rig.pd, 0, len(img), True)
    assert not isinstance(w, str)
    for a, b in ((600, 900), (0, 300), (900, 1040), (300, 600)):
        w[a:b] = img[a:b]
    assert rig.stream() == image(data, mem) and rig.xk.take_error() is None
