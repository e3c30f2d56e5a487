"""The wire between applications and the device service.

A ``SOCK_SEQPACKET`` Unix socket: each message is one JSON object, and may
carry file descriptors (``SCM_RIGHTS``) -- the memfds of shared rings and
memory regions, and XRC domain files.  JSON, not pickle: the service must
never execute what a peer sends, and a peer that is not a softverbs client
gets a clear error and is disconnected.

The first request must be ``hello`` with the protocol version.  Requests
carry ``op`` and ``id``; the reply carries the same ``id`` and either the
results or ``errno`` and ``error``.  Doorbells (``db_sq``, ``db_rq``) have no
reply: they are one-way, like a doorbell write.  The service also sends
unsolicited messages: ``event`` (an async event of an object the process
made, or -- ``kind: "xrc_qp"`` -- of an XRC receive QP it is registered
with) and ``cq_event`` (a completion event for a CQ with a channel).

A message is at most :data:`MAX_MESSAGE` bytes with at most :data:`MAX_FDS`
descriptors; anything else -- not JSON, not an object, truncated -- is a
:class:`ProtocolError`, and the service answers it with EPROTO and hangs up.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
from typing import Any

PROTOCOL_VERSION = 1
MAX_MESSAGE = 1 << 20
MAX_FDS = 4
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


class ProtocolError(Exception):
    """The peer sent something that is not a softverbs message."""


def default_socket_path() -> str:
    """``$SOFTVERBS_SERVICE`` if it is a path, else one per user in the runtime dir."""
    env = os.environ.get("SOFTVERBS_SERVICE", "")
    if env and env not in ("1", "yes", "on"):
        return env
    return os.path.join(default_socket_dir(), "softverbsd.sock")


def default_socket_dir() -> str:
    """The per-user directory of the default socket: the one directory the service
    creates by itself (mode 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/softverbs-{os.getuid()}"
    return os.path.abspath(base)


def ensure_socket_dir(path: str, named_by: str = "SOFTVERBS_SERVICE") -> None:
    """Make sure the directory of socket ``path`` exists before a service is started.

    Only the default directory is created; a directory the user named must exist
    already (a typo must not create ``/nonexistent`` or start a service there).
    ConfigError names ``named_by`` (the variable or option the path came from)."""
    from softverbs.errors import ConfigError

    directory = os.path.dirname(os.path.abspath(path))
    if directory == default_socket_dir():
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.stat(directory).st_uid != os.getuid():
            raise ConfigError(f"the service directory {directory} belongs to another user; "
                              "set XDG_RUNTIME_DIR or SOFTVERBS_SERVICE")  # fmt: skip
    elif not os.path.isdir(directory):
        raise ConfigError(f"{named_by}={path}: the directory {directory} does not exist; "
                          "create it, or use the default socket")  # fmt: skip


def service_requested() -> bool:
    """Did the user opt into the device service (``SOFTVERBS_SERVICE``)?"""
    return bool(os.environ.get("SOFTVERBS_SERVICE"))


def encode(msg: dict[str, Any]) -> bytes:
    """One message as it goes on the wire."""
    data = json.dumps(msg, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes is too long")
    return data


def send(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    data = encode(msg)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def recv_nowait(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Like :func:`recv`, but BlockingIOError if nothing is waiting."""
    return recv(sock, socket.MSG_DONTWAIT)


def recv(sock: socket.socket, flags: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One message and its fds; EOFError when the peer closed."""
    # Not socket.recv_fds: in Python 3.11 it ignores its flags argument.
    data, ancdata, mflags, _addr = sock.recvmsg(MAX_MESSAGE + 1, _FD_SPACE, flags)
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    try:
        if not data:
            raise EOFError("peer closed the connection")
        if len(data) > MAX_MESSAGE or mflags & socket.MSG_TRUNC:
            raise ProtocolError(f"a message is at most {MAX_MESSAGE} bytes")
        if mflags & socket.MSG_CTRUNC:
            raise ProtocolError(f"a message carries at most {MAX_FDS} file descriptors")
        try:
            msg = json.loads(data)
        except (ValueError, RecursionError):
            raise ProtocolError("not a JSON message") from None
        if not isinstance(msg, dict):
            raise ProtocolError("a message must be a JSON object")
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    return msg, fds
