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
from typing import Any

from softverbs import config
from softverbs.device.ops import BY_CODE, OPS
from softverbs.device.records import (
    KIND_NAMES,
    AsyncEventRecord,
    CmEvent,
    CompEventRecord,
    DeviceEntry,
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


def _constants() -> tuple[Constant, ...]:
    from softverbs.device import records

    out = [
        Constant("PROTOCOL_VERSION", PROTOCOL_VERSION, "Hello.version",
                 "the version this page describes; HELLO with another is EPROTO"),
        Constant("MAX_MESSAGE", MAX_MESSAGE, "Header.length", "bytes of the longest message"),
        Constant("MAX_FDS", MAX_FDS, "SCM_RIGHTS", "descriptors one message may pass"),
        Constant("FLAG_REPLY", FLAG_REPLY, "Header.flags", "the message is a reply"),
        Constant("FLAG_TAIL_FD", FLAG_TAIL_FD, "Header.flags",
                 "replies: the tail is the whole memfd passed with the reply"),
        Constant("HELLO_MEMORY", records.HELLO_MEMORY, "Hello.flags",
                 "the request passes the process's own /proc/self/mem"),
        Constant("HELLO_JOIN", records.HELLO_JOIN, "Hello.flags",
                 "join the owner `token` names (a forked child uses its parent's objects)"),
        Constant("DESTROY_CASCADE", records.DESTROY_CASCADE, "Destroy.flags",
                 "destroy what still uses the object first (else EBUSY)"),
        Constant("REG_MR_HAS_FD", records.REG_MR_HAS_FD, "RegMR.flags, ReregMR.flags",
                 "a memfd holding the region is passed; the region starts `offset` bytes in"),
        Constant("REG_MR_IMPLICIT", records.REG_MR_IMPLICIT, "RegMR.flags",
                 "an implicit on-demand-paging region: the whole address space"),
        Constant("OPEN_XRCD_HAS_FD", records.OPEN_XRCD_HAS_FD, "OpenXRCD.flags",
                 "a file naming the domain is passed (shared by every opener of it)"),
        Constant("DB_SQ", records.DB_SQ, "Doorbell.queue", "the send queue's db moved"),
        Constant("DB_RQ", records.DB_RQ, "Doorbell.queue", "the receive queue's db moved"),
        Constant("CAPTURE_APPEND", records.CAPTURE_APPEND, "CaptureReq.flags",
                 "the file already holds a pcap header"),
        Constant("DV_SIG_PIPELINING", records.DV_SIG_PIPELINING, "CreateQP.dv_flags",
                 "MLX5DV_QP_CREATE_SIG_PIPELINING"),
        Constant("MKEY_BLOCK_SIGNATURE", records.MKEY_BLOCK_SIGNATURE, "CreateMkey.flags",
                 "the mkey checks and generates block signatures"),
        Constant("MKEY_CONF_ACCESS", records.MKEY_CONF_ACCESS, "MkeyConf.flags", "set `access`"),
        Constant("MKEY_CONF_LAYOUT", records.MKEY_CONF_LAYOUT, "MkeyConf.flags",
                 "the entries follow"),
        Constant("MKEY_CONF_SIG", records.MKEY_CONF_SIG, "MkeyConf.flags",
                 "two MkeySigDomain (memory, wire) follow the entries"),
        Constant("MKEY_CONF_AUTO_COPY", records.MKEY_CONF_AUTO_COPY, "MkeyConf.flags",
                 "the device works out the copy mask"),
        Constant("MAX_SLOT", records.MAX_SLOT, "CreateQP.sq_slot/rq_slot, CreateSRQ.slot",
                 "the largest ring slot (bytes)"),
    ]  # fmt: skip
    out += [Constant(f"CM_EVENT_{name}", value, "CmEvent.flags", meaning)
            for name, value, meaning in (
                ("INFO", records.CM_EVENT_INFO,
                 "`info` holds an ID (CONNECT_REQUEST: the new one)"),
                ("CONN", records.CM_EVENT_CONN, "`param` is the event's rdma_conn_param"),
                ("UD", records.CM_EVENT_UD,
                 "`param` holds rdma_ud_param's private data, qp_num, qkey"),
                ("AH", records.CM_EVENT_AH, "`ah` is rdma_ud_param.ah_attr"),
                ("MC", records.CM_EVENT_MC, "`mc` is the multicast group joined"))]  # fmt: skip
    out += [Constant(f"KIND_{name.upper()}", code, "Destroy.kind, AsyncEventRecord.kind",
                     f"object kind: {name}")
            for code, name in records.KIND_NAMES.items()]  # fmt: skip
    out += [Constant(f"DEVICE_{name}", value, "DeviceEntry.kind", meaning)
            for name, value, meaning in (
                ("HOST", records.DEVICE_HOST, "the host device (sv0)"),
                ("UDP", records.DEVICE_UDP, "a UDP link (softverbs link)"),
                ("INPROC", records.DEVICE_INPROC, "in-process"))]  # fmt: skip
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


#: file (from the repository root) -> (block name, generator); a block lies
#: between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``
GENERATED = {
    "docs/service-protocol.md": ("protocol", markdown),
    "docs/rings.md": ("rings", rings_markdown),
}
#: more blocks: (file, block name, generator)
GENERATED_MORE = (
    ("docs/service-protocol.md", "constants", constants_markdown),
    ("docs/service-protocol.md", "cm", cm_markdown),
    ("docs/rings.md", "ring-constants", lambda: rings_constants_markdown()),
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
    blocks = [(rel, name, make) for rel, (name, make) in GENERATED.items()] + list(GENERATED_MORE)
    for rel, name, make in blocks:
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
