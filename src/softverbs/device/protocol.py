"""The wire between applications and the device service: a fixed binary layout.

A ``SOCK_SEQPACKET`` Unix socket carries one message per packet.  Every
message is a 16-byte :class:`Header` followed by a body whose layout is
fixed by its operation: a :class:`Record` declared below, field by field,
little-endian and naturally aligned, exactly as a C struct without
padding.  A few operations end with a variable *tail* (a list of fixed
records, a name, or -- for the administrative operations that only tools
read -- a JSON document).  File descriptors (shared-memory rings, the
process's memory, event sockets, XRC domain files) travel as
``SCM_RIGHTS`` with the request that names them.

Why binary and not JSON: the application's side of this protocol is also
written in C (softverbs' ``libibverbs``), which must build requests and read
replies with no parser; a fixed layout is also what a doorbell, sent for
every post, can afford.  JSON stays only in the tails of ``STATUS`` and
``COUNTERS``, whose contents are variable, nested, read by tools and never
on a data path.

The records here are the one definition of the protocol: the service's
decoder, the Python client's encoder, ``softverbs/native/include/softverbs/protocol.h``
(:func:`c_header`) and the tables of ``docs/service-protocol.md``
(:func:`markdown`) all come from them.

Requests carry ``seq``; the reply carries the same ``seq`` and ``status``
0 with the reply body, or ``status`` = an errno and a UTF-8 message as its
body.  ``DOORBELL`` has no reply.  A message that is not a softverbs message
(too short, wrong length, a body longer or shorter than its record, unknown
flags, a request with a status, unknown operation, before ``HELLO``) is
answered with ``EPROTO`` and the connection is closed.

A reply is never refused for its size: one whose tail does not fit a
message carries the tail in a sealed memfd passed with it
(:data:`FLAG_TAIL_FD`, :func:`encode_reply`, :func:`read_tail_fd`) -- one
copy into a file the client reads once, paid only by the administrative
replies that grow with the number of objects (``STATUS``).
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import fcntl
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from softverbs import config
from softverbs.device.ops import BY_CODE, DOORBELL, OPS
from softverbs.device.records import (
    KIND_NAMES,
    AsyncEventRecord,
    CmEvent,
    CompEventRecord,
    DeviceEntry,
    Doorbell,
    Empty,
    MkeyConf,
    MkeyEntry,
    MkeySigDomain,
    Op,
)
from softverbs.layout import (
    I32,
    U16,
    U32,
    LayoutError,
    Record,
    c_struct,
    markdown_table,
    with_embedded,
)

PROTOCOL_VERSION = 3
MAX_MESSAGE = 1 << 16
MAX_FDS = 4
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


class ProtocolError(Exception):
    """The peer sent something that is not a softverbs message."""


# --- the header -----------------------------------------------------------------------------


class Header(Record):
    """Every message begins with it."""

    DOCS = {
        "length": "bytes of the whole message, header included",
        "op": "the operation (table below)",
        "flags": "bit 0 (FLAG_REPLY): a reply; bit 1 (FLAG_TAIL_FD): the reply's tail is in "
        "the memfd passed with it; requests: 0",
        "seq": "chosen by the requester; the reply repeats it",
        "status": "replies: 0, or an errno (the body is then a UTF-8 message); requests: 0",
    }
    length: U32
    op: U16
    flags: U16
    seq: U32
    status: I32


FLAG_REPLY = 1
#: a reply whose tail does not fit a message: the tail is the whole content of
#: the memfd passed with the reply (sealed), not in the message
FLAG_TAIL_FD = 2
#: what a reply's flags may hold; a request's flags are 0
REPLY_FLAGS = FLAG_REPLY | FLAG_TAIL_FD


# --- messages ----------------------------------------------------------------------------------


def encode(op: Op[Any, Any], seq: int, body: Record, tail: bytes = b"", status: int = 0,
           reply: bool = False) -> bytes:  # fmt: skip
    """One message: the header, the body, the tail."""
    data = body.pack()
    length = Header.size() + len(data) + len(tail)
    if length > MAX_MESSAGE:
        raise ProtocolError(f"a {op.name} message of {length} bytes is too long")
    hdr = Header(length, op.code, FLAG_REPLY if reply else 0, seq & 0xFFFFFFFF, status)
    return hdr.pack() + data + tail


#: the largest tail a reply carries in a memfd (FLAG_TAIL_FD)
MAX_TAIL_FD = 1 << 30


def encode_reply(op: Op[Any, Any], seq: int, body: Record,
                 tail: bytes = b"") -> tuple[bytes, list[int]]:  # fmt: skip
    """A reply and the descriptors it passes.  A reply that does not fit one
    message carries its tail in a sealed memfd instead (FLAG_TAIL_FD): a
    client reads the whole file as the tail."""
    data = body.pack()
    if Header.size() + len(data) + len(tail) <= MAX_MESSAGE:
        return encode(op, seq, body, tail, reply=True), []
    if len(tail) > MAX_TAIL_FD:
        raise ProtocolError(f"a {op.name} reply of {len(tail)} bytes is too long")
    fd = os.memfd_create(f"softverbs-{op.name.lower()}-reply",
                         os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)  # fmt: skip
    try:
        view = memoryview(tail)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)  # fmt: skip
    except BaseException:
        os.close(fd)
        raise
    hdr = Header(Header.size() + len(data), op.code, FLAG_REPLY | FLAG_TAIL_FD,
                 seq & 0xFFFFFFFF, 0)  # fmt: skip
    return hdr.pack() + data, [fd]


def read_tail_fd(fds: list[int]) -> bytes:
    """The tail of a FLAG_TAIL_FD reply: the whole memfd passed with it."""
    if len(fds) != 1:
        raise ProtocolError(f"a reply with its tail in a memfd passes 1 descriptor, not {len(fds)}")
    size = os.fstat(fds[0]).st_size
    if size > MAX_TAIL_FD:
        raise ProtocolError(f"a reply tail of {size} bytes is too long")
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fds[0], size - len(out), len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def encode_error(op_code: int, seq: int, errno_: int, message: str) -> bytes:
    text = message.encode("utf-8", "replace")[: MAX_MESSAGE - Header.size()]
    hdr = Header(Header.size() + len(text), op_code & 0xFFFF, FLAG_REPLY, seq & 0xFFFFFFFF, errno_)
    return hdr.pack() + text


@dataclasses.dataclass
class Message:
    """A decoded message: its header, operation, body record and tail bytes."""

    header: Header
    op: Op[Any, Any]
    body: Any
    tail: bytes

    @property
    def error(self) -> str:
        return self.tail.decode("utf-8", "replace")


#: What an error reply to an unknown operation is decoded as.
UNKNOWN: Op[Any, Any] = Op(0, "UNKNOWN", Empty, Empty)


def decode(data: bytes) -> Message:
    """Parse one message; ProtocolError if it is not a softverbs message."""
    try:
        hdr: Header = Header.unpack(data)
    except LayoutError as exc:
        raise ProtocolError(str(exc)) from None
    if hdr.length != len(data):
        raise ProtocolError(f"the header says {hdr.length} bytes, the message has {len(data)}")
    is_reply = bool(hdr.flags & FLAG_REPLY)
    if hdr.flags & ~(REPLY_FLAGS if is_reply else FLAG_REPLY):
        raise ProtocolError(f"unknown header flags {hdr.flags:#x}")
    rest = memoryview(data)[Header.size() :]
    if is_reply and hdr.status:
        return Message(hdr, BY_CODE.get(hdr.op, UNKNOWN), None, bytes(rest))
    op = BY_CODE.get(hdr.op)
    if op is None:
        raise ProtocolError(f"unknown operation {hdr.op}")
    if not is_reply and hdr.status:
        raise ProtocolError(f"a request's status is 0, not {hdr.status}")
    kind = op.reply if is_reply else op.request
    if kind is None:
        raise ProtocolError(f"{op.name} has no reply")
    try:
        body = kind.unpack(rest)
    except LayoutError as exc:
        raise ProtocolError(f"{op.name}: {exc}") from None
    if not is_reply and not op.request_tail and len(rest) != kind.size():
        raise ProtocolError(f"a {op.name} request is its {kind.__name__} record of "
                            f"{kind.size()} bytes, not {len(rest)}")  # fmt: skip
    return Message(hdr, op, body, bytes(rest[kind.size() :]))


#: A DOORBELL request, header and body, as one struct: the service reads one per
#: post, so it is recognised with one ``unpack`` before the general :func:`decode`
#: (which builds a header record, a body record and a :class:`Message`).
_DOORBELL = struct.Struct("<" + Header._struct.format.lstrip("<")
                          + Doorbell._struct.format.lstrip("<"))  # fmt: skip
_DOORBELL_CODE = DOORBELL.code


def decode_doorbell(data: bytes) -> tuple[int, int] | None:
    """``(qp, queue)`` if ``data`` is a well-formed DOORBELL request, else None
    (anything else, a malformed doorbell included, is :func:`decode`'s)."""
    if len(data) != _DOORBELL.size:
        return None
    length, op, flags, _seq, status, qp, queue = _DOORBELL.unpack(data)
    if op != _DOORBELL_CODE or flags or status or length != _DOORBELL.size:
        return None
    return qp, queue


def send(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


# plain ints: socket's flag enums make every test an IntFlag operation
_MSG_TRUNC = int(socket.MSG_TRUNC)
_MSG_CTRUNC = int(socket.MSG_CTRUNC)


def recv(sock: socket.socket, flags: int = 0) -> tuple[bytes, list[int]]:
    """One packet and its descriptors; EOFError when the peer closed.

    Descriptors are closed again if the packet is malformed (ProtocolError)."""
    # Not socket.recv_fds: in Python 3.11 it ignores its flags argument.
    data, ancdata, mflags, _addr = sock.recvmsg(MAX_MESSAGE, _FD_SPACE, flags)
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    try:
        if not data:
            raise EOFError("peer closed the connection")
        if mflags & _MSG_TRUNC:
            raise ProtocolError(f"a message is at most {MAX_MESSAGE} bytes")
        if mflags & _MSG_CTRUNC:
            raise ProtocolError(f"a message carries at most {MAX_FDS} file descriptors")
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    return data, fds


# --- where the service listens (the policy lives in softverbs.config) ---------------------

default_socket_path = config.default_socket_path
service_disabled = config.service_disabled


# --- constants ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Constant:
    """A value of the protocol: its C name (``SV_`` + name), the field it goes in."""

    name: str
    value: int
    field: str
    meaning: str


#: The protocol's constants, in the order of the header and the docs table: (C name after
#: ``SV_``, the field it goes in, what it means).  A value is not written here: it is the
#: attribute of that name in this module or in :mod:`softverbs.device.records`, so the table
#: cannot disagree with the code.  The row ``KIND_*`` stands for every object kind of
#: ``records.KIND_NAMES``, its meaning followed by the kind's name.
CONSTANT_TABLE: tuple[tuple[str, str, str], ...] = (
    ("PROTOCOL_VERSION", "Hello.version",
     "the version this page describes; HELLO with another is EPROTO"),
    ("MAX_MESSAGE", "Header.length", "bytes of the longest message"),
    ("MAX_FDS", "SCM_RIGHTS", "descriptors one message may pass"),
    ("FLAG_REPLY", "Header.flags", "the message is a reply"),
    ("FLAG_TAIL_FD", "Header.flags", "replies: the tail is the whole memfd passed with the reply"),
    ("HELLO_MEMORY", "Hello.flags", "the request passes the process's own /proc/self/mem"),
    ("HELLO_JOIN", "Hello.flags",
     "join the owner `token` names (a forked child uses its parent's objects)"),
    ("HELLO_DOORBELL_FD", "Hello.flags",
     "the request passes an eventfd, after the memory's descriptor: writing it rings the "
     "client's send queues whose `db` moved"),
    ("FEATURE_DOORBELL_FD", "HelloReply.features", "the service took the doorbell eventfd"),
    ("DESTROY_CASCADE", "Destroy.flags", "destroy what still uses the object first (else EBUSY)"),
    ("REG_MR_HAS_FD", "RegMR.flags, ReregMR.flags",
     "a memfd holding the region is passed; the region starts `offset` bytes in"),
    ("REG_MR_IMPLICIT", "RegMR.flags",
     "an implicit on-demand-paging region: the whole address space"),
    ("OPEN_XRCD_HAS_FD", "OpenXRCD.flags",
     "a file naming the domain is passed (shared by every opener of it)"),
    ("DB_SQ", "Doorbell.queue", "the send queue's db moved"),
    ("DB_RQ", "Doorbell.queue", "the receive queue's db moved"),
    ("CAPTURE_APPEND", "CaptureReq.flags", "the file already holds a pcap header"),
    ("DV_SIG_PIPELINING", "CreateQP.dv_flags", "MLX5DV_QP_CREATE_SIG_PIPELINING"),
    ("MKEY_BLOCK_SIGNATURE", "CreateMkey.flags", "the mkey checks and generates block signatures"),
    ("MKEY_CONF_ACCESS", "MkeyConf.flags", "set `access`"),
    ("MKEY_CONF_LAYOUT", "MkeyConf.flags", "the entries follow"),
    ("MKEY_CONF_SIG", "MkeyConf.flags", "two MkeySigDomain (memory, wire) follow the entries"),
    ("MKEY_CONF_AUTO_COPY", "MkeyConf.flags", "the device works out the copy mask"),
    ("MAX_SLOT", "CreateQP.sq_slot/rq_slot, CreateSRQ.slot", "the largest ring slot (bytes)"),
    ("CM_EVENT_INFO", "CmEvent.flags", "`info` holds an ID (CONNECT_REQUEST: the new one)"),
    ("CM_EVENT_CONN", "CmEvent.flags", "`param` is the event's rdma_conn_param"),
    ("CM_EVENT_UD", "CmEvent.flags", "`param` holds rdma_ud_param's private data, qp_num, qkey"),
    ("CM_EVENT_AH", "CmEvent.flags", "`ah` is rdma_ud_param.ah_attr"),
    ("CM_EVENT_MC", "CmEvent.flags", "`mc` is the multicast group joined"),
    ("KIND_*", "Destroy.kind, AsyncEventRecord.kind", "object kind"),
    ("DEVICE_HOST", "DeviceEntry.kind", "the host device (sv0)"),
    ("DEVICE_UDP", "DeviceEntry.kind", "a UDP link (softverbs link)"),
    ("DEVICE_INPROC", "DeviceEntry.kind", "in-process"),
)  # fmt: skip


def _constants() -> tuple[Constant, ...]:
    """:data:`CONSTANT_TABLE` with its values; a name that has none is an error here,
    at import, not a wrong header."""
    from softverbs.device import records

    out: list[Constant] = []
    for name, field, meaning in CONSTANT_TABLE:
        if name == "KIND_*":
            out += [Constant(f"KIND_{kind.upper()}", code, field, f"{meaning}: {kind}")
                    for code, kind in records.KIND_NAMES.items()]  # fmt: skip
            continue
        value = globals().get(name, getattr(records, name, None))
        if not isinstance(value, int):
            raise TypeError(f"protocol constant {name}: no integer of that name")
        out.append(Constant(name, value, field, meaning))
    return tuple(out)


CONSTANTS = _constants()


def constants_markdown() -> str:
    """The constants table of docs/service-protocol.md."""
    lines = ["| name (C: `SV_` + name) | value | field | meaning |", "|---|---:|---|---|"]
    lines += [f"| `{c.name}` | {c.value} | {c.field} | {c.meaning} |" for c in CONSTANTS]
    return "\n".join(lines)


# --- generated artefacts -------------------------------------------------------------------------

#: with the records of the operations: the inline data of an mkey-configuring driver WQE
_RECORDS: tuple[type[Record], ...] = (
    Header, DeviceEntry, AsyncEventRecord, CompEventRecord, MkeyConf, MkeyEntry, MkeySigDomain,
    CmEvent,
)  # fmt: skip


def records() -> list[type[Record]]:
    """Every record of the protocol, each once, embedded ones first."""
    listed: list[type[Record]] = list(_RECORDS)
    for op in OPS:
        listed.append(op.request)
        if op.reply is not None:
            listed.append(op.reply)
    return [r for r in with_embedded(listed) if r.size()]


def c_header() -> str:
    """``softverbs/native/include/softverbs/protocol.h``, generated from this module."""
    from softverbs.engine import rings

    out = [
        "/* softverbs device service protocol and ring layouts: GENERATED by",
        " * `python -m softverbs.device.protocol --c-header`; do not edit. */",
        "#ifndef SOFTVERBS_PROTOCOL_H", "#define SOFTVERBS_PROTOCOL_H", "",
        "#include <stdint.h>", "",
    ]  # fmt: skip
    out += [f"#define SV_{c.name} {c.value}" for c in CONSTANTS]
    out.append("")
    out += [f"#define SV_OP_{op.name} {op.code}" for op in OPS]
    out += ["", "/* rings (docs/rings.md) */"]
    out += [f"#define SV_RING_{name} {value}" for name, value in rings.C_CONSTANTS.items()]
    out.append("")
    for cls in with_embedded(list(rings.RECORDS)) + records():
        out += [c_struct(cls), ""]
    out.append("#endif")
    return "\n".join(out) + "\n"


def markdown() -> str:
    """The operation and record tables of docs/service-protocol.md."""
    lines = ["| code | operation | request | reply | descriptors | objects | what |",
             "|---:|---|---|---|---|---|---|"]
    for op in OPS:
        reply = op.reply.__name__ if op.reply is not None else "(none)"
        if op.tail:
            reply += f" + {op.tail}"
        objects = "; ".join(
            ([f"creates {KIND_NAMES[op.creates]}"] if op.creates else [])
            + ([f"uses {', '.join(KIND_NAMES[k] for k in op.uses)}"] if op.uses else [])
        )
        lines.append(f"| {op.code} | `{op.name}` | {op.request.__name__} | {reply} | "
                     f"{op.takes.doc or '—'} | {objects or '—'} | {op.doc} |")  # fmt: skip
    for cls in records():
        lines += ["", *markdown_table(cls)]
    return "\n".join(lines)


def cm_markdown() -> str:
    """The RDMA CM's operations table of docs/service-protocol.md (The RDMA CM)."""
    from softverbs.device import ops

    lines = ["| operation | request | reply | what |", "|---|---|---|---|"]
    for op in ops.CM_OPS:
        reply = op.reply.__name__ if op.reply is not None else "(none)"
        lines.append(f"| `{op.name}` | {op.request.__name__} | {reply} | {op.doc} |")
    return "\n".join(lines)


def rings_constants_markdown() -> str:
    """The constants table of docs/rings.md."""
    from softverbs.engine import rings

    lines = ["| name (C: `SV_RING_` + name) | value | meaning |", "|---|---:|---|"]
    for name, value in rings.C_CONSTANTS.items():
        lines.append(f"| `{name}` | {value} | {rings.C_CONSTANT_DOCS[name]} |")
    return "\n".join(lines)


def rings_markdown() -> str:
    """The ring entry tables of docs/rings.md."""
    from softverbs.engine import rings

    out: list[str] = []
    for cls in with_embedded(list(rings.RECORDS)):
        out += [*markdown_table(cls), ""]
    return "\n".join(out).rstrip()


#: the generated blocks of the docs: (file from the repository root, block name,
#: generator); a block lies between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``
GENERATED: tuple[tuple[str, str, Callable[[], str]], ...] = (
    ("docs/service-protocol.md", "protocol", markdown),
    ("docs/rings.md", "rings", rings_markdown),
    ("docs/service-protocol.md", "constants", constants_markdown),
    ("docs/service-protocol.md", "cm", cm_markdown),
    ("docs/rings.md", "ring-constants", rings_constants_markdown),
)
C_HEADER = "src/softverbs/native/include/softverbs/protocol.h"


def refreshed(text: str, name: str, body: str) -> str:
    """``text`` with its generated block ``name`` replaced by ``body``."""
    start, end = f"<!-- generated: {name} -->", f"<!-- end: {name} -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def update(root: str) -> list[str]:
    """Rewrite the generated docs blocks and the C header under ``root``; the
    files that changed."""
    changed = []
    for rel, name, make in GENERATED:
        path = os.path.join(root, rel)
        with open(path) as f:
            old = f.read()
        new = refreshed(old, name, make())
        if new != old:
            with open(path, "w") as f:
                f.write(new)
            changed.append(rel)
    path = os.path.join(root, C_HEADER)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    if old != c_header():
        with open(path, "w") as f:
            f.write(c_header())
        changed.append(C_HEADER)
    return changed


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--c-header"]:
        sys.stdout.write(c_header())
    elif sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown() + "\n")
    elif len(sys.argv) == 3 and sys.argv[1] == "--update":
        for rel in update(sys.argv[2]):
            print(f"updated {rel}")
    else:
        sys.exit("usage: python -m softverbs.device.protocol --c-header | --markdown | "
                 "--update REPO_ROOT")
