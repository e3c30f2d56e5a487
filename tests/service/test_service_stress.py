"""100 processes attach and detach at random; a third are SIGKILLed.

Each process (:class:`svkit.Churner`) builds a random set of objects on the
service's sv0 -- PDs, CQs, MRs, an RC QP pair with a little traffic, an XRC
SRQ, registrations with (and handles on) a receive QP that a long-lived
process keeps, sometimes a receive QP of its own -- and then either closes
everything, or exits without closing anything, or is SIGKILLed at a random
moment.  Meanwhile the long-lived sender and receiver keep working.  At the
end the service must hold nothing: no client, no object, no QP, no memory
key, no XRC domain, no file descriptor more than it started with.

The run is seeded: ``SOFTVERBS_STRESS_SEED=<n>`` replays one; a failure
names its seed.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

from svkit import Churner, ServiceProc, Worker, XrcReceiver, XrcSender

from softverbs.enums import IBV_WC_SUCCESS

PROCESSES = 100
CONCURRENT = 12
KILLED = 0.33
TIME_LIMIT = 50.0


def test_stress_attach_detach_kill(service: ServiceProc, spawn: Callable[..., Worker],
                                   xrcd_file: str) -> None:  # fmt: skip
    seed = int(os.environ.get("SOFTVERBS_STRESS_SEED") or random.randrange(1 << 32))
    print(f"stress seed {seed} (replay: SOFTVERBS_STRESS_SEED={seed})")
    try:
        _stress(service, spawn, xrcd_file, seed)
    except AssertionError as exc:
        raise AssertionError(f"[stress seed {seed}] {exc}") from exc


def _stress(service: ServiceProc, spawn: Callable[..., Worker], xrcd_file: str,
            seed: int) -> None:  # fmt: skip
    rng = random.Random(seed)
    fds = service.fd_count()
    start = time.monotonic()
    anchor = spawn(XrcReceiver, xrcd_file, 16)
    sender = spawn(XrcSender, 16)
    got = anchor.call("alloc", send_qpn=sender.info["qpn"])
    qpn, srqn = got["qpn"], got["srqn"]
    sender.call("connect", qpn=qpn)

    victims = set(rng.sample(range(PROCESSES), int(PROCESSES * KILLED)))
    waiting = list(range(PROCESSES))
    active: dict[int, tuple[Worker, float | None]] = {}
    finished: list[Worker] = []
    killed = 0
    while waiting or active:
        assert time.monotonic() - start < TIME_LIMIT, (
            f"stress took over {TIME_LIMIT} s: {len(waiting)} waiting, {len(active)} active"
        )
        while waiting and len(active) < CONCURRENT:
            i = waiting.pop(0)
            w = spawn(Churner, rng.randrange(1 << 32), xrcd_file, qpn, wait=False)
            w.send("run")
            kill_at = time.monotonic() + rng.uniform(0.0, 0.25) if i in victims else None
            active[i] = (w, kill_at)
        for i, (w, kill_at) in list(active.items()):
            if kill_at is not None and time.monotonic() >= kill_at:
                w.kill()
                killed += 1
                del active[i]
            elif w.pipe.poll(0):
                if not w.info:
                    w.ready()
                    continue
                w.result()  # raises if the process failed
                w.send("exit")
                finished.append(w)
                del active[i]
        time.sleep(0.002)
    for w in finished:
        w.finish()
    # The long-lived pair was never disturbed.
    assert service.stats()["xrc_holders"][f"{qpn:#x}"] >= 1
    assert sender.call("send", msgs=[(srqn, 1, k) for k in range(8)]) == [IBV_WC_SUCCESS] * 8
    assert anchor.call("expect", n=8, me=1) == list(range(8))
    service.wait_stats(lambda s: s["clients"] == 2, "only the long-lived pair left")
    st = service.stats()
    assert st["xrc_holders"] == {f"{qpn:#x}": 1}, f"churners' registrations leaked: {st}"
    assert st["engine_qps"] == 2 and st["xrc_qps"] == 1, st  # the sender's and the anchor's
    anchor.finish()
    sender.finish()
    st = service.wait_stats(lambda s: s["clients"] == 0, "every process gone")
    leaks = {k: st[k] for k in ("objects", "engine_qps", "keys", "xrc_qps", "xrc_srqs", "xrcds")
             if st[k]}  # fmt: skip
    assert not leaks, f"leaked after {PROCESSES} processes ({killed} killed): {leaks}"
    for bad in ("internal_errors", "engine_errors"):
        assert not st["stats"].get(bad), st["stats"]
    deadline = time.monotonic() + 5
    while service.fd_count() > fds and time.monotonic() < deadline:
        time.sleep(0.02)
    assert service.fd_count() <= fds, "the service leaked file descriptors"
    print(f"stress: {PROCESSES} processes, {killed} killed, "
          f"{time.monotonic() - start:.1f} s")
