"""RC under random, seeded loss, duplication and reordering (property test).

Whatever the schedule (loss up to 30 %), an RC pair must deliver every
message exactly once, in order, with the right bytes, and complete every
signaled WR successfully.  The schedule comes from a seeded RNG in the test
fabric (:class:`engine_kit.SeededFaults`); a failing example prints its seed,
its rates and the faults it applied, so it can be replayed exactly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine_kit import BASE_B, Bench, SeededFaults
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from softverbs.engine.rings import SendWQE
from softverbs.enums import (
    IBV_QPS_RTS,
    IBV_WC_SUCCESS,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)

PMTU = 256
SLOT = 2048  #: bytes per message slot (largest message: 6 packets = 1536 bytes)
MAX_MSGS = 12
# B's memory: WRITE targets, READ sources, the atomic counter, receive buffers
B_WRITE, B_READ, B_COUNTER, B_RECV = 0, 24 * 1024, 60 * 1024, 64 * 1024
# A's memory: SEND/WRITE sources, READ destinations, atomic results
A_SRC, A_READ, A_ATOMIC = 0, 32 * 1024, 60 * 1024
MEM = 96 * 1024
COUNTER_START = 1 << 40

EXAMPLES = int(os.environ.get("SOFTVERBS_ENGINE_EXAMPLES", "300"))


@dataclass(frozen=True)
class Msg:
    kind: str  #: "send", "write", "read", "fadd"
    size: int  #: bytes (the addend for "fadd")
    signaled: bool


def data(i: int, n: int) -> bytes:
    return bytes(((i + 1) * 31 + j * 7) & 0xFF for j in range(n))


messages = st.lists(
    st.builds(
        Msg,
        kind=st.sampled_from(["send", "send", "write", "read", "fadd"]),
        size=st.integers(0, 6 * PMTU),
        signaled=st.booleans(),
    ),
    min_size=1,
    max_size=MAX_MSGS,
)


def run_schedule(
    msgs: list[Msg], faults: SeededFaults, start_psn: int = 0, late_recvs: int = 0
) -> None:
    """Post ``msgs``, run to the end, check.  The last ``late_recvs`` receives are
    posted only after 2 ms of virtual time, so the SENDs meet RNR NAKs first."""
    b = Bench(pmtu=PMTU, retry_cnt=7, rnr_retry=7, timeout=8, max_rd_atomic=4,
              max_dest_rd_atomic=4, policy=faults, mem_size=MEM, sq_psn=start_psn,
              min_rnr_timer=1)  # fmt: skip
    b.b.mem[B_COUNTER : B_COUNTER + 8] = COUNTER_START.to_bytes(8, "little")
    key = b.b.mr.key
    posted = []
    sends = []
    for i, msg in enumerate(msgs):
        slot = i * SLOT
        if msg.kind == "send":
            b.a.mem[A_SRC + slot : A_SRC + slot + msg.size] = data(i, msg.size)
            sends.append((i, 0))
            w = b.a.post_send(IBV_WR_SEND, A_SRC + slot, msg.size, signaled=msg.signaled)
        elif msg.kind == "write":
            b.a.mem[A_SRC + slot : A_SRC + slot + msg.size] = data(i, msg.size)
            w = b.a.post_send(IBV_WR_RDMA_WRITE, A_SRC + slot, msg.size, remote=BASE_B + slot,
                              rkey=key, signaled=msg.signaled)  # fmt: skip
        elif msg.kind == "read":
            b.b.mem[B_READ + slot : B_READ + slot + msg.size] = data(i, msg.size)
            w = b.a.post_send(IBV_WR_RDMA_READ, A_READ + slot, msg.size,
                              remote=BASE_B + B_READ + slot, rkey=key,
                              signaled=msg.signaled)  # fmt: skip
        else:
            w = b.a.post_send(IBV_WR_ATOMIC_FETCH_AND_ADD, A_ATOMIC + 8 * i, 8,
                              remote=BASE_B + B_COUNTER, rkey=key, compare_add=msg.size,
                              signaled=msg.signaled)  # fmt: skip
        posted.append(w)
    early = len(sends) - min(late_recvs, len(sends))
    for n, (i, _) in enumerate(sends[:early]):
        sends[n] = (i, b.b.post_recv(B_RECV + i * SLOT, SLOT).wr_id)
    if early < len(sends):
        b.run(max_time=0.002)
        for n, (i, _) in enumerate(sends[early:], start=early):
            sends[n] = (i, b.b.post_recv(B_RECV + i * SLOT, SLOT, now=b.now).wr_id)
    b.run()

    try:
        check(b, msgs, posted, sends)
    except AssertionError:
        print(f"to replay: run_schedule({msgs!r}, {faults.replay()}, "
              f"start_psn={start_psn:#x}, late_recvs={late_recvs})")
        print(faults.describe())
        print("last packets:\n" + "\n".join(b.trace().splitlines()[-40:]))
        print("counters a:", b.a.counters, "\ncounters b:", b.b.counters)
        raise


def check(b: Bench, msgs: list[Msg], posted: list[SendWQE], sends: list[tuple[int, int]]) -> None:
    # every signaled WR completes, successfully, in posting order; nothing else completes
    cqes = b.a.poll_send()
    assert [(c.wr_id, c.status) for c in cqes] == [
        (w.wr_id, IBV_WC_SUCCESS) for w in posted if w.signaled
    ], [(c.wr_id, c.status, c.reason) for c in cqes]
    assert b.a.qp.state == IBV_QPS_RTS and b.b.qp.state == IBV_QPS_RTS
    # SENDs: each exactly once, in order, with the right bytes
    recvs = b.b.poll_recv()
    assert [(c.wr_id, c.status) for c in recvs] == [(wr, IBV_WC_SUCCESS) for _, wr in sends]
    for (i, _), c in zip(sends, recvs, strict=True):
        slot = i * SLOT
        assert c.byte_len == msgs[i].size
        assert b.b.mem[B_RECV + slot : B_RECV + slot + c.byte_len] == data(i, c.byte_len)
    # WRITEs and READs: the right bytes at the right place
    total = COUNTER_START
    for i, msg in enumerate(msgs):
        slot = i * SLOT
        if msg.kind == "write":
            assert b.b.mem[B_WRITE + slot : B_WRITE + slot + msg.size] == data(i, msg.size)
        elif msg.kind == "read":
            assert b.a.mem[A_READ + slot : A_READ + slot + msg.size] == data(i, msg.size)
        elif msg.kind == "fadd":
            # executed exactly once, in order: each sees the sum of the adds before it
            got = int.from_bytes(b.a.mem[A_ATOMIC + 8 * i : A_ATOMIC + 8 * i + 8], "little")
            assert got == total, f"atomic #{i} returned {got}, expected {total}"
            total += msg.size
    final = int.from_bytes(b.b.mem[B_COUNTER : B_COUNTER + 8], "little")
    assert final == total, "an atomic was executed twice (or not at all)"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    msgs=messages,
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.0, 0.3),
    dup=st.floats(0.0, 0.2),
    swap=st.floats(0.0, 0.2),
    start_psn=st.sampled_from([0, 0xFFFFF8, 0xFFFFFF]) | st.integers(0, 0xFFFFFF),
    late_recvs=st.sampled_from([0, 0, 1, 3, MAX_MSGS]),
)
def test_rc_delivers_exactly_once_in_order(
    msgs: list[Msg],
    seed: int,
    loss: float,
    dup: float,
    swap: float,
    start_psn: int,
    late_recvs: int,
) -> None:
    faults = SeededFaults(seed, loss=loss, dup=dup, swap=swap)
    note(f"{faults.replay()}, start_psn={start_psn:#x}, late_recvs={late_recvs}")
    run_schedule(msgs, faults, start_psn, late_recvs)


def test_heavy_loss_fixed_seeds() -> None:
    """A few long runs at the maximum loss rate, with fixed seeds (always the same)."""
    msgs = [Msg(k, s, True) for k, s in
            [("send", 1536), ("write", 1000), ("read", 1536), ("fadd", 3), ("send", 0),
             ("read", 1), ("write", 256), ("fadd", 4), ("send", 257), ("read", 700)]]  # fmt: skip
    for seed in range(20):
        run_schedule(msgs, SeededFaults(seed, loss=0.3, dup=0.1, swap=0.1), 0xFFFFF0 + seed,
                     late_recvs=seed % 3)
