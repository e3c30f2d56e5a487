"""The Python client names the service its process's ptracer (``served.name_ptracer``).

After ``HELLO`` a client calls ``prctl(PR_SET_PTRACER, service_pid)`` so that,
under Yama's ``ptrace_scope`` 1, the service may copy its memory with
``process_vm_readv``/``process_vm_writev`` (docs/architecture.md, *Copies that
bypass the descriptor*); the C library does the same (tests/native/test_c_ptracer.py).
Here ``served._prctl`` is replaced to see the calls: one per connection, naming
the service's pid; no answer stops the connection; ``SOFTVERBS_NO_PTRACER``
leaves the ptracer alone; a pid that is not the socket's peer (a service in
another pid namespace) is never named.  Whether the service may then ptrace
the client needs a kernel with Yama at scope 1 (docs/status.md).
"""

from __future__ import annotations

import errno
import os
import socket

import pytest
from svkit import ServiceProc

from softverbs.device import ops, records
from softverbs.verbs import served
from softverbs.verbs.served import PR_SET_PTRACER, name_ptracer

YAMA = os.path.exists("/proc/sys/kernel/yama")


def _record(monkeypatch: pytest.MonkeyPatch, answer: int) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []

    def prctl(option: int, arg: int) -> int:
        calls.append((option, arg))
        return answer

    monkeypatch.setattr(served, "_prctl", prctl)
    return calls


@pytest.mark.parametrize("answer", [0, errno.EINVAL, errno.EPERM, errno.ENOMEM])
def test_a_connection_names_the_service(service: ServiceProc, monkeypatch: pytest.MonkeyPatch,
                                        answer: int) -> None:  # fmt: skip
    """Once per connection, by the service's pid; whatever prctl answers, the
    connection serves."""
    monkeypatch.delenv("SOFTVERBS_NO_PTRACER", raising=False)
    calls = _record(monkeypatch, answer)
    conn = service.connection()
    try:
        assert calls == [(PR_SET_PTRACER, service.pid)]
        assert conn.service_pid == service.pid
        conn.call(ops.STATUS, records.Empty())
    finally:
        conn.close()


@pytest.mark.parametrize(("value", "named"), [("1", False), ("yes", False), ("0", True),
                                              ("", True)])  # fmt: skip
def test_softverbs_no_ptracer(service: ServiceProc, monkeypatch: pytest.MonkeyPatch, value: str,
                              named: bool) -> None:  # fmt: skip
    monkeypatch.setenv("SOFTVERBS_NO_PTRACER", value)
    calls = _record(monkeypatch, 0)
    service.connection().close()
    assert calls == ([(PR_SET_PTRACER, service.pid)] if named else [])


def test_only_the_peer_of_the_socket_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply's pid must be the process at the other end (SO_PEERCRED), and
    not this process: a socket pair's peer is this process."""
    monkeypatch.delenv("SOFTVERBS_NO_PTRACER", raising=False)
    calls = _record(monkeypatch, 0)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        assert not name_ptracer(a, os.getpid())  # ourselves
        assert not name_ptracer(a, os.getppid())  # not the peer
        assert not name_ptracer(a, 0)
    assert calls == []


def test_the_kernel_answers_einval_without_yama(service: ServiceProc) -> None:
    """The real call, as a client makes it: EINVAL where the kernel has no Yama
    (this machine), 0 where it does (then this test process has named the
    service, which only lets it ptrace this process)."""
    assert served._prctl(PR_SET_PTRACER, service.pid) == (0 if YAMA else errno.EINVAL)
