"""``softverbs rc-pingpong``, ``uc-pingpong``, ``ud-pingpong``: rdma-core's ping-pong tools.

These are the programs ``ibv_rc_pingpong``, ``ibv_uc_pingpong`` and
``ibv_ud_pingpong`` from rdma-core's ``libibverbs/examples``, rewritten on
the softverbs (pyverbs-shaped) API.  They behave like the C tools on the
wire and on the terminal, so either end of a run may be the C tool on Linux
rxe or a RoCE NIC and the other end softverbs::

    host A$ softverbs rc-pingpong -d sv1 -g 1            # server
    host B$ ibv_rc_pingpong -d rxe0 -g 1 hostA            # client

Theory of operation
-------------------
1. **Resources.**  One buffer of ``size`` bytes (``size + 40`` for UD: a UD
   receive starts with the 40-byte GRH) filled with 0x7b, one MR on it with
   local write access, one CQ of ``rx_depth + 1`` entries (with a completion
   channel under ``-e``), one QP with ``max_send_wr`` 1, ``max_recv_wr``
   ``rx_depth`` and one SGE each way.  The QP is moved to INIT with the
   attribute mask the C tool uses (UD: Q_Key 0x11111111), and ``rx_depth``
   receives are posted.
2. **Rendezvous** over TCP (port 18515 by default).  Each side describes
   itself as ``"%04x:%06x:%06x:%s"`` -- LID, QPN, a random 24-bit PSN and the
   GID of ``-g`` as 32 hex digits in byte order -- in a 52-byte
   NUL-terminated message.  The client (the side given a server name)
   connects and sends its message; the server reads it, connects its QP,
   answers with its own message and waits for the client's ``"done\\0"``
   (5 bytes).  The client then connects its QP.  Without ``-g`` the GID is
   all zeros and the C tools address by LID, which RoCE cannot do: the QP
   (or AH) modify fails, as it does with rxe.
3. **Connecting** is INIT -> RTR -> RTS with the C tool's attributes and
   masks.  RC: path MTU ``-m``, ``max_dest_rd_atomic`` 1, ``min_rnr_timer``
   12, ``timeout`` 14, ``retry_cnt`` 7, ``rnr_retry`` 7, ``max_rd_atomic`` 1.
   UC: path MTU, dest QPN and PSNs only.  UD: state changes only, plus an
   address handle for the peer (``hop_limit`` 1, SL ``-l``).
4. **Ping-pong.**  Every send is signaled (``sq_sig_all`` is 0) and sends the
   whole buffer (UD: the ``size`` bytes after the GRH space) to the peer,
   where it lands in the same buffer.  The client posts the first send.
   From then on each side posts its next send only when both its previous
   send and its previous receive have completed, so the two sides take turns.
   Receives are replenished to ``rx_depth`` whenever one or fewer remain
   posted.  The run ends when ``iters`` sends and ``iters`` receives have
   completed; any completion that is not a success ends it with exit status
   1.  With ``-e`` the loop sleeps on the completion channel and re-arms the
   CQ before each poll.
5. **Report.**  ``bytes = size * iters * 2`` (both directions) and the
   elapsed time give the two closing lines, in the C tool's format.  With
   ``-c`` the client writes 0 at the start of every page of its buffer
   before the first send, and the server checks those bytes at the end.

Options the device cannot honour fail the way the C tools fail on a device
without the feature: on-demand paging (``-o``, ``-O``, ``-P``), completion
timestamps (``-t``) and device memory (``-j``).  ``-N`` (the ``ibv_wr_*``
send API) is supported through :class:`~softverbs.QPEx`.

Errors print the C tool's message on stderr and exit with status 1; a bad
command line prints the usage and exits with status 1, as ``getopt`` does in
the C tools.
"""

from __future__ import annotations

import argparse
import mmap
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from softverbs import (
    AH,
    CQ,
    MR,
    PD,
    QP,
    SGE,
    CompChannel,
    Context,
    PyverbsError,
    QPCap,
    QPEx,
    QPInitAttr,
    QPInitAttrEx,
    RecvWR,
    SendWR,
    get_device_list,
    wc_status_str,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_QP_EX_WITH_SEND,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
    bytes_to_mtu,
    mtu_to_bytes,
)
from softverbs.samples import rendezvous as rv
from softverbs.samples.rendezvous import DEFAULT_PORT, UD_QKEY, PingPongError
from softverbs.verbs.addr import default_gid_index

MSG_SIZE = 52  #: sizeof "0000:000000:000000:" + 32 hex digits + NUL
DONE = b"done\0"  #: the client's last rendezvous message (sizeof "done")
RECV_WRID, SEND_WRID = 1, 2  #: PINGPONG_RECV_WRID, PINGPONG_SEND_WRID
GRH_SIZE = 40  #: a UD receive buffer starts with the GRH (IPv4: 20 zeros + header)
FILL = 0x7B  #: the C tools memset their buffer to 0x7b
PAGE_SIZE = mmap.PAGESIZE

#: Each subcommand's transport, and what differs between the three C tools.
KINDS: dict[str, int] = {"rc": IBV_QPT_RC, "uc": IBV_QPT_UC, "ud": IBV_QPT_UD}


# --------------------------------------------------------------------------
# command line


def _kind(parser: argparse.ArgumentParser) -> str:
    """rc, uc or ud, from the subcommand name (``softverbs <kind>-pingpong``)."""
    command = parser.get_default("command") or parser.prog.split()[-1]
    kind = str(command).split("-", 1)[0]
    if kind not in KINDS:
        raise ValueError(f"not a ping-pong subcommand: {command!r}")
    return kind


def _uint(text: str) -> int:
    """A number as strtoul(optarg, NULL, 0) reads it: decimal, 0x hex or 0 octal."""
    try:
        value = int(text, 0)
    except ValueError:
        if text.startswith("0") and text.isdigit():
            return int(text, 8)
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None


Option = tuple[tuple[str, ...], dict[str, Any]]  #: argparse flags and keywords


def _opt(*flags: str, **keywords: Any) -> Option:
    return flags, keywords


#: The options of rdma-core's ping-pong tools, by ``argparse`` dest.  Each tool adds the
#: ones it has, in its order (:func:`add_options`); ``{size}`` and ``{tool}`` in a help
#: text are the tool's default size and name.
OPTIONS: dict[str, Option] = {
    "server": _opt("server", nargs="?", metavar="SERVER",
                   help="connect to the server at SERVER (default: be the server)"),
    "port": _opt("-p", "--port", type=_uint, default=DEFAULT_PORT,
                 help=f"listen on/connect to port PORT (default {DEFAULT_PORT})"),
    "ib_dev": _opt("-d", "--ib-dev", metavar="DEV",
                   help="use IB device DEV (default first device found)"),
    "ib_port": _opt("-i", "--ib-port", type=_int, default=1, metavar="PORT",
                    help="use port PORT of IB device (default 1)"),
    "size": _opt("-s", "--size", type=_uint, help="size of message to exchange (default {size})"),
    "mtu": _opt("-m", "--mtu", type=_int, default=1024, help="path MTU (default 1024)"),
    "rx_depth": _opt("-r", "--rx-depth", type=_uint, default=500, metavar="DEP",
                     help="number of receives to post at a time (default 500)"),
    "iters": _opt("-n", "--iters", type=_uint, default=1000,
                  help="number of exchanges (default 1000)"),
    "sl": _opt("-l", "--sl", type=_int, default=0, help="service level value"),
    "events": _opt("-e", "--events", action="count", default=0,
                   help="sleep on CQ events (default poll)"),
    "gid_idx": _opt("-g", "--gid-idx", type=_int, default=None, metavar="GIDIDX",
                    help="local port gid index (default: the device's first IPv4 RoCEv2 GID; "
                         "-1: none, as {tool} without -g)"),
    "chk": _opt("-c", "--chk", action="store_true", help="validate received buffer"),
    "odp": _opt("-o", "--odp", action="store_true", help="use on demand paging"),
    "iodp": _opt("-O", "--iodp", action="store_true", help="use implicit on demand paging"),
    "prefetch": _opt("-P", "--prefetch", action="store_true", help="prefetch an ODP MR"),
    "ts": _opt("-t", "--ts", action="store_true", help="get CQE with timestamp"),
    "dm": _opt("-j", "--dm", action="store_true", help="use device memory"),
    "new_send": _opt("-N", "--new_send", action="store_true", help="use new post send WR API"),
}  # fmt: skip


def add_options(parser: argparse.ArgumentParser, names: Iterable[str], *, tool: str, size: int,
                own: dict[str, Option] | None = None
                ) -> None:  # fmt: skip
    """Add the options ``names`` of :data:`OPTIONS` (or of ``own``, a tool's own ones),
    in that order, with getopt's error handling (usage on stderr, exit status 1)."""
    setattr(parser, "error", _usage_error(parser))  # noqa: B010 (a method override)
    table = {**OPTIONS, **(own or {})}
    for name in names:
        flags, keywords = table[name]
        keywords = dict(keywords, help=keywords["help"].format(size=size, tool=tool))
        if name == "size":
            keywords["default"] = size
        parser.add_argument(*flags, **keywords)


#: the options of ibv_{rc,uc,ud}_pingpong, in their order (UD has no -m; RC adds ODP & co.)
_COMMON = ("server", "port", "ib_dev", "ib_port", "size", "mtu", "rx_depth", "iters", "sl",
           "events", "gid_idx", "chk")  # fmt: skip
_RC_ONLY = ("odp", "iodp", "prefetch", "ts", "dm", "new_send")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kind = _kind(parser)
    parser.set_defaults(kind=kind)
    tool = f"ibv_{kind}_pingpong"
    parser.description = (
        f"rdma-core's {tool} on softverbs: without SERVER, wait for a client on the TCP "
        f"port; with SERVER, connect to it. Interoperates with {tool}."
    )
    names = [n for n in _COMMON if not (kind == "ud" and n == "mtu")]
    if kind == "rc":
        names += _RC_ONLY
    add_options(parser, names, tool="ibv_*_pingpong", size=1024 if kind == "ud" else 4096)


def _usage_error(parser: argparse.ArgumentParser) -> Callable[[str], NoReturn]:
    def error(message: str) -> NoReturn:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1)

    return error


def check_common(args: argparse.Namespace) -> None:
    """The checks of the options every ping-pong tool has (:data:`OPTIONS`)."""
    if args.port > 65535:
        raise PingPongError(f"port {args.port} is out of range (at most 65535)")
    if args.ib_port < 1:
        raise PingPongError(f"ib-port {args.ib_port} is out of range (at least 1)")
    mtu = getattr(args, "mtu", None)
    if mtu is not None and mtu not in (256, 512, 1024, 2048, 4096):
        raise PingPongError(f"mtu {mtu} is not one of 256, 512, 1024, 2048, 4096")


def _check_options(args: argparse.Namespace) -> None:
    """The C tools' own option checks (usage -> exit status 1)."""
    check_common(args)
    if args.kind == "rc":
        if args.iodp:
            args.odp = True
        if args.odp and args.dm:
            raise PingPongError("DM memory region can't be on demand")
        if args.prefetch and not args.odp:
            raise PingPongError("prefetch is valid only with on-demand memory region")


# --------------------------------------------------------------------------
# the rendezvous


@dataclass
class Dest:
    """One side's address (the C tools' ``struct pingpong_dest``)."""

    lid: int
    qpn: int
    psn: int
    gid: bytes  #: 16 bytes

    def to_wire(self) -> bytes:
        """The 52-byte message: ``"%04x:%06x:%06x:%s"`` and NUL padding."""
        return rv.address_message(((self.lid, 4), (self.qpn, 6), (self.psn, 6)), self.gid,
                                  MSG_SIZE)  # fmt: skip

    @classmethod
    def from_wire(cls, msg: bytes) -> Dest:
        """Parse a peer's message; ValueError if it is not one."""
        (lid, qpn, psn), gid = rv.parse_address(msg, 3)
        return cls(lid, qpn, psn, gid)

    def line(self, which: str, psn_sep: str = ",") -> str:
        """``  local address:  LID 0x0000, QPN 0x000011, PSN 0x..., GID ::ffff:10.0.0.1``."""
        label = f"{which} address:"
        gid = rv.gid_text(self.gid)
        return (f"  {label:<16}LID 0x{self.lid:04x}, QPN 0x{self.qpn:06x}, "
                f"PSN 0x{self.psn:06x}{psn_sep} GID {gid}")  # fmt: skip


def client_exchange(server: str, port: int, mine: Dest) -> Dest:
    """Connect to the server, send our address, read its address, send "done"."""
    with rv.tcp_connect(server, port) as sock:
        try:
            sock.sendall(mine.to_wire())
        except OSError:
            raise PingPongError("Couldn't send local address") from None
        try:
            msg = rv.recv_exact(sock, MSG_SIZE)
            if len(msg) != MSG_SIZE:
                raise OSError(f"read {len(msg)} of {MSG_SIZE} bytes")
            sock.sendall(DONE)
        except OSError as exc:
            raise PingPongError(
                f"client read/write: {exc}\nCouldn't read/write remote address"
            ) from None
    try:
        return Dest.from_wire(msg)
    except ValueError as exc:
        raise PingPongError(f"Couldn't read remote address: {exc}") from None


def server_exchange(port: int, mine: Dest, connect: Callable[[Dest], None]) -> Dest:
    """Wait for one client, read its address, connect to it, answer, await "done"."""
    with rv.tcp_serve_one(port) as conn:
        msg = rv.recv_exact(conn, MSG_SIZE)
        if len(msg) != MSG_SIZE:
            raise PingPongError(f"{len(msg)}/{MSG_SIZE}: Couldn't read remote address")
        try:
            remote = Dest.from_wire(msg)
        except ValueError as exc:
            raise PingPongError(f"Couldn't read remote address: {exc}") from None
        try:
            connect(remote)
        except PingPongError as exc:
            raise PingPongError(f"{exc}\nCouldn't connect to remote QP") from None
        try:
            conn.sendall(mine.to_wire())
            done = bytearray()
            while len(done) < len(DONE):  # the C server reads once and wants 5 bytes
                part = conn.recv(MSG_SIZE - len(done))
                if not part:
                    break
                done += part
        except OSError:
            done = bytearray()
        if len(done) != len(DONE):
            raise PingPongError("Couldn't send/recv local address")
    return remote


# --------------------------------------------------------------------------
# the verbs side


class PingPong:
    """One end of the ping-pong: the C tools' ``struct pingpong_context``."""

    def __init__(self, args: argparse.Namespace, devname: str) -> None:
        self.args = args
        self.kind: str = args.kind
        self.qp_type = KINDS[self.kind]
        self.size: int = args.size
        self.rx_depth: int = args.rx_depth
        self.port: int = args.ib_port
        self.ud = self.qp_type == IBV_QPT_UD
        self.offset = GRH_SIZE if self.ud else 0  #: where the message starts in the buffer
        self.send_flags = IBV_SEND_SIGNALED
        self.ah: AH | None = None
        self.channel: CompChannel | None = None
        self.pending = 0
        self.num_cq_events = 0
        self.remote_qpn = 0
        try:
            self.ctx = Context(name=devname)
        except PyverbsError as exc:
            raise PingPongError(f"Couldn't get context for {devname}\n{exc}") from None
        if args.gid_idx is None:
            args.gid_idx = default_gid_index(self.ctx)
        try:
            self._init(args)
        except BaseException:
            self.ctx.close()
            raise

    def _init(self, args: argparse.Namespace) -> None:
        ctx = self.ctx
        if self.ud:
            try:
                port_attr: Any = ctx.query_port(self.port)
            except PyverbsError:
                raise PingPongError(f"Unable to query port info for port {self.port}") from None
            mtu = mtu_to_bytes(port_attr.active_mtu)
            if self.size > mtu:
                raise PingPongError(f"Requested size larger than port MTU ({mtu})")
        if args.events:
            self.channel = _make(CompChannel, "Couldn't create completion channel", ctx)
        self.pd = _make(PD, "Couldn't allocate PD", ctx)
        if self.kind == "rc":
            self._unsupported_features(args)
        length = self.size + self.offset
        self.mr = _make(MR, "Couldn't register MR", self.pd, length, IBV_ACCESS_LOCAL_WRITE)
        self.buf = self.mr.view
        self.buf[:] = bytes([FILL]) * length
        self.cq = _make(CQ, "Couldn't create CQ", ctx, self.rx_depth + 1, None, self.channel, 0)
        cap = QPCap(max_send_wr=1, max_recv_wr=self.rx_depth, max_send_sge=1, max_recv_sge=1)
        self.qp: QP
        if getattr(args, "new_send", False):
            attr_ex = QPInitAttrEx(qp_type=self.qp_type, scq=self.cq, rcq=self.cq, cap=cap,
                                   comp_mask=IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                   pd=self.pd, send_ops_flags=IBV_QP_EX_WITH_SEND)  # fmt: skip
            self.qp = _make(QPEx, "Couldn't create QP", ctx, attr_ex)
        else:
            init = QPInitAttr(qp_type=self.qp_type, scq=self.cq, rcq=self.cq, cap=cap,
                              sq_sig_all=0)  # fmt: skip
            self.qp = _make(QP, "Couldn't create QP", self.pd, init)
        _, init_attr = self.qp.query(0)
        if init_attr.cap.max_inline_data >= self.size:
            self.send_flags |= IBV_SEND_INLINE
        rv.modify(self.qp, rv.init_attrs(self.qp_type, self.port))

    @staticmethod
    def _unsupported_features(args: argparse.Namespace) -> None:
        """What ibv_rc_pingpong checks in ibv_query_device_ex: softverbs has none of it."""
        if args.odp:
            raise PingPongError("The device isn't ODP capable or does not support RC send "
                                "and receive with ODP")  # fmt: skip
        if args.ts:
            raise PingPongError("The device isn't completion timestamp capable")
        if args.dm:
            raise PingPongError("Device doesn't support dm allocation")

    # --- addresses ---------------------------------------------------------------
    def local_dest(self, gidx: int) -> Dest:
        lid = rv.port_lid(self.ctx, self.port)
        failed = "Could not get local gid for gid index" if self.ud else "can't read sgid of index"
        gid = rv.local_gid(self.ctx, self.port, gidx, failed)
        return Dest(lid, self.qp.qp_num, random.getrandbits(24), gid)

    def connect(self, my_psn: int, dest: Dest) -> None:
        """``pp_connect_ctx``: INIT -> RTR -> RTS (and the AH for UD)."""
        self.remote_qpn = dest.qpn
        ah = rv.ah_attr(lid=dest.lid, gid=dest.gid, sl=self.args.sl, port=self.port,
                        sgid_index=self.args.gid_idx)  # fmt: skip
        mtu = bytes_to_mtu(self.args.mtu) if not self.ud else 0
        rv.connect(self.qp, self.qp_type, dest_qpn=dest.qpn, rq_psn=dest.psn, sq_psn=my_psn,
                   mtu=mtu, ah=ah)  # fmt: skip
        if self.ud:
            try:
                self.ah = AH(self.pd, attr=ah)
            except PyverbsError as exc:
                raise PingPongError(f"Failed to create AH\n{exc}") from None

    # --- work requests ------------------------------------------------------------
    def post_recv(self, n: int) -> int:
        """Post up to ``n`` receives; how many were posted (pp_post_recv)."""
        wr = RecvWR(RECV_WRID, 1, [SGE(self.mr.buf, self.size + self.offset, self.mr.lkey)])
        return post_recvs(self.qp, wr, n)

    def post_send(self) -> None:
        sge = SGE(self.mr.buf + self.offset, self.size, self.mr.lkey)
        try:
            if isinstance(self.qp, QPEx):
                qpx = self.qp
                qpx.wr_start()
                qpx.wr_id = SEND_WRID
                qpx.wr_flags = self.send_flags
                qpx.wr_send()
                qpx.wr_set_sge(sge)
                qpx.wr_complete()
                return
            wr = SendWR(SEND_WRID, num_sge=1, sg=[sge], send_flags=self.send_flags)
            if self.ah is not None:
                wr.set_wr_ud(self.ah, self.remote_qpn, UD_QKEY)
            self.qp.post_send(wr)
        except PyverbsError as exc:
            raise PingPongError(f"Couldn't post send\n{exc}") from None

    def mark_pages(self) -> None:
        """``-c`` on the client: a known byte at the start of every page."""
        for i in range(0, self.size, PAGE_SIZE):
            self.buf[self.offset + i] = (i // PAGE_SIZE) % 1  # "% sizeof(char)", as in C

    def bad_pages(self) -> list[int]:
        return [i // PAGE_SIZE for i in range(0, self.size, PAGE_SIZE)
                if self.buf[self.offset + i] != (i // PAGE_SIZE) % 1]  # fmt: skip

    # --- the loop --------------------------------------------------------------------
    def run_loop(self, iters: int, routs: int) -> None:
        """Poll (or sleep on events) until ``iters`` sends and receives completed."""
        rcnt = scnt = 0
        cq, channel = self.cq, self.channel
        while rcnt < iters or scnt < iters:
            wcs = next_completions(cq, channel, 2)
            self.num_cq_events += channel is not None
            for wc in wcs:
                if wc.status != IBV_WC_SUCCESS:
                    extra = f"\nparse WC failed {len(wcs)}" if self.kind == "rc" else ""
                    raise wc_failure(wc, extra)
                if wc.wr_id == SEND_WRID:
                    scnt += 1
                elif wc.wr_id == RECV_WRID:
                    routs -= 1
                    if routs <= 1:
                        routs += self.post_recv(self.rx_depth - routs)
                        if routs < self.rx_depth:
                            raise PingPongError(f"Couldn't post receive ({routs})")
                    rcnt += 1
                else:
                    raise PingPongError(f"Completion for unknown wr_id {wc.wr_id}")
                self.pending &= ~wc.wr_id
                if scnt < iters and not self.pending:
                    self.post_send()
                    self.pending = RECV_WRID | SEND_WRID

    def close(self) -> None:
        """``pp_close_ctx``: QP, AH, CQ, MR, PD, channel, device."""
        if self.num_cq_events:
            self.cq.ack_events(self.num_cq_events)
        for obj in (self.qp, self.ah, self.cq, self.mr, self.pd, self.channel, self.ctx):
            if obj is not None:
                obj.close()


def _make(cls: Callable[..., Any], failed: str, *args: Any) -> Any:
    try:
        return cls(*args)
    except PyverbsError as exc:
        raise PingPongError(f"{failed}\n{exc}") from None


def _device_name(wanted: str | None) -> str:
    try:
        names = [d.name.decode() for d in get_device_list()]
    except PyverbsError as exc:
        raise PingPongError(f"Failed to get IB devices list: {exc}") from None
    if wanted is None:
        if not names:
            raise PingPongError("No IB devices found")
        return names[0]
    if wanted not in names:
        raise PingPongError(f"IB device {wanted} not found")
    return wanted


# --------------------------------------------------------------------------
# main


def run(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except PingPongError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: end quietly, as the C tools die of SIGINT
        return 130


def _main(args: argparse.Namespace) -> int:
    _check_options(args)
    pp = PingPong(args, _device_name(args.ib_dev))
    try:
        return _session(pp, args)
    finally:
        pp.close()


def _session(pp: PingPong, args: argparse.Namespace) -> int:
    routs = pp.post_recv(pp.rx_depth)
    if routs < pp.rx_depth:
        raise PingPongError(f"Couldn't post receive ({routs})")
    if pp.channel is not None:
        try:
            pp.cq.req_notify(False)
        except PyverbsError:
            raise PingPongError("Couldn't request CQ notification") from None
    mine = pp.local_dest(args.gid_idx)
    print(mine.line("local", ":" if pp.ud else ","), flush=True)
    if args.server:
        remote = client_exchange(args.server, args.port, mine)
    else:
        remote = server_exchange(args.port, mine, lambda d: pp.connect(mine.psn, d))
    print(remote.line("remote"), flush=True)
    if args.server:
        pp.connect(mine.psn, remote)
    pp.pending = RECV_WRID
    if args.server:
        if args.chk:
            pp.mark_pages()
        pp.post_send()
        pp.pending |= SEND_WRID
    timed(lambda: pp.run_loop(args.iters, routs), args.size, args.iters)
    if not args.server and args.chk:
        for page in pp.bad_pages():
            print(f"invalid data in page {page}")
    sys.stdout.flush()
    return 0


# --------------------------------------------------------------------------
# what the ping-pong tools share besides the rendezvous


def next_completions(cq: CQ, channel: CompChannel | None, n: int) -> list[Any]:
    """The next completions, at most ``n``: polled until there is one, or -- with a
    completion channel (``-e``) -- one poll after sleeping on the channel and re-arming
    the CQ (the caller counts the event for ``ack_events``)."""
    if channel is not None:
        try:
            channel.get_cq_event(cq)
        except PyverbsError:
            raise PingPongError("Failed to get cq_event") from None
        try:
            cq.req_notify(False)
        except PyverbsError:
            raise PingPongError("Couldn't request CQ notification") from None
    while True:
        try:
            ne, wcs = cq.poll(n)
        except PyverbsError as exc:
            raise PingPongError(f"poll CQ failed {exc}") from None
        if ne >= 1 or channel is not None:
            return list(wcs)


def post_recvs(queue: Any, wr: RecvWR, n: int) -> int:
    """``pp_post_recv``: post ``wr`` up to ``n`` times on a QP or SRQ; how many went."""
    for i in range(n):
        try:
            queue.post_recv(wr)
        except PyverbsError:
            return i
    return n


def wc_failure(wc: Any, extra: str = "") -> PingPongError:
    """The C tools' message for a completion that is not a success."""
    reason = f" [{wc.reason}]" if wc.reason else ""
    return PingPongError(f"Failed status {wc_status_str(wc.status)} ({wc.status}) "
                         f"for wr_id {wc.wr_id}{reason}{extra}")  # fmt: skip


def timed(loop: Callable[[], None], size: int, iters: int) -> None:
    """Run ``loop`` and print the C tools' two closing lines (bytes count both ways)."""
    start = time.perf_counter()
    loop()
    usec = (time.perf_counter() - start) * 1e6
    nbytes = size * iters * 2
    secs = f"{usec / 1e6:.2f} seconds"
    print(f"{nbytes} bytes in {secs} = {_div(nbytes * 8.0, usec):.2f} Mbit/sec")
    print(f"{iters} iters in {secs} = {_div(usec, iters):.2f} usec/iter")


def _div(a: float, b: float) -> float:
    """a / b as C computes it in floating point (inf or nan for b == 0)."""
    if b:
        return a / b
    return float("nan") if a == 0 else float("inf")
