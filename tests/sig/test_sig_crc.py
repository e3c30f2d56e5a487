"""Known answers for the block signatures' checksums (softverbs.engine.signature).

Published test vectors: the CRC catalogue's check value (the CRC of the
ASCII string "123456789") for CRC-32, CRC-32C and CRC-16/T10-DIF, and the
CRC32C examples of RFC 3720 (iSCSI), appendix B.4.  The table-driven code is
also compared with a bit-at-a-time reference, and the seeds with their
meaning (the initial register).
"""

from __future__ import annotations

import random

import pytest

from softverbs.engine.signature import (
    NATIVE_CRCS,
    Escape,
    SigDomain,
    SigErrType,
    SigKind,
    crc16_t10dif,
    crc16_t10dif_table,
    crc32,
    crc32c,
    crc32c_table,
)

CHECK = b"123456789"


def test_catalogue_check_values() -> None:
    assert crc32(CHECK) == 0xCBF43926  # CRC-32 (ISO-HDLC, IEEE 802.3)
    assert crc32c(CHECK) == 0xE3069283  # CRC-32C (Castagnoli, iSCSI)
    assert crc16_t10dif(CHECK) == 0xD0DB  # CRC-16/T10-DIF


@pytest.mark.parametrize(
    ("data", "crc"),
    [
        (bytes(32), 0x8A9136AA),  # 32 bytes of zeros
        (b"\xff" * 32, 0x62A8AB43),  # 32 bytes of ones
        (bytes(range(32)), 0x46DD794E),  # incrementing 0x00..0x1f
        (bytes(range(31, -1, -1)), 0x113FDB5C),  # decrementing 0x1f..0x00
    ],
)
def test_rfc3720_crc32c(data: bytes, crc: int) -> None:
    assert crc32c(data) == crc


def _bitwise_reflected(data: bytes, poly: int, init: int) -> int:
    crc = init
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _bitwise_t10(data: bytes, init: int) -> int:
    crc = init
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8BB7) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def test_the_native_crcs_are_in_use() -> None:
    # isal and fastcrc are dependencies: CI must not silently run the fallback
    assert NATIVE_CRCS


@pytest.mark.parametrize("seed", [0, 1, 0xFFFF, 0x12345678, 0xFFFFFFFF])
def test_native_and_table_crcs_agree(seed: int) -> None:
    rng = random.Random(seed)
    for n in (0, 1, 3, 8, 63, 512, 4096, 4097):
        data = rng.randbytes(n)
        assert crc32c(data, seed) == crc32c_table(data, seed)
        assert crc16_t10dif(data, seed & 0xFFFF) == crc16_t10dif_table(data, seed & 0xFFFF)
        assert crc32c(memoryview(data), seed) == crc32c_table(data, seed)


@pytest.mark.parametrize("seed", [0, 0xFFFFFFFF])
def test_crc32_seeds_are_the_initial_register(seed: int) -> None:
    rng = random.Random(seed)
    for n in (0, 1, 7, 512, 4096):
        data = rng.randbytes(n)
        assert crc32(data, seed) == _bitwise_reflected(data, 0xEDB88320, seed)
        assert crc32c(data, seed) == _bitwise_reflected(data, 0x82F63B78, seed)


@pytest.mark.parametrize("seed", [0, 0xFFFF])
def test_t10dif_guard_matches_bitwise(seed: int) -> None:
    rng = random.Random(seed)
    for n in (0, 1, 8, 512):
        data = rng.randbytes(n)
        assert crc16_t10dif(data, seed) == _bitwise_t10(data, seed)


def test_t10dif_field_layout_and_checks() -> None:
    dom = SigDomain(SigKind.T10DIF, 512, 0, app_tag=0xABCD, ref_tag=0x01234567, ref_remap=True)
    data = bytes(range(256)) * 2
    fld = dom.field(data, 3)
    assert fld[:2] == crc16_t10dif(data).to_bytes(2, "big")
    assert fld[2:4] == b"\xab\xcd"
    assert fld[4:] == (0x01234567 + 3).to_bytes(4, "big")  # REF_REMAP: + block index
    assert dom.check(fld, data, 3, 0xFF) is None
    # each part is reported in T10 order: guard, application tag, reference tag
    bad = bytearray(fld)
    bad[1] ^= 1
    bad[3] ^= 1
    bad[7] ^= 1
    assert dom.check(bytes(bad), data, 3, 0xFF)[0] is SigErrType.BAD_GUARD  # type: ignore[index]
    assert dom.check(bytes(bad), data, 3, 0x3F)[0] is SigErrType.BAD_APPTAG  # type: ignore[index]
    err = dom.check(bytes(bad), data, 3, 0x0F)
    assert err == (SigErrType.BAD_REFTAG, 0x01234567 + 3 ^ 1, 0x01234567 + 3)
    # a mask bit selects one byte: bit 7 the first byte, bit 0 the eighth
    assert dom.check(bytes(bad), data, 3, 0x80) is None  # guard byte 0 is intact
    assert dom.check(bytes(bad), data, 3, 0x40) is not None


def test_t10dif_escapes() -> None:
    data = bytes(512)
    escaped_app = bytes(8)[:2] + b"\xff\xff" + bytes(4)
    escaped_both = bytes(2) + b"\xff" * 6
    app = SigDomain(SigKind.T10DIF, 512, escape=Escape.APP)
    both = SigDomain(SigKind.T10DIF, 512, escape=Escape.APP_REF)
    plain = SigDomain(SigKind.T10DIF, 512)
    assert app.check(escaped_app, data, 0, 0xFF) is None
    assert both.check(escaped_app, data, 0, 0xFF) is not None  # needs ref 0xFFFFFFFF too
    assert both.check(escaped_both, data, 0, 0xFF) is None
    assert plain.check(escaped_both, data, 0, 0xFF) is not None


def test_crc_field_is_big_endian() -> None:
    dom = SigDomain(SigKind.CRC32C, 512, 0xFFFFFFFF)
    assert dom.field(CHECK, 0) == (0xE3069283).to_bytes(4, "big")
    err = dom.check(bytes(4), CHECK, 0, 0xF0)
    assert err == (SigErrType.BAD_GUARD, 0, 0xE3069283)
    assert dom.check(bytes(4), CHECK, 0, 0x0F) is None  # no CRC byte selected
