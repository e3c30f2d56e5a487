"""A raw client of softverbsd, written from docs/service-protocol.md and docs/rings.md alone.

This module deliberately imports nothing of softverbs' own protocol code
(``softverbs.service``, ``softverbs.device``, ``softverbs.layout``,
``softverbs.engine``): every layout and constant below is transcribed from
the two documents, so a test that drives the service through it checks the
documents as much as the service.  A client in another language would be
written the same way.  rdma-core's enum values (QP states, access flags,
masks, opcodes) are taken from :mod:`softverbs.enums`, as the protocol doc
says they are rdma-core's, and the attributes of a QP's RESET -> RTS walk
from :mod:`softverbs.samples.rendezvous` (plain dictionaries of rdma-core's
examples' values, no protocol code).

What it offers:

* :class:`Rec` -- a little-endian, naturally aligned record (a C struct):
  ``pack(**fields)`` (missing fields are 0) and ``unpack(data)`` -> dict.
* :class:`RawClient` -- one ``SOCK_SEQPACKET`` connection.  ``send`` builds a
  message with any header it is told (wrong flags, a lying length, a
  nonzero status: hostile input is the point), ``recv`` returns the next
  :class:`Reply` (or raises :class:`Closed`), ``call`` does both and
  raises :class:`Refused` on an errno reply.  Helpers create the objects
  a test needs: ``hello``, ``open_device``, ``alloc_pd``, ``create_cq``,
  ``create_qp``, ``modify_qp``, ``doorbell``, ``reg_mr``, ``destroy``,
  ``status``.
* :class:`Ring` -- a ring's memfd mapped, with its header words and slots
  (docs/rings.md), for posting receive WQEs and polling CQEs by hand.

The API only grows: other tests build on it.
"""

from __future__ import annotations

import array
import dataclasses
import errno
import fcntl
import json
import mmap
import os
import socket
import struct
from collections.abc import Iterable, Sequence
from typing import Any

# --- transport (docs/service-protocol.md, Transport) -------------------------------------

MAX_MESSAGE = 65536
MAX_FDS = 4
PROTOCOL_VERSION = 3
FLAG_REPLY = 1  # Header.flags bit 0
FLAG_TAIL_FD = 2  # Header.flags bit 1 (replies): the tail is the memfd passed with the reply

# --- operation codes (the operations table) ----------------------------------------------

HELLO = 1
LIST_DEVICES = 2
OPEN_DEVICE = 3
QUERY_DEVICE = 4
QUERY_PORT = 5
QUERY_GID = 6
QUERY_PKEY = 7
ALLOC_PD = 10
DESTROY = 11
REG_MR = 12
REREG_MR = 13
ALLOC_MW = 14
CREATE_AH = 15
CREATE_COMP_CHANNEL = 16
CREATE_CQ = 17
RESIZE_CQ = 18
CREATE_SRQ = 19
MODIFY_SRQ = 20
QUERY_SRQ = 21
OPEN_XRCD = 22
CREATE_QP = 23
MODIFY_QP = 24
QUERY_QP = 25
OPEN_QP = 26
DOORBELL = 27
COUNTERS = 40
STATUS = 41

# --- flags and kinds ---------------------------------------------------------------------

HELLO_MEMORY = 1  # Hello.flags bit 0: the request passes /proc/self/mem
HELLO_JOIN = 2  # Hello.flags bit 1: join the owner that `token` names
HELLO_DOORBELL_FD = 4  # Hello.flags bit 2: an eventfd follows; writing it rings the send queues
FEATURE_DOORBELL_FD = 1  # HelloReply.features: the service took the eventfd
DESTROY_CASCADE = 1  # Destroy.flags
REG_MR_HAS_FD = 1  # RegMR.flags / ReregMR.flags: a memfd holding the region is passed
DB_SQ, DB_RQ = 1, 2  # Doorbell.queue
# object kinds (Destroy.kind, AsyncEventRecord.kind)
KIND_CTX, KIND_PD, KIND_MR, KIND_MW, KIND_AH, KIND_CHANNEL, KIND_CQ, KIND_SRQ, KIND_QP = range(
    1, 10
)

# --- records -------------------------------------------------------------------------------


class Rec:
    """A record: named fields of struct codes (``Q I H B i``, ``16s``) or nested records."""

    def __init__(self, name: str, fields: Sequence[tuple[str, str | Rec]]) -> None:
        self.name = name
        self.fields = list(fields)
        fmt = "<"
        for _, kind in self.fields:
            fmt += kind.fmt[1:] if isinstance(kind, Rec) else kind
        self.fmt = fmt
        self.struct = struct.Struct(fmt)
        self.size = self.struct.size

    def _flat(self, values: dict[str, Any]) -> list[Any]:
        out: list[Any] = []
        for field, kind in self.fields:
            v = values.get(field)
            if isinstance(kind, Rec):
                out += kind._flat(v or {})
            elif kind.endswith("s"):
                out.append(v if isinstance(v, bytes) else (v or "").encode())
            else:
                out.append(int(v or 0))
        return out

    def pack(self, **values: Any) -> bytes:
        unknown = set(values) - {f for f, _ in self.fields}
        if unknown:
            raise TypeError(f"{self.name} has no field(s) {sorted(unknown)}")
        return self.struct.pack(*self._flat(values))

    def _take(self, flat: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field, kind in self.fields:
            out[field] = kind._take(flat) if isinstance(kind, Rec) else flat.pop(0)
        return out

    def unpack(self, data: bytes, offset: int = 0) -> dict[str, Any]:
        return self._take(list(self.struct.unpack_from(data, offset)))


def _u32(*names: str) -> list[tuple[str, str | Rec]]:
    return [(n, "I") for n in names]


Header = Rec(
    "Header", [("length", "I"), ("op", "H"), ("flags", "H"), ("seq", "I"), ("status", "i")]
)
Empty = Rec("Empty", [])
Hello = Rec("Hello", [("token", "Q"), *_u32("version", "flags", "pid", "reserved")])
HelloReply = Rec(
    "HelloReply", [("token", "Q"), *_u32("version", "service_pid", "ndevices", "features")]
)
DeviceEntry = Rec(
    "DeviceEntry",
    [("name", "64s"), ("node_guid", "Q"), *_u32("index", "node_type", "transport", "kind")],
)
ListDevicesReply = Rec("ListDevicesReply", _u32("count", "reserved"))
OpenDevice = Rec("OpenDevice", [("name", "64s")])
OpenDeviceReply = Rec(
    "OpenDeviceReply", [("node_guid", "Q"), *_u32("ctx", "index", "active_mtu", "gid_count")]
)
Ctx = Rec("Ctx", _u32("ctx", "reserved"))
Handle = Rec("Handle", _u32("handle", "reserved"))
Destroy = Rec("Destroy", _u32("kind", "handle", "flags", "reserved"))
RegMR = Rec(
    "RegMR",
    [
        ("addr", "Q"),
        ("length", "Q"),
        ("iova", "Q"),
        ("offset", "Q"),
        *_u32("pd", "access", "flags", "reserved"),
    ],
)
RegMRReply = Rec("RegMRReply", _u32("mr", "lkey", "rkey", "reserved"))
ReregMR = Rec(
    "ReregMR",
    [
        ("addr", "Q"),
        ("length", "Q"),
        ("offset", "Q"),
        *_u32("mr", "change", "pd", "access", "flags", "reserved"),
    ],
)
Keys = Rec("Keys", _u32("lkey", "rkey"))
AllocMW = Rec("AllocMW", _u32("pd", "type"))
AllocMWReply = Rec("AllocMWReply", _u32("mw", "rkey"))
CreateCQ = Rec("CreateCQ", _u32("ctx", "cqe", "channel", "comp_vector"))
CreateCQReply = Rec("CreateCQReply", _u32("cq", "cqe"))
QPCaps = Rec(
    "QPCaps",
    _u32(
        "max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data", "reserved"
    ),
)
CreateQP = Rec(
    "CreateQP",
    [
        ("send_ops_flags", "Q"),
        ("caps", QPCaps),
        *_u32(
            "ctx",
            "pd",
            "qp_type",
            "send_cq",
            "recv_cq",
            "srq",
            "xrcd",
            "sq_sig_all",
            "create_flags",
            "sq_slot",
            "rq_slot",
            "dv_flags",
        ),
    ],
)
CreateQPReply = Rec("CreateQPReply", [("caps", QPCaps), *_u32("qp", "qpn")])
AddressVector = Rec(
    "AddressVector",
    [
        ("dgid", "16s"),
        *_u32(
            "dlid",
            "sl",
            "src_path_bits",
            "static_rate",
            "is_global",
            "port_num",
            "flow_label",
            "sgid_index",
            "hop_limit",
            "traffic_class",
        ),
    ],
)
QPAttrs = Rec(
    "QPAttrs",
    [
        ("ah", AddressVector),
        ("alt_ah", AddressVector),
        *_u32(
            "qp_state",
            "cur_qp_state",
            "path_mtu",
            "path_mig_state",
            "qkey",
            "rq_psn",
            "sq_psn",
            "dest_qp_num",
            "qp_access_flags",
            "pkey_index",
            "alt_pkey_index",
            "en_sqd_async_notify",
            "sq_draining",
            "max_rd_atomic",
            "max_dest_rd_atomic",
            "min_rnr_timer",
            "port_num",
            "timeout",
            "retry_cnt",
            "rnr_retry",
            "alt_port_num",
            "alt_timeout",
            "rate_limit",
            "reserved",
        ),
    ],
)
ModifyQP = Rec("ModifyQP", [("attr", QPAttrs), *_u32("qp", "mask")])
ModifyQPReply = Rec("ModifyQPReply", _u32("state", "reserved"))
Doorbell = Rec("Doorbell", _u32("qp", "queue"))
QueryGid = Rec("QueryGid", _u32("ctx", "port", "index", "reserved"))
QueryGidReply = Rec("QueryGidReply", [("gid", "16s"), *_u32("gid_type", "ifindex")])
AsyncEventRecord = Rec("AsyncEventRecord", _u32("event_type", "kind", "handle", "qpn"))
CompEventRecord = Rec("CompEventRecord", _u32("cq", "reserved"))

#: request and reply records of the operations the helpers use
REPLIES: dict[int, Rec] = {
    HELLO: HelloReply,
    LIST_DEVICES: ListDevicesReply,
    OPEN_DEVICE: OpenDeviceReply,
    ALLOC_PD: Handle,
    DESTROY: Empty,
    REG_MR: RegMRReply,
    REREG_MR: Keys,
    ALLOC_MW: AllocMWReply,
    CREATE_COMP_CHANNEL: Handle,
    CREATE_CQ: CreateCQReply,
    CREATE_QP: CreateQPReply,
    MODIFY_QP: ModifyQPReply,
    COUNTERS: Empty,
    STATUS: Empty,
}

# --- rings (docs/rings.md) ---------------------------------------------------------------

RING_HEADER = 64
SGEntry = Rec("SGEntry", [("addr", "Q"), *_u32("length", "lkey")])
RecvWQEHeader = Rec("RecvWQEHeader", [("wr_id", "Q"), *_u32("num_sge", "reserved")])
CQEntry = Rec(
    "CQEntry",
    [
        ("wr_id", "Q"),
        *_u32(
            "status", "opcode", "vendor_err", "byte_len", "imm_data", "qp_num", "src_qp", "wc_flags"
        ),
        ("pkey_index", "H"),
        ("slid", "H"),
        ("sl", "B"),
        ("dlid_path_bits", "B"),
        ("wq_kind", "B"),
        ("flags", "B"),
        *_u32("wq_handle", "wqe_index"),
        ("reason", "72s"),
    ],
)
SendWQEHeader = Rec("SendWQEHeader", [("wr_id", "Q"), ("opcode", "B"), ("flags", "B"),
    ("num_sge", "H"), *_u32("inline_len", "imm_data", "invalidate_rkey", "rkey",
    "remote_srqn"), ("remote_addr", "Q"), ("compare_add", "Q"), ("swap", "Q"), *_u32(
    "ah", "remote_qpn", "remote_qkey", "bind_mw", "bind_mr", "bind_rkey"), ("bind_addr", "Q"),
    ("bind_length", "Q"), *_u32("bind_access", "driver_op"), ("caller", "Q"),
    ("reserved0", "Q"), ("reserved1", "Q")])  # fmt: skip
F_SIGNALED, F_FENCE, F_SOLICITED, F_INLINE = 1, 2, 4, 8  # SendWQEHeader.flags
CQE_SIZE = 128
# header words
SQ_PI, SQ_DB, SQ_STATE, SQ_POLLED = 0, 1, 2, 3
RQ_PI, RQ_DB = 0, 1
CQ_PI, CQ_CI, CQ_ARM, CQ_FIRED, CQ_ERROR = 0, 1, 2, 3, 4


def recv_slot_size(max_sge: int) -> int:
    """16 + 16 x max(max_sge, 1), rounded up to 16."""
    return (16 + 16 * max(max_sge, 1) + 15) & ~15


def send_slot_size(max_sge: int, max_inline: int) -> int:
    """128 + 16 x max(max_sge, 1) + max_inline, rounded up to 64."""
    return (128 + 16 * max(max_sge, 1) + max_inline + 63) & ~63


#: the seals the service requires on every memfd it maps (docs/rings.md): with
#: F_SEAL_SHRINK the file never becomes shorter than the service's mapping
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def _memfd(nbytes: int, name: str = "rawclient", seal: bool = True) -> int:
    """A memfd of ``nbytes``, sealed as the service requires unless ``seal`` is False."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


class Ring:
    """A ring's memfd, mapped: a 64-byte header of eight words, then ``size`` slots."""

    def __init__(self, size: int, slot: int, seal: bool = True) -> None:
        self.size, self.slot = size, slot
        self.nbytes = RING_HEADER + size * slot
        self.fd = _memfd(self.nbytes, "rawclient-ring", seal)
        self.map = mmap.mmap(self.fd, self.nbytes)
        self.words = memoryview(self.map).cast("Q")

    def get(self, word: int) -> int:
        return int(self.words[word])

    def set(self, word: int, value: int) -> None:
        self.words[word] = value

    def slot_at(self, index: int) -> int:
        """The byte offset of the slot of ring index ``index``."""
        return RING_HEADER + (index % self.size) * self.slot

    def write(self, index: int, data: bytes) -> None:
        off = self.slot_at(index)
        self.map[off : off + len(data)] = data

    def read(self, index: int, n: int) -> bytes:
        off = self.slot_at(index)
        return bytes(self.map[off : off + n])

    def close(self) -> None:
        self.words.release()
        self.map.close()
        os.close(self.fd)


# --- messages ------------------------------------------------------------------------------


class Closed(Exception):
    """The service closed the connection."""


class Refused(Exception):
    """An errno reply: ``.errno`` and ``.message``."""

    def __init__(self, op: int, err: int, message: str) -> None:
        super().__init__(f"op {op}: {errno.errorcode.get(err, err)}: {message}")
        self.op, self.errno, self.message = op, err, message


@dataclasses.dataclass
class Reply:
    """One message from the service."""

    op: int
    flags: int
    seq: int
    status: int
    payload: bytes  #: everything after the header
    fds: list[int]

    @property
    def message(self) -> str:
        return self.payload.decode("utf-8", "replace")

    def body(self, rec: Rec) -> dict[str, Any]:
        return rec.unpack(self.payload)

    def tail(self, rec: Rec) -> bytes:
        """What follows the body ``rec``: in the message, or (FLAG_TAIL_FD) the
        whole memfd passed with it (which is then closed)."""
        if self.flags & FLAG_TAIL_FD:
            assert len(self.fds) == 1, f"FLAG_TAIL_FD with {len(self.fds)} descriptors"
            fd = self.fds.pop()
            try:
                return os.pread(fd, os.fstat(fd).st_size, 0)
            finally:
                os.close(fd)
        return self.payload[rec.size :]


class RawClient:
    """One connection to softverbsd; nothing is checked on the way out."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.seq = 0
        self.keep: list[Any] = []  #: what must outlive requests (event socket ends, rings)

    def close(self) -> None:
        self.sock.close()
        for obj in self.keep:
            obj.close()
        self.keep.clear()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- bytes -----------------------------------------------------------------------------
    def message(
        self,
        op: int,
        body: bytes = b"",
        *,
        flags: int = 0,
        seq: int | None = None,
        status: int = 0,
        length: int | None = None,
    ) -> tuple[bytes, int]:
        """A message (and its seq): the header as told, then ``body``."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        n = Header.size + len(body) if length is None else length
        return Header.pack(length=n, op=op, flags=flags, seq=seq, status=status) + body, seq

    def send_raw(self, data: bytes, fds: Iterable[int] = ()) -> None:
        fds = list(fds)
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.send(data)

    def send(self, op: int, body: bytes = b"", fds: Iterable[int] = (), **header: Any) -> int:
        data, seq = self.message(op, body, **header)
        self.send_raw(data, fds)
        return seq

    def recv(self) -> Reply:
        """The next message; Closed when the service closed the connection."""
        fd_space = socket.CMSG_SPACE(MAX_FDS * 4)
        try:
            data, anc, _flags, _ = self.sock.recvmsg(MAX_MESSAGE, fd_space)
        except ConnectionResetError as exc:
            raise Closed(f"connection reset: {exc}") from None
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[: len(payload) - len(payload) % 4])
                fds += list(a)
        if not data:
            raise Closed("the service closed the connection")
        h = Header.unpack(data)
        assert h["length"] == len(data), f"reply length {h['length']} != {len(data)}"
        return Reply(h["op"], h["flags"], h["seq"], h["status"], data[Header.size :], fds)

    def closed(self) -> bool:
        """True when the service has closed the connection (after any replies)."""
        try:
            while True:
                self.recv()
        except Closed:
            return True
        except TimeoutError:
            return False

    def call(self, op: int, body: bytes = b"", fds: Iterable[int] = (), **header: Any) -> Reply:
        """Send a request and wait for its reply; Refused if the status is an errno."""
        seq = self.send(op, body, fds, **header)
        r = self.recv()
        assert r.flags & FLAG_REPLY, f"expected a reply, got flags {r.flags}"
        assert r.seq == seq or r.seq == 0, f"reply seq {r.seq} for request {seq}"
        if r.status:
            raise Refused(r.op, r.status, r.message)
        return r

    # --- operations ------------------------------------------------------------------------
    def hello(
        self,
        flags: int = 0,
        pid: int | None = None,
        token: int = 0,
        memory: bool = False,
        bell: int | None = None,
        **header: Any,
    ) -> dict[str, Any]:
        """HELLO; with ``memory``, pass /proc/self/mem (and set HELLO_MEMORY);
        with ``bell``, pass that descriptor as the doorbell eventfd (and set
        HELLO_DOORBELL_FD; the caller keeps its copy)."""
        fds: list[int] = []
        if memory:
            flags |= HELLO_MEMORY
            fds.append(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC))
        if bell is not None:
            flags |= HELLO_DOORBELL_FD
        try:
            body = Hello.pack(
                token=token,
                version=PROTOCOL_VERSION,
                flags=flags,
                pid=os.getpid() if pid is None else pid,
            )
            passed = fds if bell is None else [*fds, bell]
            return self.call(HELLO, body, passed, **header).body(HelloReply)
        finally:
            for fd in fds:
                os.close(fd)

    def list_devices(self) -> list[dict[str, Any]]:
        r = self.call(LIST_DEVICES)
        n = r.body(ListDevicesReply)["count"]
        return [
            DeviceEntry.unpack(r.payload, ListDevicesReply.size + i * DeviceEntry.size)
            for i in range(n)
        ]

    def open_device(self, name: str = "") -> int:
        """A context on ``name`` (default: the first device); its async event socket is
        kept as :attr:`events`."""
        if not name:
            name = self.list_devices()[0]["name"].rstrip(b"\0").decode()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            r = self.call(OPEN_DEVICE, OpenDevice.pack(name=name), [theirs.fileno()])
        finally:
            theirs.close()
        self.events = mine
        self.keep.append(mine)
        return int(r.body(OpenDeviceReply)["ctx"])

    def alloc_pd(self, ctx: int) -> int:
        return int(self.call(ALLOC_PD, Ctx.pack(ctx=ctx)).body(Handle)["handle"])

    def destroy(self, kind: int, handle: int, flags: int = 0) -> None:
        self.call(DESTROY, Destroy.pack(kind=kind, handle=handle, flags=flags))

    def create_cq(self, ctx: int, cqe: int) -> tuple[int, Ring]:
        ring = Ring(cqe, CQE_SIZE)
        self.keep.append(ring)
        r = self.call(CREATE_CQ, CreateCQ.pack(ctx=ctx, cqe=cqe), [ring.fd])
        return int(r.body(CreateCQReply)["cq"]), ring

    def create_qp(
        self,
        ctx: int,
        pd: int,
        cq: int,
        qp_type: int,
        *,
        max_send_wr: int = 0,
        max_recv_wr: int = 0,
        max_send_sge: int = 1,
        max_recv_sge: int = 1,
        max_inline_data: int = 0,
    ) -> tuple[dict[str, Any], Ring | None, Ring | None]:
        """A QP with the rings its sizes ask for: (reply, sq ring or None, rq ring or None)."""
        sq = rq = None
        fds = []
        sq_slot = rq_slot = 0
        if max_send_wr:
            sq_slot = send_slot_size(max_send_sge, max_inline_data)
            sq = Ring(max_send_wr, sq_slot)
            fds.append(sq.fd)
            self.keep.append(sq)
        if max_recv_wr:
            rq_slot = recv_slot_size(max_recv_sge)
            rq = Ring(max_recv_wr, rq_slot)
            fds.append(rq.fd)
            self.keep.append(rq)
        caps = {
            "max_send_wr": max_send_wr,
            "max_recv_wr": max_recv_wr,
            "max_send_sge": max_send_sge,
            "max_recv_sge": max_recv_sge,
            "max_inline_data": max_inline_data,
        }
        body = CreateQP.pack(
            caps=caps,
            ctx=ctx,
            pd=pd,
            qp_type=qp_type,
            send_cq=cq,
            recv_cq=cq,
            sq_slot=sq_slot,
            rq_slot=rq_slot,
        )
        return self.call(CREATE_QP, body, fds).body(CreateQPReply), sq, rq

    def modify_qp(self, qp: int, mask: int, **attr: Any) -> int:
        """MODIFY_QP; the QP's new state."""
        body = ModifyQP.pack(attr=attr, qp=qp, mask=mask)
        return int(self.call(MODIFY_QP, body).body(ModifyQPReply)["state"])

    def query_gid(self, ctx: int, index: int, port: int = 1) -> bytes:
        r = self.call(QUERY_GID, QueryGid.pack(ctx=ctx, port=port, index=index))
        return bytes(r.body(QueryGidReply)["gid"])

    def connect_rc(self, qp: int, remote_qpn: int, dgid: bytes, sgid_index: int = 1,
                   access: int = 0) -> None:  # fmt: skip
        """RESET -> INIT -> RTR -> RTS toward ``remote_qpn`` at ``dgid``: the attributes
        and masks of rdma-core's examples (:mod:`softverbs.samples.rendezvous`), sent as
        MODIFY_QP bodies (the record's address field is ``ah``)."""
        from softverbs.enums import IBV_MTU_1024, IBV_QPT_RC
        from softverbs.samples import rendezvous as rv

        av = {"dgid": dgid, "is_global": 1, "port_num": 1, "sgid_index": sgid_index,
              "hop_limit": 64}  # fmt: skip
        steps = (rv.init_attrs(IBV_QPT_RC, 1, access),
                 rv.rtr_attrs(IBV_QPT_RC, dest_qpn=remote_qpn, rq_psn=0, mtu=IBV_MTU_1024, ah=av),
                 rv.rts_attrs(IBV_QPT_RC, sq_psn=0))  # fmt: skip
        for attrs in steps:
            fields = {("ah" if name == "ah_attr" else name): v for name, v in attrs.items()}
            self.modify_qp(qp, rv.mask_of(attrs), **fields)

    def doorbell(self, qp: int, queue: int) -> None:
        self.send(DOORBELL, Doorbell.pack(qp=qp, queue=queue))

    def reg_mr(
        self, pd: int, length: int, access: int, addr: int = 0x10000, memfd: int | None = None
    ) -> dict[str, Any]:
        """REG_MR of ``length`` bytes of a memfd (a new one unless given) at offset 0."""
        own = memfd is None
        fd = _memfd(length, "rawclient-mr") if memfd is None else memfd
        try:
            body = RegMR.pack(
                addr=addr, length=length, iova=addr, pd=pd, access=access, flags=REG_MR_HAS_FD
            )
            return self.call(REG_MR, body, [fd]).body(RegMRReply)
        finally:
            if own:
                os.close(fd)

    def rereg_mr(self, mr: int, change: int, *, access: int = 0, pd: int = 0, addr: int = 0,
                 length: int = 0, memfd: int | None = None) -> dict[str, Any]:  # fmt: skip
        """REREG_MR (``change``: IBV_REREG_MR_CHANGE_* bits); with ``memfd``, the new
        translation is ``length`` bytes of it at offset 0, mapped at ``addr``.  The keys."""
        body = ReregMR.pack(
            mr=mr,
            change=change,
            pd=pd,
            access=access,
            addr=addr,
            length=length,
            flags=REG_MR_HAS_FD if memfd is not None else 0,
        )
        fds = [memfd] if memfd is not None else []
        return self.call(REREG_MR, body, fds).body(Keys)

    def status(self) -> dict[str, Any]:
        """STATUS, as the JSON document its reply carries."""
        r = self.call(STATUS)
        doc: dict[str, Any] = json.loads(r.tail(Empty))
        return doc


def wait_cq(client: RawClient, ring: Ring, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Poll until ``n`` CQEs came (round trips to the service between polls)."""
    import time

    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += poll_cq(ring)
        if len(got) < n:
            client.call(LIST_DEVICES)  # lets the service run its engine a turn
            time.sleep(0.01)
    return got


def poll_cq(ring: Ring) -> list[dict[str, Any]]:
    """Every CQE the device wrote and the ring's ``ci`` has not passed; moves ``ci``."""
    out = []
    ci, pi = ring.get(CQ_CI), ring.get(CQ_PI)
    for i in range(ci, pi):
        out.append(CQEntry.unpack(ring.read(i, CQE_SIZE)))
    ring.set(CQ_CI, pi)
    return out
