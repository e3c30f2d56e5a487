"""``softverbs xsrq-pingpong``: rdma-core's ``ibv_xsrq_pingpong`` on softverbs.

Ping-pong over XRC: each side's messages land in one XRC SRQ, reached
through XRC receive QPs of a shared XRC domain.  Options, rendezvous and
output follow ``ibv_xsrq_pingpong`` (rdma-core ``libibverbs/examples``)::

    softverbs xsrq-pingpong -g 1 -c 2                 # server, two clients
    softverbs xsrq-pingpong -g 1 SERVER               # each client

Where the processes meet:

* **the device service** -- with ``SOFTVERBS_SERVICE`` set, the server and
  its clients are separate processes on one host sharing the service's
  ``sv0``; they share one XRC domain through its file, as on a real host;
* **UDP devices** (``softverbs link add``) -- server and client on
  different devices, hosts or network namespaces, speaking RoCEv2;
* **one process** -- ``--loopback`` runs the server and its ``-c`` clients
  as threads of this process, for the embedded ``sv0``.

Theory of operation
-------------------
1. **Resources.**  A buffer of ``size`` bytes and an MR with local write
   access; the XRC domain opened from ``/tmp/xrc_domain`` (``--xrcd-file``)
   with ``O_CREAT``; a receive CQ of ``clients`` entries (on a completion
   channel with ``-e``, armed at once) and a send CQ of as many; one XRC
   SRQ of ``clients`` WRs on the receive CQ.  Then, per client, an XRC
   receive QP (moved to INIT with remote read/write access) and an XRC send
   QP with ``clients * num_tests`` send WRs (moved to INIT).  ``clients``
   receives are posted to the SRQ.  A client has ``clients`` = 1.
2. **Rendezvous** over TCP (port 18515 by default).  Each side describes
   each pair as ``"%04x:%06x:%06x:%06x:%06x:%32s"`` -- LID, receive QPN,
   send QPN, a random 24-bit PSN, SRQ number, and the GID of ``-g`` as 32
   hex digits in byte order -- in a 66-byte NUL-terminated message, and
   prints it (``local:``/``remote:`` lines).  A client connects and sends
   first; the server accepts ``clients`` connections, reads, answers.
   Both then connect the pair: the receive QP to the peer's send QP
   (``min_rnr_timer`` 12, then RTS with ``timeout`` 14), the send QP to the
   peer's receive QP (RTS with ``timeout`` 14, ``retry_cnt`` 7,
   ``rnr_retry`` 7).  Without ``-g`` the GID is zeros and the address is a
   LID, which RoCE cannot use: connecting fails, as on rxe.
3. **Ping-pong.**  The server sends first, one message to each client.
   Every message is the whole buffer to the peer's SRQ, on the send QPs in
   turn (send QP ``(client + count) % clients``: with several clients on
   one host, a message may reach a client's SRQ through another client's
   receive QP -- that is XRC); only the last one to each peer is signaled.
   Each side polls the receive CQ (or sleeps on the channel with ``-e``),
   reposts a receive per completion, and answers the peer it came from
   until it has sent ``num_tests``.  It ends after ``clients * num_tests``
   receives, then polls the send CQ for its ``clients`` signaled sends.
4. **Termination.**  A client sends ``"END\\0"`` and waits for the server's;
   the server waits for every client's, then answers all -- so no one
   destroys a receive QP that a last message to someone else's SRQ still
   needs.  Then ``success``.

Errors print the C tool's message on stderr and exit with status 1.  ODP
(``-o``) fails as the C tool fails on a device without it.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any

from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    SRQ,
    XRCD,
    AHAttr,
    CompChannel,
    Context,
    PyverbsError,
    QPCap,
    QPInitAttrEx,
    RecvWR,
    SendWR,
    SrqInitAttrEx,
    XRCDInitAttr,
    get_device_list,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_XRCD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    IBV_SEND_SIGNALED,
    IBV_SRQ_INIT_ATTR_CQ,
    IBV_SRQ_INIT_ATTR_PD,
    IBV_SRQ_INIT_ATTR_TYPE,
    IBV_SRQ_INIT_ATTR_XRCD,
    IBV_SRQT_XRC,
    IBV_WR_SEND,
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
    bytes_to_mtu,
)
from softverbs.samples import rendezvous as rv
from softverbs.samples.rendezvous import DEFAULT_PORT

MSG_SIZE = 66  #: "%04x:%06x:%06x:%06x:%06x:%32s" and its NUL
TERMINATION = b"END\0"  #: TERMINATION_MSG_SIZE = 4
XRCD_FILE = "/tmp/xrc_domain"
_OUTPUT = threading.Lock()

#: a failure the C tool reports on stderr before exiting with status 1 (the
#: rendezvous helpers raise it too)
XsrqError = rv.PingPongError


# --- command line -----------------------------------------------------------------------


def _num(text: str) -> int:
    """A number as strtol(optarg, NULL, 0) reads it."""
    try:
        return int(text, 0)
    except ValueError:
        if text.isdigit():
            return int(text, 8)
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("server", nargs="?", metavar="SERVER",
                        help="connect to the server on SERVER (else be the server)")  # fmt: skip
    parser.add_argument("-p", "--port", type=_num, default=DEFAULT_PORT,
                        help="listen on/connect to port PORT (default 18515)")  # fmt: skip
    parser.add_argument("-d", "--ib-dev", metavar="DEV",
                        help="use IB device DEV (default first device found)")  # fmt: skip
    parser.add_argument("-i", "--ib-port", type=_num, default=1, metavar="PORT",
                        help="use port PORT of IB device (default 1)")  # fmt: skip
    parser.add_argument("-s", "--size", type=_num, default=4096,
                        help="size of message to exchange (default 4096)")  # fmt: skip
    parser.add_argument("-m", "--mtu", type=_num, default=1024,
                        help="path MTU (default 1024, as the C tool's init())")  # fmt: skip
    parser.add_argument("-c", "--clients", type=_num, default=1,
                        help="number of clients (on server only, default 1)")  # fmt: skip
    parser.add_argument("-n", "--num_tests", "--num-tests", dest="num_tests", type=_num,
                        default=5, help="number of tests per client (default 5)")  # fmt: skip
    parser.add_argument("-l", "--sl", type=_num, default=0, help="service level value")
    parser.add_argument("-e", "--events", action="store_true",
                        help="sleep on CQ events (default poll)")  # fmt: skip
    parser.add_argument("-o", "--odp", action="store_true", help="use on demand paging")
    parser.add_argument("-g", "--gid-idx", type=_num, default=None, metavar="GIDIDX",
                        help="local port gid index (default: the device's first IPv4 RoCEv2 "
                             "GID; -1: none, as ibv_xsrq_pingpong without -g)")  # fmt: skip
    parser.add_argument("--xrcd-file", default=XRCD_FILE, metavar="PATH",
                        help=f"the file that shares the XRC domain (default {XRCD_FILE}; "
                             "softverbs addition)")  # fmt: skip
    parser.add_argument("--loopback", action="store_true",
                        help="run the server and its -c clients in this process "
                             "(softverbs addition)")  # fmt: skip


# --- the rendezvous message ------------------------------------------------------------------


@dataclass
class Dest:
    """``struct pingpong_dest``: one side of a QP pair, as the wire carries it."""

    lid: int
    recv_qpn: int
    send_qpn: int
    psn: int
    srqn: int
    gid: bytes  #: 16 bytes
    pp_cnt: int = 0
    sock: socket.socket | None = None

    def encode(self) -> bytes:
        numbers = ((self.lid, 4), (self.recv_qpn, 6), (self.send_qpn, 6), (self.psn, 6),
                   (self.srqn, 6))  # fmt: skip
        return rv.address_message(numbers, self.gid, MSG_SIZE)

    @classmethod
    def decode(cls, raw: bytes) -> Dest:
        (lid, rqpn, sqpn, psn, srqn), gid = rv.parse_address(raw, 5)
        return cls(lid, rqpn, sqpn, psn, srqn, gid)

    def line(self, who: str) -> str:
        """ADDR_FORMAT: what the C tool prints for each side."""
        gid = rv.gid_text(self.gid)
        return (f"{who:>8}: LID {self.lid:04x}, QPN RECV {self.recv_qpn:06x} "
                f"SEND {self.send_qpn:06x}, PSN {self.psn:06x}, SRQN {self.srqn:06x}, "
                f"GID {gid}")  # fmt: skip


def _read_exactly(sock: socket.socket, n: int, what: str) -> bytes:
    try:
        buf = rv.recv_exact(sock, n)
    except OSError as exc:
        raise XsrqError(f"Couldn't read {what} ({exc})") from None
    if len(buf) != n:
        raise XsrqError(f"{len(buf)}/{n}: Couldn't read {what}")
    return buf


# --- one side -------------------------------------------------------------------------------


class XsrqPingPong:
    """``struct pingpong_context`` and the C tool's functions on it."""

    def __init__(self, args: argparse.Namespace, num_clients: int,
                 out: Any = None) -> None:  # fmt: skip
        self.args = args
        self.num_clients = num_clients
        self.num_tests: int = args.num_tests
        self.size: int = args.size
        self.port: int = args.ib_port
        #: -2 until the device is open: "choose one" (see default_gid_index)
        self.gidx: int = args.gid_idx if args.gid_idx is not None else -2
        self.out = out or sys.stdout
        self.rem: list[Dest] = []
        self.my_psn = [0] * num_clients  #: the PSN each pair announced
        self.recv_qp: list[QP] = []
        self.send_qp: list[QP] = []
        self.channel: CompChannel | None = None
        self._init_ctx()

    def say(self, text: str) -> None:
        with _OUTPUT:  # whole lines, even from --loopback's threads
            self.out.write(text + "\n")
            self.out.flush()

    # pp_init_ctx
    def _init_ctx(self) -> None:
        args = self.args
        names = [d.name.decode() for d in get_device_list()]
        name = args.ib_dev if args.ib_dev else (names[0] if names else "")
        if name not in names:
            raise XsrqError(f"IB device {args.ib_dev or ''} not found\nFailed to open device")
        try:
            self.ctx = Context(name=name)
        except PyverbsError:
            raise XsrqError(f"Couldn't get context for {name}\nFailed to open device") from None
        if self.gidx == -2:
            from softverbs.verbs.addr import default_gid_index

            self.gidx = default_gid_index(self.ctx, self.port)
        if args.odp:
            raise XsrqError("The device isn't ODP capable or does not support XRC send, "
                            "receive and srq with ODP")  # fmt: skip
        self.lid = rv.port_lid(self.ctx, self.port, "Failed to get port info")
        if args.events:
            self.channel = CompChannel(self.ctx)
        self.pd = PD(self.ctx)
        try:
            self.mr = MR(self.pd, self.size, IBV_ACCESS_LOCAL_WRITE)
        except PyverbsError:
            raise XsrqError("Couldn't register MR") from None
        self.xrcd = self._open_xrcd(args.xrcd_file)
        self.recv_cq = CQ(self.ctx, self.num_clients, None, self.channel, 0)
        if self.channel is not None:
            self.recv_cq.req_notify()
        self.send_cq = CQ(self.ctx, self.num_clients, None, None, 0)
        attr = SrqInitAttrEx(max_wr=self.num_clients, max_sge=1)
        attr.comp_mask = (IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ
                          | IBV_SRQ_INIT_ATTR_PD)  # fmt: skip
        attr.srq_type = IBV_SRQT_XRC
        attr.xrcd, attr.cq, attr.pd = self.xrcd, self.recv_cq, self.pd
        try:
            self.srq = SRQ(self.ctx, attr)
        except PyverbsError:
            raise XsrqError("Couldn't create SRQ") from None
        self._create_qps()

    def _open_xrcd(self, path: str) -> XRCD:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o440)
        except OSError as exc:
            print("Couldn't create the file for the XRC Domain but not stopping "
                  f"{exc.errno}", file=sys.stderr)  # fmt: skip
            fd = -1
        try:
            return XRCD(self.ctx, XRCDInitAttr(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
                                               os.O_CREAT, fd))  # fmt: skip
        except PyverbsError as exc:
            raise XsrqError(f"Couldn't Open the XRC Domain {getattr(exc, 'error_code', 0)}"
                            ) from None  # fmt: skip
        finally:
            self.xrcd_fd = fd

    def _create_qps(self) -> None:
        for i in range(self.num_clients):
            init = QPInitAttrEx(qp_type=IBV_QPT_XRC_RECV, comp_mask=IBV_QP_INIT_ATTR_XRCD,
                                xrcd=self.xrcd)  # fmt: skip
            try:
                rqp = QP(self.ctx, init)
            except PyverbsError as exc:
                raise XsrqError(f"Couldn't create recv QP[{i}] errno "
                                f"{getattr(exc, 'error_code', 0)}") from None  # fmt: skip
            rv.modify(rqp, rv.init_attrs(IBV_QPT_XRC_RECV, self.port,
                                         IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
                      f"recv QP[{i}]")  # fmt: skip
            self.recv_qp.append(rqp)
            cap = QPCap(max_send_wr=self.num_clients * self.num_tests, max_recv_wr=0,
                        max_send_sge=1, max_recv_sge=0)  # fmt: skip
            init = QPInitAttrEx(qp_type=IBV_QPT_XRC_SEND, scq=self.send_cq, cap=cap,
                                comp_mask=IBV_QP_INIT_ATTR_PD, pd=self.pd)  # fmt: skip
            try:
                sqp = QP(self.ctx, init)
            except PyverbsError as exc:
                raise XsrqError(f"Couldn't create send QP[{i}] errno "
                                f"{getattr(exc, 'error_code', 0)}") from None  # fmt: skip
            rv.modify(sqp, rv.init_attrs(IBV_QPT_XRC_SEND, self.port), f"send QP[{i}]")
            self.send_qp.append(sqp)
            self.rem.append(Dest(0, 0, 0, 0, 0, bytes(16)))

    # rendezvous
    def send_local_dest(self, sock: socket.socket, index: int) -> None:
        gid = rv.local_gid(self.ctx, self.port, self.gidx, "can't read sgid of index")
        psn = random.getrandbits(24)
        self.my_psn[index] = psn
        mine = Dest(self.lid, self.recv_qp[index].qp_num, self.send_qp[index].qp_num, psn,
                    self.srq.get_srq_num(), gid)  # fmt: skip
        self.say(mine.line("local"))
        try:
            sock.sendall(mine.encode())
        except OSError:
            raise XsrqError("Couldn't send local address") from None

    def recv_remote_dest(self, sock: socket.socket, index: int) -> None:
        raw = _read_exactly(sock, MSG_SIZE, f"remote address [{index}]")
        try:
            dest = Dest.decode(raw)
        except ValueError as exc:
            raise XsrqError(f"Couldn't read remote address [{index}]: {exc}") from None
        self.say(dest.line("remote"))
        dest.sock = sock
        self.rem[index] = dest

    def _ah(self, index: int) -> AHAttr:
        rem = self.rem[index]
        return rv.ah_attr(lid=rem.lid, gid=rem.gid, sl=self.args.sl, port=self.port,
                          sgid_index=self.gidx, hop_limit=5)  # fmt: skip

    def connect_qps(self, index: int) -> None:
        """The receive QP to the peer's send QP, the send QP to the peer's receive QP."""
        rem = self.rem[index]
        mtu = bytes_to_mtu(self.args.mtu)
        psn = self.my_psn[index]
        rv.connect(self.recv_qp[index], IBV_QPT_XRC_RECV, dest_qpn=rem.send_qpn,
                   rq_psn=rem.psn, sq_psn=psn, mtu=mtu, ah=self._ah(index),
                   which=f"recv QP[{index}]")  # fmt: skip
        rv.connect(self.send_qp[index], IBV_QPT_XRC_SEND, dest_qpn=rem.recv_qpn,
                   rq_psn=rem.psn, sq_psn=psn, mtu=mtu, ah=self._ah(index),
                   which=f"send QP[{index}]")  # fmt: skip

    def client_connect(self, server: str, port: int) -> None:
        sock = rv.tcp_connect(server, port)
        self.send_local_dest(sock, 0)
        self.recv_remote_dest(sock, 0)
        self.connect_qps(0)

    def server_connect(self, listener: socket.socket) -> None:
        for i in range(self.num_clients):
            conn = rv.tcp_accept(listener, f"accept() failed for client {i}")
            self.recv_remote_dest(conn, i)
            self.send_local_dest(conn, i)
            self.connect_qps(i)
        listener.close()

    # work requests
    def post_recv(self, cnt: int) -> None:
        wr = RecvWR(0, 1, [SGE(self.mr.buf, self.size, self.mr.lkey)])
        for _ in range(cnt):
            try:
                self.srq.post_recv(wr)
            except PyverbsError:
                raise XsrqError("Failed to post receive to SRQ") from None

    def post_send(self, index: int) -> None:
        """Round robin over the send QPs; only the last send to a peer is signaled."""
        rem = self.rem[index]
        qpi = (index + rem.pp_cnt) % self.num_clients
        rem.pp_cnt += 1
        flags = IBV_SEND_SIGNALED if rem.pp_cnt >= self.num_tests else 0
        wr = SendWR(index, IBV_WR_SEND, 1, sg=[SGE(self.mr.buf, self.size, self.mr.lkey)],
                    send_flags=flags)  # fmt: skip
        wr.set_qp_type_xrc(rem.srqn)
        try:
            self.send_qp[qpi].post_send(wr)
        except PyverbsError as exc:
            raise XsrqError(f"Couldn't post send: {exc}") from None

    def find_qp(self, qpn: int) -> int:
        if self.num_clients == 1:
            return 0
        for i, qp in enumerate(self.recv_qp):
            if qp.qp_num == qpn:
                return i
        print(f"Unable to find qp {qpn:x}", file=sys.stderr)
        return 0

    # the run
    def run(self) -> None:
        total = self.num_clients * self.num_tests
        cnt = 0
        events = 0
        while cnt < total:
            if self.channel is not None:
                try:
                    self.channel.get_cq_event(self.recv_cq)
                except PyverbsError:
                    raise XsrqError("Failed to get cq_event") from None
                events += 1
                self.recv_cq.req_notify()
            while True:
                ne, wcs = self.recv_cq.poll(1)
                if ne == 0:
                    break
                wc = wcs[0]
                if wc.status:
                    raise XsrqError(f"Work completion error {wc.status}")
                self.post_recv(ne)
                qpi = self.find_qp(wc.qp_num)
                if self.rem[qpi].pp_cnt < self.num_tests:
                    self.post_send(qpi)
                cnt += ne
        done = 0
        while done < self.num_clients:
            ne, wcs = self.send_cq.poll(1)
            if ne and wcs[0].status:
                raise XsrqError(f"Work completion error {wcs[0].status}")
            done += ne
        if events:
            self.recv_cq.ack_events(events)

    def client_termination(self) -> None:
        sock = self.rem[0].sock
        assert sock is not None
        try:
            sock.sendall(TERMINATION)
        except OSError:
            raise XsrqError("Couldn't send termination ack") from None
        self._recv_termination(0)

    def server_termination(self) -> None:
        for i in range(self.num_clients):
            self._recv_termination(i)
        for i in range(self.num_clients):
            sock = self.rem[i].sock
            assert sock is not None
            try:
                sock.sendall(TERMINATION)
            except OSError:
                raise XsrqError("Couldn't send termination ack") from None

    def _recv_termination(self, index: int) -> None:
        sock = self.rem[index].sock
        assert sock is not None
        msg = _read_exactly(sock, len(TERMINATION), "remote termination ack")
        if msg != TERMINATION:
            raise XsrqError("Invalid termination ack was accepted")

    def close(self) -> None:
        """pp_close_ctx: everything, in the C tool's order."""
        for sqp, rqp, rem in zip(self.send_qp, self.recv_qp, self.rem, strict=True):
            sqp.close()
            rqp.close()
            if rem.sock is not None:
                rem.sock.close()
        self.srq.close()
        self.xrcd.close()
        if self.xrcd_fd >= 0:
            os.close(self.xrcd_fd)
        self.send_cq.close()
        self.recv_cq.close()
        self.mr.close()
        self.pd.close()
        if self.channel is not None:
            self.channel.close()
        self.ctx.close()


# --- running ----------------------------------------------------------------------------------


def _side(args: argparse.Namespace, server: str | None, listener: socket.socket | None,
          out: Any = None) -> None:  # fmt: skip
    """One ``main()`` of the C tool: a server (with ``listener``) or a client."""
    num_clients = 1 if server is not None else args.clients
    pp = XsrqPingPong(args, num_clients, out)
    try:
        pp.post_recv(num_clients)
        if server is not None:
            pp.client_connect(server, args.port)
        else:
            assert listener is not None
            pp.server_connect(listener)
            for i in range(num_clients):
                pp.post_send(i)
        pp.run()
        if server is not None:
            pp.client_termination()
        else:
            pp.server_termination()
    finally:
        pp.close()
    pp.say("success")


def _check(args: argparse.Namespace) -> str | None:
    if not 0 <= args.port <= 65535:
        return f"port {args.port} is out of range"
    if args.ib_port < 0:
        return f"ib-port {args.ib_port} is out of range"
    if args.mtu not in (256, 512, 1024, 2048, 4096):
        return f"mtu {args.mtu} is not 256, 512, 1024, 2048 or 4096"
    if args.clients < 1 or args.num_tests < 1 or args.size < 1:
        return "clients, num_tests and size must be positive"
    if args.loopback and args.server:
        return "--loopback runs the server and its clients: give no SERVER"
    return None


def run(args: argparse.Namespace) -> int:
    bad = _check(args)
    if bad is not None:
        print(f"softverbs xsrq-pingpong: {bad}", file=sys.stderr)
        return 1
    try:
        if args.loopback:
            _loopback(args)
        elif args.server is not None:
            _side(args, args.server, None)
        else:
            listener = rv.tcp_listen(args.port, args.clients)
            _side(args, None, listener)
    except XsrqError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def _loopback(args: argparse.Namespace) -> None:
    """The server and ``-c`` clients as threads of this process."""
    listener = rv.tcp_listen(args.port, args.clients)
    port = listener.getsockname()[1]
    client_args = argparse.Namespace(**{**vars(args), "port": port})
    errors: list[BaseException] = []

    def client() -> None:
        try:
            _side(client_args, "localhost", None)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, name=f"xsrq-client-{i}", daemon=True)
               for i in range(args.clients)]  # fmt: skip
    for t in threads:
        t.start()
    _side(args, None, listener)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
