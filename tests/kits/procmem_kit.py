"""This process's memory as the service reaches a client's, for tests of the
service's copies (``softverbs.device.memory``)."""

from __future__ import annotations

import os

import pytest

from softverbs.device import memory
from softverbs.device.memory import ProcessMemory, ReadBuffers


def own_memory() -> ProcessMemory:
    """This process through its own ``/proc/self/mem`` and pid, as a client's is
    reached (close it when done)."""
    return ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC), os.getpid())


def own_read_buffers(monkeypatch: pytest.MonkeyPatch, limit: int) -> ReadBuffers:
    """Read buffers of a test's own, of at most ``limit`` bytes, in place of the
    service's (put back when the test ends)."""
    buffers = ReadBuffers(limit)
    monkeypatch.setattr(memory, "READ_BUFFERS", buffers)
    return buffers
