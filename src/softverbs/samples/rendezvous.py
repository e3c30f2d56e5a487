"""Connecting two QPs as rdma-core's example programs do: the samples' one rendezvous.

rdma-core's ``libibverbs/examples`` share their ``pp_*`` helpers
(``pingpong.c``); this module is the same for softverbs' samples --
``rc/uc/ud-pingpong``, ``srq-pingpong``, ``xsrq-pingpong``, ``demo`` -- and
for the tests' raw service client (``tests/kits/rawclient.py``), which
applies the same QP transitions through ``MODIFY_QP`` by hand.

Theory of operation
-------------------
1. **The TCP rendezvous.**  The client connects to the first address
   ``getaddrinfo`` offers that accepts (:func:`tcp_connect`); the server
   binds the first passive address that binds (:func:`tcp_listener`,
   :func:`tcp_listen`) and accepts (:func:`tcp_accept`).  What travels is
   each sample's own: the C tools' fixed-size text messages, numbers as
   ``%0Nx`` and then the GID as 32 hex digits, ``:`` between, NUL-padded
   (:func:`address_message`, :func:`parse_address`), read whole with
   :func:`recv_exact`; or the demo's JSON lines.
2. **The QP transitions are data.**  :func:`init_attrs`, :func:`rtr_attrs`
   and :func:`rts_attrs` give, for a QP type, the ``ibv_qp_attr`` fields
   rdma-core's examples set in each step (what differs by type is in
   :data:`RTR_EXTRA` and :data:`RTS_EXTRA`); :func:`mask_of` gives the
   ``ibv_qp_attr_mask`` naming exactly those fields (``enums.QP_ATTR_MASK``), so
   a field is never set without its mask bit nor the reverse.
   :func:`modify` applies one step to a QP; :func:`connect` is
   ``pp_connect_ctx``, INIT -> RTR -> RTS.
3. **Addressing.**  :func:`ah_attr` routes globally (with a GRH) only when
   the peer sent a GID whose interface ID is not zero -- the C tools test
   ``dest->gid.global.interface_id`` -- and by LID otherwise, which RoCE
   refuses when the QP is modified, as rxe does.  :func:`port_lid` and
   :func:`local_gid` are what each side announces.

Failures raise :class:`PingPongError` with the C tools' message; the samples
print it on stderr and exit with status 1.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from softverbs import GID, QP, AHAttr, Context, GlobalRoute, PyverbsError, QPAttr
from softverbs.enums import (
    IBV_LINK_LAYER_ETHERNET,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    QP_ATTR_MASK,
)

DEFAULT_PORT = 18515  #: the TCP rendezvous port of every ibv_*_pingpong (and perftest)
UD_QKEY = 0x11111111  #: the Q_Key of ibv_ud_pingpong


class PingPongError(Exception):
    """A failure the C tool reports on stderr before exiting with status 1."""


# --- the TCP rendezvous -----------------------------------------------------------------------


def tcp_connect(server: str, port: int) -> socket.socket:
    """The client's connection: the first address of ``server`` that accepts."""
    try:
        infos = socket.getaddrinfo(server, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise PingPongError(f"{exc.strerror} for {server}:{port}") from None
    for family, kind, proto, _, addr in infos:
        try:
            s = socket.socket(family, kind, proto)
        except OSError:
            continue
        try:
            s.connect(addr)
        except OSError:
            s.close()
            continue
        return s
    raise PingPongError(f"Couldn't connect to {server}:{port}")


def tcp_listener(port: int) -> socket.socket | None:
    """A bound (not yet listening) TCP socket on ``port``, as the rdma-core
    examples make one: the first address getaddrinfo offers that binds."""
    infos = socket.getaddrinfo(None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                               socket.AI_PASSIVE)  # fmt: skip
    for family, kind, proto, _, addr in infos:
        try:
            s = socket.socket(family, kind, proto)
        except OSError:
            continue
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError:
            s.close()
            continue
        return s
    return None


def tcp_listen(port: int, backlog: int = 1) -> socket.socket:
    """A listening socket on ``port``; PingPongError if none binds."""
    listener = tcp_listener(port)
    if listener is None:
        raise PingPongError(f"Couldn't listen to port {port}")
    listener.listen(backlog)
    return listener


def tcp_accept(listener: socket.socket, failed: str = "accept() failed") -> socket.socket:
    try:
        conn, _ = listener.accept()
    except OSError:
        raise PingPongError(failed) from None
    return conn


def tcp_serve_one(port: int) -> socket.socket:
    """The server's connection: listen on ``port`` for one client, accept it, stop listening."""
    with tcp_listen(port) as listener:
        return tcp_accept(listener)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes (fewer only if the peer closes)."""
    chunks = bytearray()
    while len(chunks) < n:
        part = sock.recv(n - len(chunks))
        if not part:
            break
        chunks += part
    return bytes(chunks)


# --- the C tools' address messages ------------------------------------------------------------


def address_message(numbers: Sequence[tuple[int, int]], gid: bytes, size: int) -> bytes:
    """``"%0Nx:...:%0Nx:%s"``: each ``(value, digits)``, then the 16-byte GID as 32 hex
    digits, NUL-padded to ``size`` bytes (the text cut to ``size - 1``)."""
    text = ":".join([*(f"{value:0{digits}x}" for value, digits in numbers), gid.hex()])
    return text.encode()[: size - 1].ljust(size, b"\0")


def parse_address(msg: bytes, count: int) -> tuple[list[int], bytes]:
    """The ``count`` numbers and the GID of an :func:`address_message`; ValueError
    if it is not one."""
    text = msg.split(b"\0", 1)[0].decode("ascii")
    parts = text.split(":", count)
    if len(parts) != count + 1:
        raise ValueError(f"bad address message {text!r}")
    numbers = [int(p, 16) for p in parts[:count]]
    gid = bytes.fromhex(parts[count][:32])
    if len(gid) != 16:
        raise ValueError(f"GID {parts[count]!r} is not 32 hex digits")
    return numbers, gid


def gid_text(raw: bytes) -> str:
    """A GID as the C tools print it (``inet_ntop``)."""
    return socket.inet_ntop(socket.AF_INET6, raw)


# --- what each side announces -----------------------------------------------------------------


def port_lid(ctx: Context, port: int, failed: str = "Couldn't get port info") -> int:
    """The port's LID; PingPongError if the port has none and needs one (not RoCE)."""
    try:
        port_attr: Any = ctx.query_port(port)
    except PyverbsError:
        raise PingPongError(failed) from None
    lid: int = port_attr.lid
    if port_attr.link_layer != IBV_LINK_LAYER_ETHERNET and not lid:
        raise PingPongError("Couldn't get local LID")
    return lid


def local_gid(ctx: Context, port: int, gidx: int, failed: str) -> bytes:
    """The raw GID of index ``gidx`` (zeros for ``gidx`` < 0, as the C tools without
    ``-g``); PingPongError ``"{failed} {gidx}"`` if there is none."""
    if gidx < 0:
        return bytes(16)
    try:
        return bytes(ctx.query_gid(port, gidx).raw)
    except PyverbsError:
        raise PingPongError(f"{failed} {gidx}") from None


def ah_attr(*, lid: int, gid: bytes, sl: int, port: int, sgid_index: int,
            hop_limit: int = 1) -> AHAttr:  # fmt: skip
    """``ah_attr`` as the C tools fill it: global only if the peer sent a GID."""
    if any(gid[8:]):  # dest->gid.global.interface_id
        gr = GlobalRoute(dgid=GID.from_raw(gid), sgid_index=sgid_index, hop_limit=hop_limit)
        return AHAttr(dlid=lid, sl=sl, src_path_bits=0, is_global=1, port_num=port, gr=gr)
    return AHAttr(dlid=lid, sl=sl, src_path_bits=0, is_global=0, port_num=port)


# --- the QP transitions -----------------------------------------------------------------------

#: what a QP type adds in RTR to the path (MTU, dest QPN, PSN, address): the
#: responder's resources -- rdma-core's examples' values (UC and XRC send: none)
RTR_EXTRA: dict[int, dict[str, int]] = {
    IBV_QPT_RC: {"max_dest_rd_atomic": 1, "min_rnr_timer": 12},
    IBV_QPT_XRC_RECV: {"max_dest_rd_atomic": 0, "min_rnr_timer": 12},
}
#: what a QP type adds in RTS to its first PSN: the requester's timers and retries
RTS_EXTRA: dict[int, dict[str, int]] = {
    IBV_QPT_RC: {"timeout": 14, "retry_cnt": 7, "rnr_retry": 7, "max_rd_atomic": 1},
    IBV_QPT_XRC_SEND: {"timeout": 14, "retry_cnt": 7, "rnr_retry": 7, "max_rd_atomic": 0},
    IBV_QPT_XRC_RECV: {"timeout": 14},
}
STATE_NAMES = {IBV_QPS_INIT: "INIT", IBV_QPS_RTR: "RTR", IBV_QPS_RTS: "RTS"}

#: ibv_qp_attr fields by name, as :func:`modify` and MODIFY_QP take them
Attrs = dict[str, Any]


def init_attrs(qp_type: int, port: int, access: int = 0) -> Attrs:
    """RESET -> INIT: P_Key index 0, the port, and the Q_Key (UD) or the remote rights."""
    attrs: Attrs = {"qp_state": IBV_QPS_INIT, "pkey_index": 0, "port_num": port}
    if qp_type == IBV_QPT_UD:
        attrs["qkey"] = UD_QKEY
    else:
        attrs["qp_access_flags"] = access
    return attrs


def rtr_attrs(qp_type: int, *, dest_qpn: int, rq_psn: int, mtu: int, ah: Any) -> Attrs:
    """INIT -> RTR: the path to the peer (UD: the state alone; its address goes in an AH)."""
    if qp_type == IBV_QPT_UD:
        return {"qp_state": IBV_QPS_RTR}
    return {"qp_state": IBV_QPS_RTR, "path_mtu": mtu, "dest_qp_num": dest_qpn,
            "rq_psn": rq_psn, "ah_attr": ah, **RTR_EXTRA.get(qp_type, {})}  # fmt: skip


def rts_attrs(qp_type: int, sq_psn: int) -> Attrs:
    """RTR -> RTS: the first PSN this side sends."""
    return {"qp_state": IBV_QPS_RTS, "sq_psn": sq_psn, **RTS_EXTRA.get(qp_type, {})}


def mask_of(attrs: Attrs) -> int:
    """The ibv_qp_attr_mask that names exactly ``attrs``."""
    mask = 0
    for name in attrs:
        mask |= QP_ATTR_MASK[name]
    return mask


def modify(qp: QP, attrs: Attrs, which: str = "QP") -> None:
    """One transition; PingPongError ``Failed to modify {which} to {state}``."""
    attr = QPAttr()
    for name, value in attrs.items():
        setattr(attr, name, value)
    try:
        qp.modify(attr, mask_of(attrs))
    except PyverbsError as exc:
        state = STATE_NAMES[attrs["qp_state"]]
        raise PingPongError(f"Failed to modify {which} to {state}\n{exc}") from None


def connect(qp: QP, qp_type: int, *, dest_qpn: int, rq_psn: int, sq_psn: int, mtu: int,
            ah: AHAttr | None, which: str = "QP") -> None:  # fmt: skip
    """``pp_connect_ctx``: INIT -> RTR -> RTS toward the peer's QP ``dest_qpn``."""
    modify(qp, rtr_attrs(qp_type, dest_qpn=dest_qpn, rq_psn=rq_psn, mtu=mtu, ah=ah), which)
    modify(qp, rts_attrs(qp_type, sq_psn), which)
