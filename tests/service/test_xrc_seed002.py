"""Seed 002's nine usage steps, each participant a separate OS process.

The sender, R1 and R2 are real processes on the same host, sharing the
device through softverbsd; the XRC domain is shared through a file, as
``ibv_open_xrcd`` shares it.  The QP and SRQ numbers travel over pipes,
as the seed's request and response would.  What the seed promises:

* the receive QP made by R1 survives R1's unregistering while R2 is still
  registered (step 8), and dies when the last registration goes (step 9);
* if R1 dies instead -- SIGKILL, no goodbye -- the service drops R1's
  registration and objects and R2 goes on undisturbed (note 2: no heartbeat);
* once destroyed, the QP number is gone: registering it again is EINVAL, and
  a sender still aimed at it gets no answer and fails with
  ``IBV_WC_RETRY_EXC_ERR`` (packets to a QP that does not exist are dropped,
  IBA 9.6.1.1, so the requester's transport timer runs out).
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from svkit import ServiceProc, Worker, XrcReceiver, XrcSender

from softverbs.enums import IBV_QPS_RTS, IBV_WC_RETRY_EXC_ERR, IBV_WC_SUCCESS

# Sender QP: ACK timeout 4.096 us * 2**12 = 16.8 ms, three retries: a send to a
# destroyed QP fails in about 70 ms instead of seconds.
SENDER_ARGS = (64, 12, 3)


def _steps_1_to_7(spawn: Callable[..., Worker], xrcd_file: str
                  ) -> tuple[Worker, Worker, Worker, int, int, int]:  # fmt: skip
    # 1. The sender creates an XRC (sending) QP.
    sender = spawn(XrcSender, *SENDER_ARGS)
    send_qpn = sender.info["qpn"]
    # 2. It asks a receiving process, R1, for an XRC QP and SRQ, giving its QP number.
    r1 = spawn(XrcReceiver, xrcd_file)
    # 3.-4. R1 allocates the receive QP (created in the device, moved to RTR, R1
    # registered) and creates an XRC SRQ for it.
    got = r1.call("alloc", send_qpn=send_qpn)
    qpn, srqn1 = got["qpn"], got["srqn"]
    # 5. R1 answers with the QP and SRQ numbers; the sender connects to the QP.
    assert sender.call("connect", qpn=qpn) == IBV_QPS_RTS
    # 6. The sender tells R2 the receive QP's number.
    r2 = spawn(XrcReceiver, xrcd_file)
    # 7. R2 creates its own XRC SRQ and registers with R1's QP.
    srqn2 = r2.call("srq")["srqn"]
    r2.call("register", qpn=qpn)
    return sender, r1, r2, qpn, srqn1, srqn2


def _exchange(sender: Worker, dests: list[tuple[Worker, int, int]], per: int, base: int) -> None:
    """``per`` messages to each (receiver, srqn, tag); each gets exactly its own."""
    msgs = [(srqn, me, base + k) for k in range(per) for _, srqn, me in dests]
    assert sender.call("send", msgs=msgs) == [IBV_WC_SUCCESS] * len(msgs)
    for w, _, me in dests:
        assert w.call("expect", n=per, me=me) == [base + k for k in range(per)]


def _holders(service: ServiceProc, qpn: int) -> int | None:
    holders: dict[str, int] = service.stats()["xrc_holders"]
    return holders.get(f"{qpn:#x}")


def test_nine_steps(service: ServiceProc, spawn: Callable[..., Worker], xrcd_file: str) -> None:
    sender, r1, r2, qpn, srqn1, srqn2 = _steps_1_to_7(spawn, xrcd_file)
    assert qpn & 0x800000, f"an XRC receive QP number has its MSB set: {qpn:#x}"
    assert srqn1 != srqn2
    assert _holders(service, qpn) == 2  # R1 and R2
    # The sender reaches both SRQs through the one receive QP.
    _exchange(sender, [(r1, srqn1, 1), (r2, srqn2, 2)], per=4, base=0)

    # 8. R1 is done: it unregisters.  The QP is not destroyed -- R2 still holds it.
    r1.call("unregister")
    assert _holders(service, qpn) == 1
    assert r1.call("try", what="register", qpn=qpn) == 0  # it still exists...
    r1.call("unregister")  # ...and R1 lets go again
    _exchange(sender, [(r2, srqn2, 2)], per=4, base=100)
    assert r1.call("nothing") == 0

    # 9. R2 is done: it unregisters, and the QP is destroyed.
    r2.call("unregister")
    st = service.stats()
    assert st["xrc_qps"] == 0, st
    assert st["engine_qps"] == 1, f"only the sender's QP is left: {st}"
    for w in (r1, r2):
        assert w.call("try", what="register", qpn=qpn) == errno.EINVAL
        assert w.call("try", what="open", qpn=qpn) == errno.EINVAL
    # The sender is still aimed at the dead QP: no one answers.
    dropped = service.counters().get("drop_unknown_qp", 0)
    assert sender.call("send", msgs=[(srqn2, 2, 999)]) == [IBV_WC_RETRY_EXC_ERR]
    assert service.counters().get("drop_unknown_qp", 0) > dropped
    assert r2.call("nothing") == 0

    for w in (sender, r1, r2):
        w.finish()
    st = service.wait_stats(lambda s: s["clients"] == 0, "every process gone")
    assert st["objects"] == {} and st["engine_qps"] == 0 and st["keys"] == 0, st


def test_nine_steps_r1_killed(service: ServiceProc, spawn: Callable[..., Worker],
                              xrcd_file: str) -> None:  # fmt: skip
    sender, r1, r2, qpn, srqn1, srqn2 = _steps_1_to_7(spawn, xrcd_file)
    _exchange(sender, [(r1, srqn1, 1), (r2, srqn2, 2)], per=3, base=0)
    before = service.stats()
    assert _holders(service, qpn) == 2
    assert any(p["pid"] == r1.pid for p in before["processes"])

    # 8'. R1 dies without a word.
    r1.kill()
    st = service.wait_stats(lambda s: all(p["pid"] != r1.pid for p in s["processes"]),
                            "R1's objects released")  # fmt: skip
    assert _holders(service, qpn) == 1, "R1's registration must be dropped"
    r1_objects = next(p for p in before["processes"] if p["pid"] == r1.pid)["objects"]
    for kind, n in r1_objects.items():
        assert st["objects"].get(kind, 0) == before["objects"][kind] - n, (kind, before, st)
    assert st["xrc_srqs"] == 1, "only R2's SRQ is left in the device"

    # R2 is undisturbed: its messages still arrive, through the same QP.
    _exchange(sender, [(r2, srqn2, 2)], per=5, base=10)

    # 9. R2 unregisters: the last holder; the QP is gone.
    r2.call("unregister")
    assert service.stats()["xrc_qps"] == 0
    assert r2.call("try", what="register", qpn=qpn) == errno.EINVAL
    assert sender.call("send", msgs=[(srqn2, 2, 99)]) == [IBV_WC_RETRY_EXC_ERR]
    for w in (sender, r2):
        w.finish()
    st = service.wait_stats(lambda s: s["clients"] == 0, "every process gone")
    assert st["objects"] == {} and st["engine_qps"] == 0 and st["keys"] == 0, st


def test_last_holder_killed_destroys_the_qp(service: ServiceProc,
                                            spawn: Callable[..., Worker],
                                            xrcd_file: str) -> None:  # fmt: skip
    """No heartbeat: when every registered process has died, the QP goes."""
    sender, r1, r2, _qpn, _, _ = _steps_1_to_7(spawn, xrcd_file)
    r1.kill()
    r2.kill()
    service.wait_stats(lambda s: s["xrc_qps"] == 0 and s["clients"] == 1,
                       "the receive QP destroyed with its last holder")  # fmt: skip
    sender.finish()
