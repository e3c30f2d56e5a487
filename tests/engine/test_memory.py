"""KeyTable: the engine's only door to memory (softverbs.engine.memory).

Local and remote resolution, protection domains, bounds (off by one at both
ends), access rights, stale key bytes, type 1 and type 2 memory windows, and
that a returned view covers exactly the requested bytes.
"""

from __future__ import annotations

import functools
import random

import pytest

from softverbs.engine.memory import KEY_BYTE_MASK, KEY_INDEX_SHIFT, KeyTable, MemKey, MemKind
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
)

ADDR = 0x7F00_0000_1000
SIZE = 4096
RW = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE
ALL = RW | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND
READ, WRITE, ATOMIC = IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_ATOMIC
QPN, OTHER_QPN = 0x11, 0x12


class Env:
    def __init__(self, access: int = ALL, size: int = SIZE) -> None:
        self.keys = KeyTable(functools.partial(random.Random(0).getrandbits, 8))
        self.pd = object()
        self.other_pd = object()
        # guard bytes on both sides: the region is mem[16:16+size]
        self.backing = bytearray(b"\xee" * (size + 32))
        self.view = memoryview(self.backing)[16 : 16 + size]
        self.mr = self.keys.register(MemKind.MR, self.pd, self.view, ADDR, access)

    def mw(self, kind: MemKind, pd: object | None = None) -> MemKey:
        return self.keys.register(kind, self.pd if pd is None else pd, None, 0, 0)

    def guards_intact(self) -> bool:
        return self.backing[:16] == b"\xee" * 16 and self.backing[-16:] == b"\xee" * 16


def bumped(key: int) -> int:
    return (key & ~KEY_BYTE_MASK) | ((key + 1) & KEY_BYTE_MASK)


def is_err(x: object) -> bool:
    return isinstance(x, str)


# --- regions: local access --------------------------------------------------------------------


def test_local_resolves_exact_range() -> None:
    env = Env()
    v = env.keys.local(env.mr.key, env.pd, ADDR + 100, 50, True)
    assert isinstance(v, memoryview)
    assert len(v) == 50
    v[:] = b"\x01" * 50
    assert env.view[100:150] == b"\x01" * 50
    assert env.view[99] == 0xEE and env.view[150] == 0xEE, "wrote outside the requested bytes"
    assert env.guards_intact()


@pytest.mark.parametrize(
    "offset,length,ok",
    [
        (0, SIZE, True),  # the whole region
        (-1, 1, False),  # one byte before
        (-1, SIZE, False),
        (0, SIZE + 1, False),  # one byte past the end
        (1, SIZE, False),
        (SIZE - 1, 1, True),  # the last byte
        (SIZE - 1, 2, False),
        (SIZE, 0, True),  # empty, at the end
        (SIZE + 1, 0, False),  # empty, past the end
        (0, 0, True),
        (-1, 0, False),
        (10, -1, False),  # negative length
    ],
)
def test_local_bounds(offset: int, length: int, ok: bool) -> None:
    env = Env()
    got = env.keys.local(env.mr.key, env.pd, ADDR + offset, length, False)
    assert is_err(got) != ok, got
    if ok:
        assert isinstance(got, memoryview) and len(got) == length
    else:
        assert "outside" in str(got)


def test_local_pd_mismatch() -> None:
    env = Env()
    got = env.keys.local(env.mr.key, env.other_pd, ADDR, 8, False)
    assert is_err(got) and "protection domain" in str(got)


def test_local_write_needs_local_write() -> None:
    env = Env(access=IBV_ACCESS_REMOTE_READ)
    assert isinstance(env.keys.local(env.mr.key, env.pd, ADDR, 8, False), memoryview)
    got = env.keys.local(env.mr.key, env.pd, ADDR, 8, True)
    assert is_err(got) and "IBV_ACCESS_LOCAL_WRITE" in str(got)


def test_local_unknown_and_stale_keys() -> None:
    env = Env()
    assert is_err(env.keys.local(0, env.pd, ADDR, 8, False))
    assert is_err(env.keys.local(env.mr.key + (99 << KEY_INDEX_SHIFT), env.pd, ADDR, 8, False))
    stale = bumped(env.mr.key)
    got = env.keys.local(stale, env.pd, ADDR, 8, False)
    assert is_err(got) and "not a registered" in str(got)


def test_local_rejects_window_keys() -> None:
    env = Env()
    mw = env.mw(MemKind.MW1)
    assert env.keys.bind(mw, env.mr, mw.key, ADDR, 64, READ, QPN, env.pd) is None
    got = env.keys.local(mw.key, env.pd, ADDR, 8, False)
    assert is_err(got), "a window's rkey is not an lkey"


def test_unregister_kills_the_key_and_a_new_registration_gets_a_new_one() -> None:
    env = Env()
    old = env.mr.key
    env.keys.unregister(env.mr)
    assert is_err(env.keys.local(old, env.pd, ADDR, 8, False))
    assert is_err(env.keys.remote(old, env.pd, QPN, ADDR, 8, READ))
    again = env.keys.register(MemKind.MR, env.pd, env.view, ADDR, ALL)
    assert again.key != old
    assert is_err(env.keys.local(old, env.pd, ADDR, 8, False)), "the old key must stay dead"


def test_keys_are_distinct() -> None:
    keys = KeyTable(functools.partial(random.Random(0).getrandbits, 8))
    pd = object()
    buf = memoryview(bytearray(16))
    got = {keys.register(MemKind.MR, pd, buf, 0, 0).key for _ in range(600)}
    assert len(got) == 600


def test_zero_based_region() -> None:
    keys = KeyTable(functools.partial(random.Random(0).getrandbits, 8))
    pd = object()
    mem = bytearray(SIZE)
    mr = keys.register(MemKind.MR, pd, memoryview(mem), ADDR, ALL | IBV_ACCESS_ZERO_BASED)
    v = keys.remote(mr.key, pd, QPN, 0, SIZE, READ)
    assert isinstance(v, memoryview) and len(v) == SIZE
    assert is_err(keys.remote(mr.key, pd, QPN, ADDR, 8, READ))
    assert is_err(keys.remote(mr.key, pd, QPN, SIZE - 7, 8, READ))


# --- regions: remote access ----------------------------------------------------------------


@pytest.mark.parametrize("right", [READ, WRITE, ATOMIC])
def test_remote_rights(right: int) -> None:
    for granted in (READ, WRITE | IBV_ACCESS_LOCAL_WRITE, ATOMIC | IBV_ACCESS_LOCAL_WRITE):
        env = Env(access=granted)
        got = env.keys.remote(env.mr.key, env.pd, QPN, ADDR, 8, right)
        if granted & right:
            assert isinstance(got, memoryview)
        else:
            assert is_err(got) and "does not grant" in str(got), got


def test_remote_local_write_alone_grants_nothing_remote() -> None:
    env = Env(access=IBV_ACCESS_LOCAL_WRITE)
    for right in (READ, WRITE, ATOMIC):
        assert is_err(env.keys.remote(env.mr.key, env.pd, QPN, ADDR, 8, right))


@pytest.mark.parametrize(
    "offset,length,ok",
    [
        (0, SIZE, True),
        (-1, 8, False),
        (SIZE - 8, 8, True),
        (SIZE - 7, 8, False),
        (0, SIZE + 1, False),
        (SIZE, 0, True),
    ],
)
def test_remote_bounds(offset: int, length: int, ok: bool) -> None:
    env = Env()
    got = env.keys.remote(env.mr.key, env.pd, QPN, ADDR + offset, length, WRITE)
    assert is_err(got) != ok, got


def test_remote_pd_and_stale_key() -> None:
    env = Env()
    assert is_err(env.keys.remote(env.mr.key, env.other_pd, QPN, ADDR, 8, READ))
    assert is_err(env.keys.remote(bumped(env.mr.key), env.pd, QPN, ADDR, 8, READ))
    assert is_err(env.keys.remote(0xFFFFFFFF, env.pd, QPN, ADDR, 8, READ))


def test_remote_view_covers_exactly_the_request() -> None:
    env = Env()
    for off, n in ((0, 1), (0, SIZE), (SIZE - 1, 1), (123, 456)):
        env.view[:] = b"\x00" * SIZE
        v = env.keys.remote(env.mr.key, env.pd, QPN, ADDR + off, n, WRITE)
        assert isinstance(v, memoryview) and len(v) == n and v.nbytes == n
        v[:] = b"\x5a" * n
        assert env.view[off : off + n] == b"\x5a" * n
        assert env.view.tobytes().count(0x5A) == n, "bytes outside the request changed"
        assert env.guards_intact()
        with pytest.raises((ValueError, IndexError)):
            v[n : n + 1] = b"\x01"  # the view cannot grow past the request


# --- type 1 windows ---------------------------------------------------------------------


def test_mw1_unbound_is_unusable() -> None:
    env = Env()
    mw = env.mw(MemKind.MW1)
    assert not mw.valid
    assert is_err(env.keys.remote(mw.key, env.pd, QPN, ADDR, 8, READ))


def test_mw1_bind_limits_range_and_rights() -> None:
    env = Env()
    mw = env.mw(MemKind.MW1)
    new = bumped(mw.key)
    assert env.keys.bind(mw, env.mr, new, ADDR + 256, 512, READ, QPN, env.pd) is None
    assert mw.key == new and mw.valid and env.mr.binds == 1
    ok = env.keys.remote(new, env.pd, QPN, ADDR + 256, 512, READ)
    assert isinstance(ok, memoryview) and len(ok) == 512
    # outside the window but inside the region
    assert is_err(env.keys.remote(new, env.pd, QPN, ADDR + 255, 8, READ))
    assert is_err(env.keys.remote(new, env.pd, QPN, ADDR + 256 + 505, 8, READ))
    assert isinstance(env.keys.remote(new, env.pd, QPN, ADDR + 256 + 504, 8, READ), memoryview)
    # rights of the window, not of the region
    assert is_err(env.keys.remote(new, env.pd, QPN, ADDR + 256, 8, WRITE))
    # type 1: checked against the PD, any QP of it may use it
    assert isinstance(env.keys.remote(new, env.pd, OTHER_QPN, ADDR + 256, 8, READ), memoryview)
    assert is_err(env.keys.remote(new, env.other_pd, QPN, ADDR + 256, 8, READ))


def test_mw1_view_covers_exactly_the_window() -> None:
    env = Env()
    env.view[:] = b"\x00" * SIZE
    mw = env.mw(MemKind.MW1)
    assert env.keys.bind(mw, env.mr, mw.key, ADDR + 1000, 100, WRITE, QPN, env.pd) is None
    v = env.keys.remote(mw.key, env.pd, QPN, ADDR + 1000, 100, WRITE)
    assert isinstance(v, memoryview)
    v[:] = b"\x77" * 100
    assert env.view[1000:1100] == b"\x77" * 100
    assert env.view.tobytes().count(0x77) == 100
    assert env.guards_intact()


def test_mw1_rebind_moves_the_key() -> None:
    env = Env()
    mw = env.mw(MemKind.MW1)
    k1, k2 = bumped(mw.key), bumped(bumped(mw.key))
    assert env.keys.bind(mw, env.mr, k1, ADDR, 64, READ, QPN, env.pd) is None
    assert env.keys.bind(mw, env.mr, k2, ADDR + 64, 64, READ, QPN, env.pd) is None
    assert env.mr.binds == 1, "re-binding does not count twice"
    assert is_err(env.keys.remote(k1, env.pd, QPN, ADDR, 8, READ)), "the old rkey is stale"
    assert isinstance(env.keys.remote(k2, env.pd, QPN, ADDR + 64, 8, READ), memoryview)


def test_mw1_zero_length_bind_unbinds() -> None:
    env = Env()
    mw = env.mw(MemKind.MW1)
    assert env.keys.bind(mw, env.mr, mw.key, ADDR, 64, READ, QPN, env.pd) is None
    k = bumped(mw.key)
    assert env.keys.bind(mw, env.mr, k, ADDR, 0, READ, QPN, env.pd) is None
    assert not mw.valid
    assert is_err(env.keys.remote(k, env.pd, QPN, ADDR, 0, READ))


def test_mw1_cannot_be_invalidated() -> None:
    env = Env()
    mw = env.mw(MemKind.MW1)
    assert env.keys.bind(mw, env.mr, mw.key, ADDR, 64, READ, QPN, env.pd) is None
    err = env.keys.invalidate(mw.key, env.pd)
    assert err is not None and "type 2" in err


@pytest.mark.parametrize("kind", [MemKind.MW1, MemKind.MW2])
def test_bind_rules(kind: MemKind) -> None:
    env = Env(access=RW)  # no MW_BIND
    mw = env.mw(kind)
    assert "MW_BIND" in (env.keys.bind(mw, env.mr, mw.key, ADDR, 64, READ, QPN, env.pd) or "")
    env = Env(access=IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ)  # no LOCAL_WRITE
    mw = env.mw(kind)
    for right in (WRITE, ATOMIC):
        err = env.keys.bind(mw, env.mr, mw.key, ADDR, 64, right, QPN, env.pd)
        assert err is not None and "LOCAL_WRITE" in err
    assert env.keys.bind(mw, env.mr, mw.key, ADDR, 64, READ, QPN, env.pd) is None
    env = Env()
    mw = env.mw(kind)
    # outside the region, off by one at either end
    assert env.keys.bind(mw, env.mr, mw.key, ADDR - 1, 64, READ, QPN, env.pd) is not None
    assert env.keys.bind(mw, env.mr, mw.key, ADDR + SIZE - 63, 64, READ, QPN, env.pd) is not None
    assert not mw.valid and env.mr.binds == 0, "a failed bind changes nothing"
    # PD: window, region and QP must agree
    other = env.mw(kind, pd=env.other_pd)
    assert env.keys.bind(other, env.mr, other.key, ADDR, 64, READ, QPN, env.pd) is not None
    assert env.keys.bind(mw, env.mr, mw.key, ADDR, 64, READ, QPN, env.other_pd) is not None
    # a window cannot be bound onto a window
    assert env.keys.bind(mw, env.mr, mw.key, ADDR + SIZE - 64, 64, READ, QPN, env.pd) is None
    mw2 = env.mw(kind)
    assert env.keys.bind(mw2, mw, mw2.key, ADDR, 8, READ, QPN, env.pd) is not None


# --- type 2 windows ---------------------------------------------------------------------


def bound_mw2(env: Env, qpn: int = QPN, right: int = READ | WRITE) -> MemKey:
    mw = env.mw(MemKind.MW2)
    assert not mw.valid
    err = env.keys.bind(mw, env.mr, bumped(mw.key), ADDR + 128, 256, right, qpn, env.pd)
    assert err is None, err
    return mw


def test_mw2_is_bound_to_one_qp() -> None:
    env = Env()
    mw = bound_mw2(env)
    assert isinstance(env.keys.remote(mw.key, env.pd, QPN, ADDR + 128, 256, READ), memoryview)
    got = env.keys.remote(mw.key, env.pd, OTHER_QPN, ADDR + 128, 8, READ)
    assert is_err(got) and "bound to QP" in str(got)


def test_mw2_bind_changes_only_the_key_byte() -> None:
    env = Env()
    mw = env.mw(MemKind.MW2)
    other_index = mw.key + (1 << KEY_INDEX_SHIFT)
    err = env.keys.bind(mw, env.mr, other_index, ADDR, 64, READ, QPN, env.pd)
    assert err is not None and "key byte" in err


def test_mw2_must_be_invalidated_before_rebinding() -> None:
    env = Env()
    mw = bound_mw2(env)
    k = mw.key
    err = env.keys.bind(mw, env.mr, bumped(k), ADDR, 64, READ, QPN, env.pd)
    assert err is not None and "invalidated" in err
    assert mw.key == k, "the refused bind left the window as it was"
    assert env.keys.invalidate(k, env.pd, QPN) is None
    assert env.mr.binds == 0
    assert env.keys.bind(mw, env.mr, bumped(k), ADDR, 64, READ, QPN, env.pd) is None
    assert env.mr.binds == 1
    assert is_err(env.keys.remote(k, env.pd, QPN, ADDR, 8, READ)), "old key stale"


def test_mw2_invalidation() -> None:
    env = Env()
    mw = bound_mw2(env)
    k = mw.key
    assert env.mr.binds == 1
    # SEND_WITH_INV from another QP may not invalidate it
    err = env.keys.invalidate(k, env.pd, OTHER_QPN)
    assert err is not None and "bound to QP" in err
    assert env.keys.invalidate(k, env.other_pd) is not None
    assert env.keys.invalidate(bumped(k), env.pd) is not None, "stale key"
    assert env.keys.invalidate(k, env.pd, QPN) is None
    assert not mw.valid and env.mr.binds == 0
    got = env.keys.remote(k, env.pd, QPN, ADDR + 128, 8, READ)
    assert is_err(got) and "invalidated" in str(got)
    err = env.keys.invalidate(k, env.pd)
    assert err is not None and "already invalid" in err


def test_invalidate_refuses_regions() -> None:
    env = Env()
    err = env.keys.invalidate(env.mr.key, env.pd)
    assert err is not None and "type 2" in err
    assert isinstance(env.keys.local(env.mr.key, env.pd, ADDR, 8, True), memoryview)


def test_mw2_zero_based() -> None:
    env = Env()
    mw = env.mw(MemKind.MW2)
    k = bumped(mw.key)
    assert env.keys.bind(mw, env.mr, k, ADDR + 64, 64, READ | IBV_ACCESS_ZERO_BASED, QPN,
                         env.pd) is None  # fmt: skip
    env.view[64:128] = bytes(range(64))
    v = env.keys.remote(k, env.pd, QPN, 0, 64, READ)
    assert isinstance(v, memoryview) and bytes(v) == bytes(range(64))
    assert is_err(env.keys.remote(k, env.pd, QPN, 1, 64, READ))
    assert is_err(env.keys.remote(k, env.pd, QPN, ADDR + 64, 8, READ))
