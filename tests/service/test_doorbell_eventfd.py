"""The eventfd doorbell (``SOFTVERBS_DOORBELL=eventfd``, docs/rings.md), and
what a client may do with its eventfd.

A client passes an eventfd with ``HELLO`` (``HELLO_DOORBELL_FD``); after it
stores a send queue's ``db`` it writes the eventfd instead of sending a
``DOORBELL`` message, and the service rings every send queue of the client's
whose ``db`` moved.  The service holds the eventfd edge-triggered and never
reads it, so nothing the client does to it -- never write it, write any
value, read it, make it blocking, close it, flood it -- can block the service
or reach another client.  Each case below checks that the service stays
alive, counts no internal error, and still serves another pair of processes
end to end; the raw cases watch the service's ``doorbells_eventfd`` count,
which moves exactly when a queue's ``db`` moved and the eventfd was written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable

import pytest
import rawclient as rc
from svkit import EnvPeer, ServiceProc, Worker
from test_hostile_memory import Hostile

from softverbs.enums import IBV_WC_RECV, IBV_WC_SEND, IBV_WC_SUCCESS

WAIT = 10.0
MAX_COUNT = 2**64 - 2  #: the largest value an eventfd's counter holds


def _count(service: ServiceProc) -> int:
    return int(service.stats()["stats"].get("doorbells_eventfd", 0))


def _until(pred: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    while not pred():
        assert time.monotonic() < end, f"not within {WAIT} s: {what}"
        time.sleep(0.01)


def _holds(service: ServiceProc, bell: int) -> bool:
    """Whether the service holds the eventfd ``bell`` (the same eventfd-id in
    /proc's fdinfo: every eventfd's /proc link reads the same)."""
    with open(f"/proc/self/fdinfo/{bell}") as f:
        mine = [line for line in f if line.startswith("eventfd-id:")]
    assert mine, "this kernel's fdinfo does not name eventfds"
    for fd in os.listdir(f"/proc/{service.pid}/fdinfo"):
        with contextlib.suppress(OSError), open(f"/proc/{service.pid}/fdinfo/{fd}") as f:
            if mine[0] in f.readlines():
                return True
    return False


def _pair(spawn: Callable[..., Worker], doorbell: str, extra_qps: int = 0,
          ) -> tuple[Worker, Worker]:  # fmt: skip
    """Two connected processes that ring by ``doorbell``, each with ``extra_qps``
    more send queues."""
    env = {"SOFTVERBS_DOORBELL": doorbell}
    a = spawn(EnvPeer, env, extra_qps)
    b = spawn(EnvPeer, env, extra_qps)
    a.call("connect", qpn=b.info["qpn"])
    b.call("connect", qpn=a.info["qpn"])
    return a, b


def _rounds(a: Worker, b: Worker, rounds: int) -> None:
    """SENDs both ways between ``a`` and ``b``, each checked end to end."""
    for i in range(rounds):
        src, dst = (a, b) if i % 2 == 0 else (b, a)
        dst.call("recv", n=1, off=0)
        data = f"ping {i}".encode()
        src.call("send", data=data)
        assert src.call("poll", n=1) == [(IBV_WC_SUCCESS, IBV_WC_SEND, len(data),
                                          src.info["qpn"])]  # fmt: skip
        assert dst.call("poll", n=1) == [(IBV_WC_SUCCESS, IBV_WC_RECV, len(data),
                                          dst.info["qpn"])]  # fmt: skip
        assert dst.call("mr_read", off=0, length=len(data)) == data


def _ping(spawn: Callable[..., Worker], rounds: int = 20, doorbell: str = "message",
          extra_qps: int = 0) -> None:  # fmt: skip
    """Another pair of processes, SENDs both ways: the service serves them."""
    a, b = _pair(spawn, doorbell, extra_qps)
    _rounds(a, b, rounds)
    a.finish()
    b.finish()


def _bell_hostile(service: ServiceProc) -> tuple[Hostile, int]:
    """A raw client that passed an eventfd, which the service took."""
    bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    h = Hostile(service.path, bell=bell)
    assert h.hello["features"] & rc.FEATURE_DOORBELL_FD, h.hello
    return h, bell


def _post(h: Hostile, n: int) -> None:
    """Move the send queue's pi and db to ``n`` (what a post stores; the WQEs
    themselves do not matter here: the QP is in RESET)."""
    h.sq.set(rc.SQ_PI, n)
    h.sq.set(rc.SQ_DB, n)


@pytest.mark.parametrize("doorbell", ["eventfd", "message"])
def test_python_clients_ring_by_the_doorbell_they_ask_for(
        service: ServiceProc, spawn: Callable[..., Worker], doorbell: str) -> None:  # fmt: skip
    _ping(spawn, doorbell=doorbell)
    stats = service.stats()["stats"]
    if doorbell == "eventfd":
        assert stats.get("doorbells_eventfd", 0) >= 20, stats
    else:
        assert "doorbells_eventfd" not in stats, stats
    assert not stats.get("doorbell_errors"), stats


def test_a_process_with_more_send_queues_rings_by_message(
        service: ServiceProc, spawn: Callable[..., Worker]) -> None:  # fmt: skip
    """Each write makes the service read the db of every send queue of the
    process: beyond config.BELL_MAX_QUEUES the client rings by message."""
    from softverbs.config import BELL_MAX_QUEUES

    _ping(spawn, rounds=4, doorbell="eventfd", extra_qps=BELL_MAX_QUEUES)
    stats = service.stats()["stats"]
    assert "doorbells_eventfd" not in stats, stats


def test_destroying_send_queues_brings_the_eventfd_back(
        service: ServiceProc, spawn: Callable[..., Worker]) -> None:  # fmt: skip
    """The client counts its send queues down as it destroys them: once it is
    back within config.BELL_MAX_QUEUES, it rings by the eventfd again."""
    from softverbs.config import BELL_MAX_QUEUES

    a, b = _pair(spawn, "eventfd", extra_qps=BELL_MAX_QUEUES)
    _rounds(a, b, 2)
    assert _count(service) == 0
    assert a.call("close_extra") == b.call("close_extra") == BELL_MAX_QUEUES
    _rounds(a, b, 4)
    assert _count(service) >= 4
    a.finish()
    b.finish()


def test_a_write_rings_the_queues_whose_db_moved_and_only_those(service: ServiceProc) -> None:
    h, bell = _bell_hostile(service)
    try:
        os.eventfd_write(bell, 1)  # nothing posted: nothing rung
        time.sleep(0.2)
        assert _count(service) == 0
        _post(h, 1)
        time.sleep(0.2)  # a db stored without a write is not seen...
        assert _count(service) == 0
        os.eventfd_write(bell, 1)  # ...until the write
        _until(lambda: _count(service) == 1, "the write rings the queue")
        os.eventfd_write(bell, 1)  # db did not move: nothing more
        time.sleep(0.2)
        assert _count(service) == 1
        _post(h, 2)
        os.eventfd_write(bell, 1)
        _until(lambda: _count(service) == 2, "the next post rings it again")
    finally:
        h.close()
        os.close(bell)


def test_the_queues_are_listed_again_only_when_a_qp_comes_or_goes(
        service: ServiceProc, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Every request of a process with an eventfd scans its send queues first;
    the list of them is made again only when a QP was made or destroyed, so a
    process registering thousands of regions does not walk all its objects
    for each one."""
    monkeypatch.setenv("SOFTVERBS_DOORBELL", "message")  # the STATUS connections: no eventfd

    def lists() -> int:
        return int(service.stats()["stats"].get("doorbell_lists", 0))

    h, bell = _bell_hostile(service)
    try:
        h.raw.alloc_pd(h.ctx)  # a request: the queues are scanned (and listed) before it
        before = lists()
        assert before >= 1
        for _ in range(20):  # requests that make objects, but no QP
            h.raw.alloc_pd(h.ctx)
        os.eventfd_write(bell, 1)
        time.sleep(0.2)
        assert lists() == before
        other = Hostile(service.path)  # a QP made (by another process)
        try:
            os.eventfd_write(bell, 1)
            _until(lambda: lists() == before + 1, "a new QP lists the queues again")
        finally:
            other.close()
    finally:
        h.close()
        os.close(bell)


def test_a_client_that_never_writes_its_eventfd_delays_only_itself(
        service: ServiceProc, spawn: Callable[..., Worker]) -> None:  # fmt: skip
    h, bell = _bell_hostile(service)
    try:
        _post(h, 1)
        _ping(spawn)
        assert _count(service) == 0  # its queue was never rung
        h.raw.doorbell(h.qp, rc.DB_SQ)  # the message still rings it
        assert h.raw.alloc_pd(h.ctx) > 0
    finally:
        h.close()
        os.close(bell)


def test_garbage_a_full_counter_a_blocking_or_closed_eventfd_hurt_no_one(
        service: ServiceProc, spawn: Callable[..., Worker]) -> None:  # fmt: skip
    h, bell = _bell_hostile(service)
    try:
        _post(h, 1)
        os.eventfd_write(bell, MAX_COUNT)  # any value is a doorbell
        _until(lambda: _count(service) == 1, "a write of any value rings")
        with pytest.raises(BlockingIOError):  # the counter is full: its own writes fail
            os.eventfd_write(bell, 1)
        assert os.eventfd_read(bell) == MAX_COUNT  # the service never read the counter
        # blocking now, and empty: a service that read it would hang at its next read
        fcntl.fcntl(bell, fcntl.F_SETFL, fcntl.fcntl(bell, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        _post(h, 2)
        os.eventfd_write(bell, 1)
        _until(lambda: _count(service) == 2, "the service rang it without reading")
        assert os.eventfd_read(bell) == 1
        os.close(bell)  # the client's copy: the service keeps its own
        bell = -1
        _ping(spawn)
        assert h.raw.alloc_pd(h.ctx) > 0
    finally:
        h.close()
        if bell >= 0:
            os.close(bell)


def test_a_flood_of_writes_hurts_no_one(service: ServiceProc,
                                        spawn: Callable[..., Worker]) -> None:  # fmt: skip
    h, bell = _bell_hostile(service)
    stop = threading.Event()
    writes = [0]

    def flood() -> None:
        n = 2
        while not stop.is_set():
            _post(h, n // 1000)  # db moves now and then, so rings run too
            os.eventfd_write(bell, 1)
            writes[0] += 1
            n += 1

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        _ping(spawn)
    finally:
        stop.set()
        t.join()
        h.close()
        os.close(bell)
    assert writes[0] > 1000, writes
    stats = service.stats()["stats"]
    assert not stats.get("internal_errors") and not stats.get("engine_errors"), stats


def test_the_service_closes_its_copy_when_the_client_goes(service: ServiceProc) -> None:
    h, bell = _bell_hostile(service)
    try:
        assert _holds(service, bell)
        h.close()
        _until(lambda: not _holds(service, bell), "the service closed the eventfd")
    finally:
        os.close(bell)


def test_what_is_not_an_eventfd_is_refused_and_the_connection_stays(
        service: ServiceProc) -> None:  # fmt: skip
    raw = rc.RawClient(service.path)
    r, w = os.pipe()
    try:
        with pytest.raises(rc.Refused) as exc:
            raw.hello(bell=r)
        assert exc.value.errno == errno.EINVAL and "not an eventfd" in str(exc.value), exc.value
        # the flag without a descriptor
        body = rc.Hello.pack(token=0, version=rc.PROTOCOL_VERSION,
                             flags=rc.HELLO_DOORBELL_FD, pid=os.getpid())  # fmt: skip
        with pytest.raises(rc.Refused) as exc:
            raw.call(rc.HELLO, body)
        assert exc.value.errno == errno.EINVAL and "HELLO_DOORBELL_FD" in str(exc.value)
        bell = os.eventfd(0)
        try:
            assert raw.hello(bell=bell)["features"] & rc.FEATURE_DOORBELL_FD
        finally:
            os.close(bell)
    finally:
        raw.close()
        os.close(r)
        os.close(w)


def test_a_bad_doorbell_setting_is_refused_with_its_name(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from softverbs import config
    from softverbs.errors import ConfigError

    monkeypatch.setenv("SOFTVERBS_DOORBELL", "futex")
    with pytest.raises(ConfigError, match="SOFTVERBS_DOORBELL='futex'"):
        config.doorbell_mode()
    for word in ("message", "eventfd", "EventFD", ""):
        monkeypatch.setenv("SOFTVERBS_DOORBELL", word)
        assert config.doorbell_mode() == (word.lower() or config.DEFAULT_DOORBELL)
