"""Many processes on one XRC receive QP, and XRC QP numbers across processes.

* 32 receiving processes share one receive QP and one XRC domain, each
  with its own SRQ; every message reaches exactly the SRQ it names (each
  payload names its target; each receiver checks what it got, in order).
  A message naming an SRQ of another domain is NAKed -- the sender sees
  ``IBV_WC_REM_INV_REQ_ERR`` -- and never delivered.
* Receive QP numbers are not quickly reused (seed 002, note 1): allocated
  and destroyed over and over by different processes, every number differs,
  its upper bits advance and its MSB is set.
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Callable

from svkit import Allocator, ServiceProc, Worker, XrcReceiver, XrcSender

from softverbs.enums import IBV_WC_REM_INV_REQ_ERR, IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR

RECEIVERS = 32
PER_RECEIVER = 6


def test_32_receivers_one_qp(service: ServiceProc, spawn: Callable[..., Worker],
                             xrcd_file: str, workdir: object) -> None:  # fmt: skip
    sender = spawn(XrcSender, 128)
    recv = [spawn(XrcReceiver, xrcd_file, 16, wait=False) for _ in range(RECEIVERS)]
    for w in recv:
        w.ready()
    got = recv[0].call("alloc", send_qpn=sender.info["qpn"])
    qpn, srqns = got["qpn"], [got["srqn"]]
    for w in recv[1:]:
        w.send("srq")
    srqns += [w.result()["srqn"] for w in recv[1:]]
    for w in recv[1:]:
        w.send("register", qpn=qpn)
    for w in recv[1:]:
        w.result()
    assert len(set(srqns)) == RECEIVERS
    st = service.stats()
    assert st["xrc_qps"] == 1 and st["xrc_holders"] == {f"{qpn:#x}": RECEIVERS}, st
    sender.call("connect", qpn=qpn)

    # Interleaved: message k goes to receiver (k * 7) % 32, so consecutive
    # messages hit different processes' SRQs through the one QP.
    msgs = []
    seq = [0] * RECEIVERS
    for k in range(RECEIVERS * PER_RECEIVER):
        me = (k * 7) % RECEIVERS
        msgs.append((srqns[me], me, seq[me]))
        seq[me] += 1
    assert sender.call("send", msgs=msgs) == [IBV_WC_SUCCESS] * len(msgs)
    for me, w in enumerate(recv):
        w.send("expect", n=PER_RECEIVER, me=me)
    for w in recv:
        assert w.result() == list(range(PER_RECEIVER))

    # An SRQ of another XRC domain (another file): NAKed, never delivered.
    stranger = spawn(XrcReceiver, str(xrcd_file) + ".other", 4)
    foreign = stranger.call("srq")["srqn"]
    assert stranger.call("try", what="register", qpn=qpn) == errno.EINVAL
    bad_before = service.counters().get("drop_xrc_bad_srq", 0)
    statuses = sender.call("send", msgs=[(foreign, 99, 0), (srqns[0], 0, 100)])
    assert statuses[0] == IBV_WC_REM_INV_REQ_ERR, statuses
    assert statuses[1] == IBV_WC_WR_FLUSH_ERR, statuses  # the NAK moved the sender to ERR
    assert service.counters().get("drop_xrc_bad_srq", 0) == bad_before + 1
    assert stranger.call("nothing", seconds=0.2) == 0
    for w in recv:
        w.send("nothing", seconds=0.05)
    assert [w.result() for w in recv] == [0] * RECEIVERS

    for w in [sender, stranger, *recv]:
        w.send("exit")
    for w in [sender, stranger, *recv]:
        w.finish()
    st = service.wait_stats(lambda s: s["clients"] == 0, "every process gone")
    assert st["xrc_qps"] == 0 and st["engine_qps"] == 0 and st["objects"] == {}, st


def test_qp_numbers_are_not_reused(service: ServiceProc, spawn: Callable[..., Worker],
                                   xrcd_file: str) -> None:  # fmt: skip
    a = spawn(Allocator, xrcd_file, 2)
    b = spawn(Allocator, xrcd_file, 2)
    held = a.call("alloc", send_qpn=0x11)["qpn"]  # one stays alive throughout
    numbers = [held]
    for round_ in range(8):
        w = a if round_ % 2 else b
        numbers += w.call("churn", rounds=5, send_qpn=0x11)
    assert len(set(numbers)) == len(numbers), [hex(n) for n in numbers]
    assert all(n & 0x800000 for n in numbers), "the MSB of an XRC receive QP number is 1"
    gens = [(n >> 12) & 0x7FF for n in numbers]
    assert all(g2 == (g1 + 1) & 0x7FF for g1, g2 in itertools.pairwise(gens)), (
        f"the upper bits advance on every allocation: {[hex(n) for n in numbers]}"
    )
    # A destroyed number is stale for everyone.
    assert b.call("try", what="register", qpn=numbers[-1]) == errno.EINVAL
    assert b.call("try", what="register", qpn=held) == 0
    st = service.stats()
    assert st["xrc_qps"] == 1 and st["xrc_holders"] == {f"{held:#x}": 2}, st
    a.kill()
    b.finish()
    st = service.wait_stats(lambda s: s["clients"] == 0, "every process gone")
    assert st["xrc_qps"] == 0 and st["engine_qps"] == 0, st
