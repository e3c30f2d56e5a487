"""Large copies through ``process_vm_readv``/``process_vm_writev`` and their fallback.

``ProcessMemory`` copies at least ``VM_COPY`` bytes with one ``process_vm_*``
call (through ``ctypes``, the same in both modes) where it may, and through the
``/proc/PID/mem`` descriptor otherwise.  Here: the call is taken and lands the
bytes, a WRITE's last piece in a remote iovec of its own after the body; a
refusal (EPERM: forced, and for real from a process that may not ptrace the
client) moves that client to the descriptor for good with nothing lost or
misplaced; a short copy ends as the descriptor's does; a client that exits or
execs is never copied by pid again; and no ``process_vm_*`` in ``ctypes``
means the descriptor, cleanly."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from procmem_kit import own_memory, own_read_buffers

from softverbs import hostmem
from softverbs.device import memory
from softverbs.device.memory import VM_COPY, ProcessMemory, ReadBuffers

PAGE = mmap.PAGESIZE
SIZE = 2 * VM_COPY  #: a copy large enough for process_vm_*
LINE = 64


@pytest.fixture(autouse=True)
def pool(monkeypatch: pytest.MonkeyPatch) -> ReadBuffers:
    """Read buffers of this test's own."""
    return own_read_buffers(monkeypatch, 16 * SIZE)


@pytest.fixture
def mem() -> Iterator[ProcessMemory]:
    m = own_memory()
    yield m
    m.close()


@pytest.fixture
def region() -> Iterator[int]:
    """SIZE bytes, then a page left unmapped."""
    addr = hostmem.mmap(length=SIZE + PAGE)
    hostmem.munmap(addr + SIZE, PAGE)
    yield addr
    hostmem.munmap(addr, SIZE)


Calls = list[tuple[str, list[tuple[int, int]]]]


def _count(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    """Record every process_vm_* call (its remote iovecs) and every descriptor call."""
    for name in ("_process_vm_readv", "_process_vm_writev"):
        real = getattr(memory, name)
        assert real is not None

        def call(pid: int, local: int, nlocal: int, remote: int, nremote: int, flags: int,
                 real: Any = real, name: str = name) -> int:  # fmt: skip
            raw = ctypes.string_at(remote, 16 * nremote)
            calls.append((name, [struct.unpack_from("=2Q", raw, 16 * i) for i in range(nremote)]))
            done: int = real(pid, local, nlocal, remote, nremote, flags)
            return done

        monkeypatch.setattr(memory, name, call)
    for name in ("_pread", "_preadv", "_pwrite", "_pwritev"):
        real_fd = getattr(memory, name)

        def fd_call(*args: Any, real: Any = real_fd, name: str = name) -> Any:
            calls.append((name, []))
            return real(*args)

        monkeypatch.setattr(memory, name, fd_call)


def test_large_copies_take_process_vm_with_the_tail_last(
    mem: ProcessMemory, region: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert mem.vm, mem.vm_why
    calls: Calls = []
    _count(monkeypatch, calls)
    data = os.urandom(SIZE)
    ctypes.memmove(region, data, SIZE)
    got = mem.span(region, SIZE).read()
    assert bytes(got) == data and got.readonly
    new = os.urandom(SIZE)
    mem.span(region, SIZE).place(0, new, LINE)
    assert ctypes.string_at(region, SIZE) == new
    assert calls == [
        ("_process_vm_readv", [(region, SIZE)]),
        ("_process_vm_writev", [(region, SIZE - LINE), (region + SIZE - LINE, LINE)]),
    ]
    mem.write(region, new[::-1])  # a whole store: one remote piece
    assert ctypes.string_at(region, SIZE) == new[::-1]
    assert calls[-1] == ("_process_vm_writev", [(region, SIZE)])
    assert mem.vm_copies == 3 and mem.faults == 0
    assert mem.copies() == {"path": "process_vm", "why": "", "process_vm_copies": 3, "faults": 0}


def test_small_copies_stay_on_the_descriptor(
    mem: ProcessMemory, region: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: Calls = []
    _count(monkeypatch, calls)
    small = VM_COPY - 1
    data = os.urandom(small)
    mem.span(region, small).place(0, data, LINE)
    assert bytes(mem.span(region, small).read()) == data
    assert [name for name, _ in calls] == ["_pwritev", "_preadv"]
    assert mem.vm_copies == 0 and mem.vm


def _refusing(err: int, calls: list[str]) -> Callable[..., int]:
    def call(*args: Any) -> int:
        calls.append("process_vm")
        ctypes.set_errno(err)
        return -1

    return call


@pytest.mark.parametrize("err", [errno.EPERM, errno.ESRCH, errno.ENOSYS])
def test_a_refusal_moves_the_client_to_the_descriptor_for_good(
    mem: ProcessMemory, region: int, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    tried: list[str] = []
    monkeypatch.setattr(memory, "_process_vm_readv", _refusing(err, tried))
    monkeypatch.setattr(memory, "_process_vm_writev", _refusing(err, tried))
    data = os.urandom(SIZE)
    ctypes.memmove(region, data, SIZE)
    assert bytes(mem.span(region, SIZE).read()) == data
    assert tried == ["process_vm"] and not mem.vm and os.strerror(err) in mem.vm_why
    new = os.urandom(SIZE)
    mem.span(region, SIZE).place(0, new, LINE)
    assert ctypes.string_at(region, SIZE) == new
    assert tried == ["process_vm"]  # never asked again
    assert mem.faults == 0 and mem.vm_copies == 0 and mem.pidfd == -1
    assert mem.copies()["path"] == "descriptor"


def test_another_error_falls_back_for_that_copy_only(
    mem: ProcessMemory, region: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[str] = []
    monkeypatch.setattr(memory, "_process_vm_writev", _refusing(errno.ENOMEM, tried))
    new = os.urandom(SIZE)
    mem.write(region, new)
    assert ctypes.string_at(region, SIZE) == new and mem.vm and mem.faults == 0


def _short_copies(m: ProcessMemory, region: int) -> tuple[bytes, bytes, int]:
    """A read and a store that run into the unmapped page after ``region``: what was
    read, what ``region`` holds after, and the faults counted."""
    data = bytes(range(256)) * (SIZE // 256)
    ctypes.memmove(region, data, SIZE)
    got = bytes(m.span(region + PAGE, SIZE).read())  # its last page is unmapped
    new = bytes(reversed(data))
    m.span(region + PAGE, SIZE).place(0, new, LINE)  # the body falls short: no tail
    return got, ctypes.string_at(region, SIZE), m.faults


def test_a_short_copy_ends_as_the_descriptors_does(
    mem: ProcessMemory, region: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC))  # pid 0
    try:
        assert not plain.vm
        expected = _short_copies(plain, region)
    finally:
        plain.close()
    calls: Calls = []
    _count(monkeypatch, calls)
    got, held, faults = _short_copies(mem, region)
    assert (got, held, faults) == expected
    data = bytes(range(256)) * (SIZE // 256)
    assert got == data[PAGE:] + bytes(PAGE) and held == data[:PAGE] + data[::-1][: SIZE - PAGE]
    assert mem.vm  # a fault is not a refusal
    names = [name for name, _ in calls]
    assert names[0] == "_process_vm_readv" and "_process_vm_writev" in names


def test_without_process_vm_in_libc_every_copy_takes_the_descriptor(
    monkeypatch: pytest.MonkeyPatch, region: int
) -> None:
    monkeypatch.setattr(memory, "_process_vm_writev", None)
    m = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC), os.getpid())
    try:
        assert not m.vm and "process_vm" in m.vm_why and m.pidfd == -1
        new = os.urandom(SIZE)
        m.span(region, SIZE).place(0, new, LINE)
        assert ctypes.string_at(region, SIZE) == new and bytes(m.span(region, SIZE).read()) == new
    finally:
        m.close()


def test_a_descriptor_of_another_process_gets_no_process_vm(
    region: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pid must be the descriptor's process: no pidfd is kept otherwise, and the
    copy goes through the descriptor (this process's memory, as before)."""
    calls: Calls = []
    _count(monkeypatch, calls)
    m = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC), os.getppid())
    try:
        assert m.vm and m.pidfd == -1  # taken at the first large copy
        new = os.urandom(SIZE)
        m.write(region, new)
        assert ctypes.string_at(region, SIZE) == new
        assert [name for name, _ in calls] == ["_pwrite"]
        assert not m.vm and "not /proc/" in m.vm_why and m.pidfd == -1
    finally:
        m.close()


def test_the_pidfd_is_taken_at_the_first_large_copy(mem: ProcessMemory, region: int) -> None:
    assert mem.pidfd == -1
    mem.write(region, bytes(VM_COPY - 1))
    assert mem.pidfd == -1
    mem.write(region, bytes(SIZE))
    assert mem.pidfd >= 0 and mem.vm_copies == 1
    mem.close()
    assert mem.pidfd == -1


def _child(region: int, then: Callable[[int], None]) -> tuple[int, int, int]:
    """A forked child holding ``region`` (as this process had it) that waits for a
    byte on its pipe, then runs ``then(pipe)``: (pid, the pipe's write end, a
    ProcessMemory descriptor of the child's /proc/PID/mem)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(w)
            os.read(r, 1)
            then(r)
        finally:
            os._exit(0)
    os.close(r)
    return pid, w, os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)


def test_a_client_that_exits_is_never_copied_by_pid(region: int) -> None:
    data = os.urandom(SIZE)
    ctypes.memmove(region, data, SIZE)
    pid, w, fd = _child(region, lambda r: None)
    m = ProcessMemory(fd, pid)
    try:
        assert m.vm, m.vm_why
        assert bytes(m.span(region, SIZE).read()) == data and m.vm_copies == 1
        os.write(w, b"x")
        os.waitpid(pid, 0)  # gone and reaped: its pid is free for another process
        got = m.span(region, SIZE).read()
        assert bytes(got) == bytes(SIZE) and m.faults == 1
        assert not m.vm and "gone" in m.vm_why and m.vm_copies == 1
    finally:
        m.close()
        os.close(w)


def test_a_client_that_execs_is_never_copied_by_pid(region: int) -> None:
    """After exec the pid names a new program; the descriptor's memory is gone."""
    data = os.urandom(SIZE)
    ctypes.memmove(region, data, SIZE)

    def execute(r: int) -> None:  # pragma: no cover - the child
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)"])

    pid, w, fd = _child(region, execute)
    m = ProcessMemory(fd, pid)
    try:
        assert bytes(m.span(region, SIZE).read()) == data and m.vm_copies == 1
        before = _maps(pid)
        os.write(w, b"x")
        deadline = time.monotonic() + 10
        while _maps(pid) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        got = m.span(region, SIZE).read()
        assert bytes(got) == bytes(SIZE) and m.faults == 1
        assert not m.vm and "exec or exit" in m.vm_why and m.vm_copies == 1
    finally:
        m.close()
        os.close(w)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def _nobody() -> None:  # pragma: no cover - in a child
    if os.geteuid() == 0:  # no capability left: only the same-uid, dumpable rule
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        _prctl(4, 1)  # PR_SET_DUMPABLE: a uid change made it 0 (suid_dumpable)


def _prctl(option: int, value: int) -> None:  # pragma: no cover - in a child
    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")


def test_a_real_refusal_from_a_process_that_may_not_ptrace_the_client() -> None:
    """EPERM for real: the client (T) turns non-dumpable after the service (S, its
    child, of the same uid and without CAP_SYS_PTRACE) opened its memory.  Every
    copy still lands, through the descriptor, and nothing faults."""
    out_r, out_w = os.pipe()
    t = os.fork()
    if t == 0:  # pragma: no cover - T, the client
        status = 1
        try:
            _nobody()
            addr = hostmem.mmap(length=SIZE)
            data = os.urandom(SIZE)
            ctypes.memmove(addr, data, SIZE)
            fd = os.open("/proc/self/mem", os.O_RDWR)
            go_r, go_w = os.pipe()
            ready_r, ready_w = os.pipe()
            s = os.fork()
            if s == 0:  # S, the service
                try:
                    m = ProcessMemory(fd, os.getppid())
                    vm_before = m.vm
                    os.write(ready_w, b"r")
                    os.read(go_r, 1)
                    read_ok = bytes(m.span(addr, SIZE).read()) == data
                    new = bytes(reversed(data))
                    m.span(addr, SIZE).place(0, new, LINE)
                    report = {"vm_before": vm_before, "read_ok": read_ok, **m.copies()}
                    os.write(out_w, json.dumps(report).encode())
                finally:
                    os._exit(0)
            os.read(ready_r, 1)
            _prctl(4, 0)  # PR_SET_DUMPABLE, 0
            os.write(go_w, b"g")
            os.waitpid(s, 0)
            status = 0 if ctypes.string_at(addr, SIZE) == bytes(reversed(data)) else 2
        except BaseException as exc:
            os.write(2, f"the client: {exc!r}\n".encode())
        finally:
            os._exit(status)
    os.close(out_w)
    _, status = os.waitpid(t, 0)
    report = json.loads(os.read(out_r, 4096) or b"{}")
    os.close(out_r)
    assert os.waitstatus_to_exitcode(status) == 0, report  # the client holds the new bytes
    assert report["vm_before"] and report["read_ok"], report
    assert report["path"] == "descriptor", report
    assert report["why"] == "process_vm_readv: Operation not permitted", report
    assert report["process_vm_copies"] == 0 and report["faults"] == 0, report
