"""Doorbell suppression (docs/rings.md): the service's flag, and what a client
may do to it.

With ``SOFTVERBS_SPIN_US`` the service polls, for that long after it served a
client, the send queues whose DOORBELL messages it took, and sets their
``polled`` word meanwhile; it clears the word before it sleeps.  These tests
watch the word from a raw client's side, and check that what a client writes
into its own ring header -- a ``db`` far beyond what it posted, the device's
``polled`` word -- neither hangs nor crashes the service, and hurts no one
else.  The end-to-end proof that no post is lost is
``tests/native/test_lastbyte.py::test_last_byte_polling_with_doorbell_suppression``
(a C program skips the message whenever the word is set).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import rawclient as rc
from svkit import ServiceProc
from test_hostile_memory import Hostile

from softverbs.service import server

#: how long the service polls after serving (long enough to be seen from here)
SPIN_US = 300_000
WAIT = 10.0


@pytest.fixture
def spinning(service_factory: Callable[..., ServiceProc]) -> Iterator[ServiceProc]:
    yield service_factory({"SOFTVERBS_SPIN_US": str(SPIN_US)})


@pytest.fixture
def service_factory(workdir: Path) -> Iterator[Callable[..., ServiceProc]]:
    made: list[ServiceProc] = []

    def make(env: dict[str, str] | None = None) -> ServiceProc:
        svc = ServiceProc(str(workdir / "spin.sock"), env)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        assert svc.alive(), "softverbsd died during the test"
        svc.stop()


def _ring_until_polled(h: Hostile, what: str) -> None:
    """Ring ``h``'s send queue until the service flags it.  Each DOORBELL opens a
    new spin window: a test process that was not scheduled during one (a busy
    machine, other threads holding the GIL) sees the next, and a service that
    never flags still fails after WAIT."""
    end = time.monotonic() + WAIT
    while True:
        h.raw.doorbell(h.qp, rc.DB_SQ)
        window = time.monotonic() + SPIN_US / 2e6
        while time.monotonic() < window:
            if h.sq.get(rc.SQ_POLLED) == 1:
                return
            time.sleep(0.005)
        assert time.monotonic() < end, f"not within {WAIT} s: {what}"


def _until(pred: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    while not pred():
        assert time.monotonic() < end, f"not within {WAIT} s: {what}"
        time.sleep(0.005)


def test_the_flag_is_set_while_the_service_polls_and_cleared_before_it_sleeps(
        spinning: ServiceProc) -> None:  # fmt: skip
    h = Hostile(spinning.path)
    try:
        assert h.sq.get(rc.SQ_POLLED) == 0  # never rung: never polled
        _ring_until_polled(h, "the service flags the rung send queue")
        _until(lambda: h.sq.get(rc.SQ_POLLED) == 0, "the flag is cleared once the spin ends")
    finally:
        h.close()


def test_a_lying_doorbell_or_flag_hurts_no_one(spinning: ServiceProc) -> None:
    liar, other = Hostile(spinning.path), Hostile(spinning.path)
    try:
        _ring_until_polled(liar, "the liar's send queue is polled")
        for db in (2**64 - 1, 0, 2**63, 5):  # far past pi, backwards, ...: bounded by pi
            liar.sq.set(rc.SQ_DB, db)
            time.sleep(0.01)
        liar.sq.set(rc.SQ_POLLED, 1)  # the device's word: the service never reads it
        other.raw.doorbell(other.qp, rc.DB_SQ)
        assert other.raw.alloc_pd(other.ctx) > 0  # the service still answers others
        _until(lambda: other.sq.get(rc.SQ_POLLED) == 0, "the other's flag cleared")
        stats = spinning.stats()["stats"]
        assert stats.get("doorbells_polled", 0) >= 1, stats
        assert not stats.get("internal_errors") and not stats.get("engine_errors"), stats
    finally:
        liar.close()
        other.close()


def test_a_bad_spin_setting_is_refused_with_its_name(
        monkeypatch: pytest.MonkeyPatch, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for bad in ("fast", "-5", "1e9"):
        monkeypatch.setenv("SOFTVERBS_SPIN_US", bad)
        assert server.main(["--socket", str(workdir / "bad.sock")]) == 1
        err = capsys.readouterr().err
        assert "SOFTVERBS_SPIN_US" in err and bad in err, err
