"""Simulation mode: isolated devices on a virtual clock.

What a user may rely on: a program run twice with the same fault seed sends
the same packets at the same virtual times; virtual time moves only while the
program waits, by jumping to the next timer, so long timeouts cost no wall
time; waiting for something that can never happen is EDEADLK instead of a
hang; ``Simulation.run`` lets time pass; device names resolve inside
``with`` only; and RC delivers every message exactly once, in order, under
loss.  The 100k-message variant is marked ``slow`` (``pytest -m slow``).
"""

from __future__ import annotations

import errno
import time

import pytest
from sim_kit import Trace, rc_pair, stream

from softverbs import (
    SGE,
    CompChannel,
    Context,
    PyverbsRDMAError,
    RecvWR,
    SendWR,
    counters,
    get_device_list,
)
from softverbs.enums import IBV_WC_SUCCESS, IBV_WR_SEND
from softverbs.sim import Simulation

ACK_TIMEOUT_14 = 4.096e-6 * 2**14  #: 67.1 ms
RNR_TIMER_0 = 0.65536  #: min_rnr_timer code 0, the longest


# --- determinism ----------------------------------------------------------------------------------


def traced_run(faults: str, n: int = 400) -> tuple[list[tuple[int, int, int, float | None]], float]:
    with Simulation(devices=("a", "b"), faults=faults) as sim:
        trace = Trace()
        sim.runtime.add_tap(trace)
        stream(rc_pair(sim, timeout=10), n)
        return trace.rows, sim.now


def test_same_program_same_seed_same_trace() -> None:
    spec = "seed=11;drop=0.05;dup=0.03;reorder=0.03;delay=0.00001;jitter=0.00002"
    rows1, end1 = traced_run(spec)
    rows2, end2 = traced_run(spec)
    assert len(rows1) > 800  # requests, ACKs and retransmissions
    assert rows1 == rows2  # opcode, PSN, destination QP and virtual time of every packet
    assert end1 == end2 > 0
    rows3, end3 = traced_run(spec.replace("seed=11", "seed=12"))
    assert rows3 != rows1 and end3 != end1


# --- virtual time ---------------------------------------------------------------------------------


def test_virtual_time_moves_only_while_waiting() -> None:
    with Simulation(devices=("a", "b"), faults="seed=1;drop=1;limit=1;kinds=send") as sim:
        pair = rc_pair(sim, timeout=14)
        a, b = pair.a, pair.b
        b.qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
        a.qp.post_send(SendWR(1, IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 64, a.mr.lkey)]))
        assert sim.now == 0.0  # posting, progress and the lost packet took no time
        # Nothing to poll yet, so the poll waits: the clock jumps straight to the ACK
        # timeout, the SEND is resent and arrives, and the same poll returns it.
        n, wcs = b.cq.poll(1)
        assert n == 1 and wcs[0].status == IBV_WC_SUCCESS
        assert sim.now == pytest.approx(ACK_TIMEOUT_14)
        assert a.cq.poll(1)[0] == 1
        assert sim.now == pytest.approx(ACK_TIMEOUT_14)  # a poll that finds something: no time


def test_long_timeouts_cost_no_wall_time() -> None:
    """A 655 ms RNR back-off, 100 times over: 65.5 virtual seconds."""
    with Simulation(devices=("a", "b")) as sim:
        pair = rc_pair(sim, min_rnr_timer=0, rnr_retry=7)  # the longest RNR timer, retry forever
        a, b = pair.a, pair.b
        t0 = time.perf_counter()
        a.qp.post_send(SendWR(1, IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 64, a.mr.lkey)]))
        sim.run(100 * RNR_TIMER_0 + 0.001)  # b has no receive WQE: RNR NAK after RNR NAK
        assert counters(a.ctx)["rnr_retries"] == 100
        assert counters(b.ctx)["send_rnr_err"] == 101
        b.qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
        n, wcs = a.cq.poll(1)
        while n == 0:
            n, wcs = a.cq.poll(1)
        wall = time.perf_counter() - t0
        assert wcs[0].status == IBV_WC_SUCCESS
        assert sim.now == pytest.approx(101 * RNR_TIMER_0)  # the 101st try found the WQE
        print(f"{sim.now:.2f} virtual seconds of RNR back-off in {wall * 1000:.0f} ms wall")
        assert wall < 5.0  # in practice tens of milliseconds; no timed limit tighter than this


def test_run_lets_time_pass_and_fires_timers() -> None:
    with Simulation(devices=("a", "b"), faults="seed=1;drop=1;limit=1;kinds=send") as sim:
        pair = rc_pair(sim, timeout=14)
        a, b = pair.a, pair.b
        b.qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
        a.qp.post_send(SendWR(1, IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 64, a.mr.lkey)]))
        sim.run(0)
        assert sim.now == 0.0
        sim.run(0.05)  # before the ACK timeout: nothing resent yet
        assert sim.now == pytest.approx(0.05)
        assert counters(a.ctx).get("local_ack_timeout_err", 0) == 0
        sim.run(0.05)  # past it: resent, received, ACKed
        assert sim.now == pytest.approx(0.10)
        assert counters(a.ctx)["local_ack_timeout_err"] == 1
        assert counters(b.ctx)["rdma_recvs"] == 1
        sim.run(1000.0)  # idle for a long time: costs nothing
        assert sim.now == pytest.approx(1000.1)


def test_waiting_for_what_cannot_happen_is_edeadlk() -> None:
    with Simulation(devices=("a", "b")) as sim:
        pair = rc_pair(sim)
        b = pair.b
        channel = CompChannel(b.ctx)
        with pytest.raises(PyverbsRDMAError) as info:
            b.ctx.get_async_event()  # no event can ever come
        assert info.value.error_code == errno.EDEADLK
        assert "can never happen" in str(info.value)
        with pytest.raises(PyverbsRDMAError) as info:
            channel.get_cq_event(b.cq)  # nobody sends: no completion can ever come
        assert info.value.error_code == errno.EDEADLK
        before = sim.now
        with pytest.raises(PyverbsRDMAError) as info:
            b.ctx.get_async_event(timeout=2.0)  # with a timeout: EAGAIN, in virtual time
        assert info.value.error_code == errno.EAGAIN
        assert sim.now == pytest.approx(before + 2.0)
        channel.close()


# --- devices --------------------------------------------------------------------------------------


def test_devices_resolve_inside_with_only() -> None:
    with pytest.raises(PyverbsRDMAError, match="Failed to find device simdev"):
        Context(name="simdev")
    with Simulation(devices=("simdev", "other")):
        assert [d.name for d in get_device_list()] == [b"simdev", b"other"]
        ctx = Context(name="simdev")
        assert ctx.query_gid(1, 1).gid.endswith("ffff:0a00:0001")  # ::ffff:10.0.0.1
        with pytest.raises(PyverbsRDMAError, match="Failed to find device sv0"):
            Context(name="sv0")  # the process's devices are not in the simulation
    assert ctx.closed  # leaving the simulation closed its contexts
    assert b"simdev" not in [d.name for d in get_device_list()]
    with pytest.raises(PyverbsRDMAError, match="Failed to find device simdev"):
        Context(name="simdev")


def test_simulations_are_isolated() -> None:
    with Simulation(devices=("a", "b"), faults="seed=1;drop=1") as lossy:
        assert lossy.runtime.faults is not None
        with Simulation(devices=("a", "b")) as clean:
            stream(rc_pair(clean), 10)  # the inner simulation's devices: no loss
            assert clean.stats == {} and clean.now == 0.0
        assert lossy.stats == {}  # nothing went through the outer one


# --- RC under loss --------------------------------------------------------------------------------


def deliver(n: int, seed: int) -> tuple[float, float, dict[str, int]]:
    t0 = time.perf_counter()
    with Simulation(devices=("a", "b"), faults=f"seed={seed};drop=0.1") as sim:
        pair = rc_pair(sim, timeout=10)  # 4 ms ACK timeout
        stream(pair, n, size=32, window=32)
        return time.perf_counter() - t0, sim.now, dict(sim.stats)


def test_rc_delivers_every_message_once_in_order_at_10_percent_loss() -> None:
    wall, virtual, stats = deliver(10_000, seed=3)
    print(f"10k messages at 10% loss: {wall:.1f} s wall, {virtual:.2f} s virtual, {stats}")
    assert stats["dropped"] > 1000


@pytest.mark.slow
def test_rc_delivers_100k_messages_at_10_percent_loss() -> None:
    wall, virtual, stats = deliver(100_000, seed=4)
    print(f"100k messages at 10% loss: {wall:.1f} s wall, {virtual:.2f} s virtual, {stats}")
    assert stats["dropped"] > 10_000
