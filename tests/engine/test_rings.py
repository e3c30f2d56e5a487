"""The rings (engine/rings.py): one implementation, checked on both slot stores.

Every test runs twice: with slots of Python objects (the device and the
application in one process) and with the byte layouts in a shared memfd
(the device service, or a C driver).  The semantics must not differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from softverbs.engine.rings import (
    CQE,
    CQE_SIZE,
    HEADER_SIZE,
    REASON_BYTES,
    WQ_RQ,
    WQ_SQ,
    WQ_SRQ,
    WR_DRIVER1,
    CompletionRing,
    CQEntry,
    CQESlots,
    RecvWQE,
    SendWQE,
    SharedRecvRing,
    SharedRegion,
    WorkRing,
    local_cq,
    local_srq,
    local_work_ring,
    recv_slot_size,
    send_slot_size,
    shared_cq,
    shared_srq,
    shared_work_ring,
)
from softverbs.enums import IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR, IBV_WR_SEND

OPCODES = frozenset({IBV_WR_SEND, WR_DRIVER1})


def _shared_sq(size: int) -> WorkRing:
    slot = send_slot_size(2, 16)
    return shared_work_ring(SharedRegion(64 + size * slot), size, slot, True, OPCODES)


def _shared_rq(size: int) -> WorkRing:
    slot = recv_slot_size(2)
    return shared_work_ring(SharedRegion(64 + size * slot), size, slot, False)


def _shared_srq(size: int, max_sge: int = 2) -> SharedRecvRing:
    slot = recv_slot_size(2)
    return shared_srq(SharedRegion(64 + size * slot), size, slot, max_sge)


def _shared_cq(capacity: int) -> CompletionRing:
    return shared_cq(SharedRegion(64 + capacity * 128), capacity)


STORES = {
    "objects": (local_work_ring, local_work_ring, local_srq, local_cq),
    "shared": (_shared_sq, _shared_rq, _shared_srq, _shared_cq),
}


@pytest.fixture(params=sorted(STORES))
def make(request: pytest.FixtureRequest) -> tuple[Callable[..., Any], ...]:
    return STORES[request.param]


def _send(wr_id: int, length: int = 8) -> SendWQE:
    return SendWQE(wr_id, IBV_WR_SEND, True, [(0x1000 + wr_id, length, 7)], length)


def _recv(wr_id: int) -> RecvWQE:
    return RecvWQE(wr_id, [(0x2000, 64, 9)], 64)


# --- send and receive queues ----------------------------------------------------------


def test_post_ring_fetch(make: Any) -> None:
    sq = make[0](4)
    for i in range(3):
        sq.push(_send(i))
    assert sq.pi == 3 and sq.used == 3 and sq.db == 0
    assert sq.ring(2) and not sq.ring(2)
    assert sq.latch() == 2 and sq.db == 2
    assert [sq.get(i).wr_id for i in range(2)] == [0, 1]
    assert sq.get(1).sges == [(0x1001, 8, 7)]
    assert sq.latch(everything=True) == 1 and sq.get(2).wr_id == 2


def test_fetched_wqes_are_the_devices_copies(make: Any) -> None:
    sq = make[0](4)
    sq.push(_send(1))
    sq.ring(1)
    sq.latch()
    fetched = sq.get(0)
    sq.push(_send(99))  # the application goes on writing
    assert sq.get(0) is fetched and fetched.wr_id == 1


def test_slots_come_back_only_when_polled(make: Any) -> None:
    sq = make[0](2)
    sq.push(_send(1))
    sq.push(_send(2))
    assert sq.used == 2  # full: the device's progress does not free slots
    sq.release(0)
    assert sq.used == 1
    sq.release(0)  # an earlier index again frees nothing more
    assert sq.used == 1
    sq.release(1)
    assert sq.used == 0


def test_release_rebuilds_the_index_from_32_bits(make: Any) -> None:
    sq = make[0](4)
    base = (1 << 32) + 5
    sq.hdr[sq.PI] = base
    sq.ci = base - 2
    sq.release((base - 1) & 0xFFFFFFFF)
    assert sq.ci == base


def test_a_lying_doorbell_is_bounded(make: Any) -> None:
    sq = make[0](4)
    sq.push(_send(1))
    sq.hdr[sq.DB] = 1 << 60  # far beyond anything posted
    assert sq.latch() == 1 and sq.db == 1
    sq.hdr[sq.PI] = 1 << 60  # pi lies too: at most one ring's worth per fetch
    sq.latch()
    assert sq.db == 1 + 4
    sq.hdr[sq.DB] = 0  # and never backwards
    assert sq.latch() == 0 and sq.db == 5


def test_reset_discards_and_forgets(make: Any) -> None:
    sq = make[0](4)
    for i in range(3):
        sq.push(_send(i))
    sq.ring(1)
    sq.latch()
    sq.discard()  # the device drops what was posted, unseen
    assert sq.db == 3
    sq.forget()  # and the application's slots are all free
    assert sq.used == 0
    sq.push(_send(7))
    sq.ring(sq.pi)
    assert sq.latch() == 1 and sq.get(3).wr_id == 7


def test_state_is_published_by_the_device(make: Any) -> None:
    sq = make[0](2)
    assert sq.published_state() is None
    sq.publish_state(3)
    assert sq.published_state() == 3


def test_receive_queue(make: Any) -> None:
    rq = make[1](2)
    rq.push(_recv(5))
    rq.ring(rq.pi)
    rq.latch()
    got = rq.get(0)
    assert (got.wr_id, got.sges, got.length) == (5, [(0x2000, 64, 9)], 64)


# every field a send slot carries (SendWQEHeader), with values no default has
_FIELDS = dict(imm=0x11223344, inv_rkey=0x55, rkey=0x66, xrc_srqn=0x77, remote_addr=1 << 63,
               compare_add=(1 << 64) - 1, swap=0x99, ah=0xAA, remote_qpn=0xBB,
               remote_qkey=0xCC, bind_mw=0xDD, bind_mr=0xEE, bind_rkey=0xFF, bind_addr=0x123,
               bind_length=0x456, bind_access=0x7, driver_op=0x8, caller=0x9ABC)  # fmt: skip


@pytest.mark.parametrize("sges", [[], [(0x1000, 8, 7)], [(0x1000, 8, 7), (1 << 63, 3, 9)]])
@pytest.mark.parametrize("inline", [None, b"inline!"])
def test_a_send_wqe_reads_back_field_for_field(make: Any, sges: list[Any],
                                               inline: bytes | None) -> None:  # fmt: skip
    """What the device fetches is what was posted, whatever the number of SGEs
    (the packed store loads each field through the typed view of its width) and
    with inline data."""
    sq = make[0](2)
    length = len(inline) if inline is not None else sum(s[1] for s in sges)
    w = SendWQE(42, IBV_WR_SEND, False, list(sges), length, inline, True, True, **_FIELDS)
    sq.push(w)
    sq.ring(1)
    sq.latch()
    got = sq.get(0)
    assert (got.wr_id, got.opcode, got.signaled, got.fence, got.se) == (
        42, IBV_WR_SEND, False, True, True)  # fmt: skip
    assert (got.sges, got.length, got.inline) == (sges, length, inline)
    assert {k: getattr(got, k) for k in _FIELDS} == _FIELDS
    assert (got.route, got.bind, got.local_op, got.reason) == (None, None, None, "")


@pytest.mark.parametrize("sges", [[], [(0x2000, 64, 9)], [(0x2000, 64, 9), (1 << 63, 5, 3)]])
def test_a_recv_wqe_reads_back_field_for_field(make: Any, sges: list[Any]) -> None:
    rq = make[1](2)
    rq.push(RecvWQE(7, list(sges), sum(s[1] for s in sges)))
    rq.ring(1)
    rq.latch()
    got = rq.get(0)
    assert (got.wr_id, got.sges, got.length, got.bad) == (7, sges, sum(s[1] for s in sges), "")


def test_a_slot_too_small_for_a_header_and_an_sge_is_refused() -> None:
    for send, header in ((True, 128), (False, 16)):  # a header, without room for an SGE
        with pytest.raises(ValueError, match="smaller than a header and one SGE"):
            shared_work_ring(SharedRegion(64 + 4 * 256), 4, header, send, OPCODES)


def test_a_fetch_hook_can_refuse_a_wqe(make: Any) -> None:
    sq = make[0](2)
    sq.fetch = lambda w: "no such address handle" if w.wr_id == 2 else None
    sq.push(_send(1))
    sq.push(_send(2))
    sq.ring(2)
    sq.latch()
    bad = sq.get(1)
    assert sq.get(0).opcode == IBV_WR_SEND
    assert (bad.opcode, bad.wr_id, bad.reason) == (WR_DRIVER1, 2, "no such address handle")


def test_a_scribbled_slot_becomes_a_failing_wqe() -> None:
    sq = _shared_sq(2)
    sq.push(_send(1))
    off = sq.slots.offset(0)  # type: ignore[attr-defined]
    sq.slots.buf[off + 8] = 200  # type: ignore[attr-defined]  # an opcode no QP executes
    sq.ring(1)
    sq.latch()
    bad = sq.get(0)
    assert bad.opcode == WR_DRIVER1 and bad.wr_id == 1 and "opcode 200" in bad.reason


# --- shared receive queues -------------------------------------------------------------


def test_srq_take_limit_and_counts(make: Any) -> None:
    srq = make[2](4, 2)
    fired: list[SharedRecvRing] = []
    srq.on_limit = fired.append
    for i in range(4):
        srq.post(_recv(i))
    assert srq.outstanding == 4 and srq.available() == 4
    srq.set_limit(3)
    assert srq.take().wr_id == 0 and not fired  # 3 left: not below the limit
    assert srq.take().wr_id == 1 and fired == [srq]  # 2 left < 3: once
    assert srq.armed_limit == 0
    srq.take()
    srq.take()
    assert srq.take() is None
    srq.release(0)
    srq.discarded(2)  # two taken WQEs were dropped when their QP was reset
    assert srq.outstanding == 1


def test_srq_resize_keeps_what_was_not_taken(make: Any) -> None:
    srq = make[2](2, 2)
    srq.post(_recv(1))
    srq.post(_recv(2))
    srq.take()
    bigger = make[2](8, 2)
    srq.move_to(bigger.slots, bigger.hdr, 8)
    assert srq.size == 8
    srq.post(_recv(3))
    assert [srq.take().wr_id, srq.take().wr_id] == [2, 3]


# --- completion queues ---------------------------------------------------------------------


def _cqe(wr_id: int, qpn: int = 0x11, status: int = IBV_WC_SUCCESS, kind: int = WQ_SQ) -> CQE:
    c = CQE(wr_id, status, 0, qpn, 8)
    c.wq_kind, c.wq_handle, c.index = kind, 3, wr_id
    c.reason = "" if status == IBV_WC_SUCCESS else "flushed: the QP is in the error state"
    return c


def test_cq_push_take(make: Any) -> None:
    cq = make[3](4)
    for i in range(3):
        assert cq.push(_cqe(i))
    assert cq.waiting() == 3 and cq.pending() == 3
    got = cq.take(2)
    assert [(c.wr_id, c.wq_kind, c.wq_handle, c.index) for c in got] == [(0, WQ_SQ, 3, 0),
                                                                          (1, WQ_SQ, 3, 1)]
    assert cq.pending() == 1 and cq.waiting() == 1


def test_cq_overrun(make: Any) -> None:
    cq = make[3](2)
    assert cq.push(_cqe(1)) and cq.push(_cqe(2))
    assert not cq.push(_cqe(3))  # full, never polled: an overrun
    assert cq.error and cq.in_error
    cq.take(2)
    assert not cq.push(_cqe(4)), "a CQ in error takes nothing more"


def test_a_lying_ci_does_not_hide_an_overrun(make: Any) -> None:
    cq = make[3](2)
    cq.push(_cqe(1))
    cq.push(_cqe(2))
    cq.hdr[cq.CI] = 1 << 62  # claims to have polled far more than was written
    assert not cq.push(_cqe(3)) or cq.waiting() <= cq.capacity


def _full_cqe(wr_id: int, reason: str) -> CQE:
    """A CQE with every field set to a value of its own."""
    c = CQE(wr_id, 12, 0x83, 0x123456, 0x7FFFFFFF, 0x3F, 0xDEADBEEF)
    c.vendor_err, c.src_qp, c.pkey_index, c.slid, c.sl = 0x244, 0xABCDEF, 0x7FFF, 0xBEEF, 9
    c.wq_kind, c.wq_handle, c.index, c.solicited, c.dead = WQ_SRQ, 0x1234, 0x9876543, True, True
    c.reason = reason
    return c


def test_cqe_slot_bytes_are_the_records() -> None:
    """Each field stored through its typed view lands where CQEntry (and so the C
    library's struct) has it: the slot's bytes are the record's packing, the reason
    cut to its bytes and NUL-padded; a later CQE with a shorter reason in the same
    slot leaves nothing of the longer one; reading it back gives every field."""
    region = SharedRegion(HEADER_SIZE + 2 * CQE_SIZE)
    slots = CQESlots(region, 2)
    flags = 0x03  # CQE_DEAD | CQE_SOLICITED
    for wr_id, reason in ((0xFFFFFFFFFFFFFFFF, "é" * 60), (7, "short"), (8, "")):
        c = _full_cqe(wr_id, reason)
        slots.write(0, c)
        want = CQEntry(wr_id, 12, 0x83, 0x244, 0x7FFFFFFF, 0xDEADBEEF, 0x123456, 0xABCDEF,
                       0x3F, 0x7FFF, 0xBEEF, 9, 0, WQ_SRQ, flags, 0x1234, 0x9876543,
                       reason.encode()[:REASON_BYTES]).pack()  # fmt: skip
        assert bytes(region.view[HEADER_SIZE : HEADER_SIZE + CQE_SIZE]) == want
        got = slots.read(0)
        assert (got.wr_id, got.status, got.opcode, got.qp_num, got.byte_len, got.imm) == (
            wr_id, 12, 0x83, 0x123456, 0x7FFFFFFF, 0xDEADBEEF)
        assert (got.src_qp, got.pkey_index, got.slid, got.sl, got.wq_kind, got.index) == (
            0xABCDEF, 0x7FFF, 0xBEEF, 9, WQ_SRQ, 0x9876543)
        assert got.reason == reason.encode()[:REASON_BYTES].decode("utf-8", "replace")
    assert bytes(region.view[HEADER_SIZE + CQE_SIZE :]) == bytes(CQE_SIZE), "the next slot"
    region.close()


@pytest.mark.parametrize("field,value", [("qp_num", 1 << 32), ("slid", 1 << 16),
                                         ("sl", 256), ("status", -1), ("wr_id", 1 << 64)])
def test_a_cqe_field_that_does_not_fit_is_an_error(field: str, value: int) -> None:
    """Compiled and interpreted alike: ValueError, naming the CQE."""
    region = SharedRegion(HEADER_SIZE + CQE_SIZE)
    slots = CQESlots(region, 1)
    c = _full_cqe(5, "")
    setattr(c, field, value)
    with pytest.raises(ValueError, match="does not fit its slot"):
        slots.write(0, c)
    region.close()


def test_slots_of_a_closed_region_raise() -> None:
    """The region unmaps at close (compiled, the slots' typed views let go of it
    first), and its slots then fail with an exception, never touching the pages."""
    region = SharedRegion(HEADER_SIZE + 2 * CQE_SIZE)
    cq = shared_cq(region, 2)
    cq.push(_cqe(1))
    region.close()
    assert region.mm.closed
    with pytest.raises((IndexError, ValueError)):
        cq.slots.write(1, _cqe(2))
    with pytest.raises((IndexError, ValueError)):
        cq.slots.read(0)


def test_arming_fires_once(make: Any) -> None:
    cq = make[3](8)
    events: list[int] = []
    cq.notify = lambda: events.append(1)
    cq.push(_cqe(1))
    assert events == []  # not armed
    cq.arm(solicited_only=False)
    cq.push(_cqe(2))
    cq.push(_cqe(3))
    assert events == [1]  # one event per arming
    cq.arm(solicited_only=True)
    cq.push(_cqe(4))  # neither solicited nor failed
    assert events == [1]
    cq.push(_cqe(5, status=IBV_WC_WR_FLUSH_ERR))
    assert events == [1, 1]


def test_the_device_fences_between_publishing_a_cqe_and_reading_the_arm(make: Any) -> None:
    """The device stores pi then loads arm; the application stores arm then loads
    pi (docs/rings.md, Arming): each side fences between the two, or both could
    miss the other's store and the application sleep for an event never sent.
    The device fences where another process arms the CQ (it sets ``fence``)."""
    cq = make[3](8)
    seen: list[tuple[int, int]] = []  # (pi, arm) at each fence
    cq.push(_cqe(1))  # no fence: one process
    cq.fence = lambda: seen.append((int(cq.hdr[cq.PI]), int(cq.hdr[cq.ARM])))
    cq.push(_cqe(2))
    cq.arm(solicited_only=False)
    cq.push(_cqe(3))
    assert seen == [(2, 0), (3, 2)], "after the CQE is published, before the arm is read"


def test_purge_marks_a_qps_cqes_dead(make: Any) -> None:
    cq = make[3](8)
    cq.push(_cqe(1, qpn=0x11))
    cq.push(_cqe(2, qpn=0x12, kind=WQ_SRQ))
    cq.push(_cqe(3, qpn=0x12, kind=WQ_RQ))
    cq.push(_cqe(4, qpn=0x11))
    seen: list[int] = []
    cq.purge(0x12, lambda c: seen.append(c.wr_id))
    assert seen == [2, 3]
    assert [c.wr_id for c in cq.take(8)] == [1, 4]


def test_cq_resize_moves_what_was_not_polled(make: Any) -> None:
    cq = make[3](2)
    cq.push(_cqe(1))
    cq.push(_cqe(2))
    cq.take(1)
    bigger = make[3](8)
    cq.move_to(bigger.slots, bigger.hdr, 8)
    for i in range(3, 8):
        assert cq.push(_cqe(i))
    assert [c.wr_id for c in cq.take(16)] == [2, 3, 4, 5, 6, 7]


def test_a_device_takes_over_a_scribbled_header() -> None:
    """The service builds its rings over a header the application wrote: words
    no ring can reach (here 2**64 - 1) start the device's indices at 0 -- the
    same in both modes (compiled, the indices are C integers) -- and the rings
    work from there."""
    huge = (1 << 64) - 1
    regions = [SharedRegion(64 + 4 * send_slot_size(2, 16)), SharedRegion(64 + 4 * 128),
               SharedRegion(64 + 4 * recv_slot_size(2))]  # fmt: skip
    for region in regions:
        words = region.words()
        for i in range(len(words)):
            words[i] = huge
    sq = shared_work_ring(regions[0], 4, send_slot_size(2, 16), True, OPCODES)
    cq = shared_cq(regions[1], 4)
    srq = shared_srq(regions[2], 4, recv_slot_size(2), 2)
    assert (sq.seen_db, cq.tail, cq.seen_ci, cq.fired, srq.seen_taken) == (0, 0, 0, 0, 0)
    assert sq.latch() == 4  # pi and db claim 2**64 - 1: one ring's worth, of scribbled slots
    assert all(sq.get(i).opcode == WR_DRIVER1 and sq.get(i).reason for i in range(4))
    cq.hdr[cq.ERROR] = 0
    cq.error = False
    assert cq.push(_cqe(1)) and cq.hdr[cq.PI] == 1
    assert srq.available() == 4  # pi claims 2**64 - 1: at most one ring's worth
