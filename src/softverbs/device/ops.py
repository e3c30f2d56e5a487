"""The ops table: every operation of the device, declared once.

As the kernel declares each uverbs method with its handler and attributes
(``uverbs_std_types_*.c``), each operation here names its number, its
request and reply records (:mod:`softverbs.device.records`), its handler
(in the module of its object kind), what it takes beyond its record
(:class:`~softverbs.device.records.Takes`: descriptors, a text tail) and the
object kinds it creates and uses.  Everything else comes from these
declarations:

* dispatch: :meth:`softverbs.device.core.Host.execute` calls ``op.handler``;
* the device service's descriptor rules: ``softverbs.service.server.TAKES``
  has one rule per ``Takes``, applied to the descriptors of the request;
* the C header's ``SV_OP_*`` numbers and the operation table of
  docs/service-protocol.md (:mod:`softverbs.device.protocol`).

An operation without a handler is a connection's own, answered by the
device service (``HELLO``, the RDMA CM's).  ``tests/device/test_ops_table.py``
checks that every operation has all of its parts.
"""

from __future__ import annotations

from typing import Any

from softverbs.device import context, cq, mr, pd, qp, srq, xrc
from softverbs.device.core import Host
from softverbs.device.records import (
    ASYNC_SOCKET,
    CM_SOCKET,
    COMP_SOCKET,
    CQ_RING,
    KIND_AH,
    KIND_CAPTURE,
    KIND_CHANNEL,
    KIND_CQ,
    KIND_CTX,
    KIND_MKEY,
    KIND_MR,
    KIND_MW,
    KIND_PD,
    KIND_QP,
    KIND_SRQ,
    KIND_XRCD,
    PCAP_FILE,
    PROCESS_MEMORY,
    QP_RINGS,
    REGION,
    REPORT_FILE,
    RULES_TEXT,
    SRQ_RING,
    XRCD_FILE,
    AllocMW,
    AllocMWReply,
    CancelSend,
    CaptureReq,
    CmBind,
    CmChannel,
    CmConnect,
    CmCreateId,
    CmIdInfo,
    CmListen,
    CmMcast,
    CmOption,
    CmQpAttr,
    CmQpState,
    CmResolveAddr,
    CmTimeout,
    Count,
    CreateAH,
    CreateCQ,
    CreateCQReply,
    CreateMkey,
    CreateQP,
    CreateQPReply,
    CreateSRQ,
    CreateSRQReply,
    Ctx,
    Destroy,
    DeviceAttrs,
    Doorbell,
    Empty,
    Handle,
    Hello,
    HelloReply,
    Keys,
    ListDevicesReply,
    Mcast,
    MkeyErr,
    MkeyReply,
    ModifyQP,
    ModifyQPReply,
    ModifySRQ,
    Op,
    OpenDevice,
    OpenDeviceReply,
    OpenQP,
    OpenQPReply,
    OpenXRCD,
    PortAttrs,
    QpnReply,
    QueryGid,
    QueryGidReply,
    QueryPkeyReply,
    QueryPort,
    QueryQPReply,
    QuerySRQReply,
    RegMR,
    RegMRReply,
    ReregMR,
    ResizeCQ,
    XrcQpn,
    XrcRcvAlloc,
)

# --- the connection's own (the device service answers them) -------------------------------------

HELLO = Op(1, "HELLO", Hello, HelloReply, takes=PROCESS_MEMORY,
           doc="the first message; the version must match")  # fmt: skip

# --- the device and its context: context.py -----------------------------------------------------

LIST_DEVICES = Op(2, "LIST_DEVICES", Empty, ListDevicesReply, context.list_devices,
                  tail="count DeviceEntry records", doc="the devices of this host")  # fmt: skip
OPEN_DEVICE = Op(3, "OPEN_DEVICE", OpenDevice, OpenDeviceReply, context.open_device,
                 takes=ASYNC_SOCKET, creates=KIND_CTX,
                 doc="ibv_open_device: a context; its objects' async events go to the "
                 "socket")  # fmt: skip
QUERY_DEVICE = Op(4, "QUERY_DEVICE", Ctx, DeviceAttrs, context.query_device, uses=(KIND_CTX,),
                  doc="ibv_query_device(_ex)")  # fmt: skip
QUERY_PORT = Op(5, "QUERY_PORT", QueryPort, PortAttrs, context.query_port, uses=(KIND_CTX,),
                doc="ibv_query_port")  # fmt: skip
QUERY_GID = Op(6, "QUERY_GID", QueryGid, QueryGidReply, context.query_gid, uses=(KIND_CTX,),
               doc="ibv_query_gid(_ex); ENODATA if empty")  # fmt: skip
QUERY_PKEY = Op(7, "QUERY_PKEY", QueryGid, QueryPkeyReply, context.query_pkey, uses=(KIND_CTX,),
                doc="ibv_query_pkey")  # fmt: skip
COUNTERS = Op(40, "COUNTERS", Ctx, Empty, context.counters, uses=(KIND_CTX,),
              tail="JSON: {counter: value}", doc="the device's counters (rxe's names)")  # fmt: skip
STATUS = Op(41, "STATUS", Empty, Empty, context.status,
            tail="JSON: the service, its devices, clients and objects",
            doc="for `softverbs service status` and `softverbs res`")  # fmt: skip
CAPTURE = Op(42, "CAPTURE", CaptureReq, Handle, context.capture, takes=PCAP_FILE,
             creates=KIND_CAPTURE, uses=(KIND_CTX,),
             doc="write the device's packets to a pcap file until the capture is "
             "destroyed")  # fmt: skip
FAULTS = Op(43, "FAULTS", Ctx, Empty, context.faults, takes=RULES_TEXT, uses=(KIND_CTX,),
            tail="request: the rules, as SOFTVERBS_FAULTS (empty: none)",
            doc="seeded faults on the packets this process's QPs send on the context's device",
            request_tail=True)  # fmt: skip
SANITIZE = Op(47, "SANITIZE", Empty, Empty, context.sanitize, takes=REPORT_FILE,
              tail="request: the options, as SOFTVERBS_SANITIZE",
              doc="turn the verbs sanitizer on for this process (docs/sanitizer.md)",
              request_tail=True)  # fmt: skip

# --- any object: core.py (lifetimes) -------------------------------------------------------------

DESTROY = Op(11, "DESTROY", Destroy, Empty, Host.destroy,
             doc="destroy any object by kind and handle (EBUSY if used)")  # fmt: skip

# --- protection domains and address handles: pd.py ----------------------------------------------

ALLOC_PD = Op(10, "ALLOC_PD", Ctx, Handle, pd.alloc_pd, creates=KIND_PD, uses=(KIND_CTX,),
              doc="ibv_alloc_pd")  # fmt: skip
CREATE_AH = Op(15, "CREATE_AH", CreateAH, Handle, pd.create_ah, creates=KIND_AH,
               uses=(KIND_PD,), doc="ibv_create_ah")  # fmt: skip

# --- memory regions, windows, mkeys: mr.py ------------------------------------------------------

REG_MR = Op(12, "REG_MR", RegMR, RegMRReply, mr.reg_mr, takes=REGION, creates=KIND_MR,
            uses=(KIND_PD,),
            doc="ibv_reg_mr: from the memfd if passed, else the process's memory")  # fmt: skip
REREG_MR = Op(13, "REREG_MR", ReregMR, Keys, mr.rereg_mr, takes=REGION, uses=(KIND_MR, KIND_PD),
              doc="ibv_rereg_mr")  # fmt: skip
ALLOC_MW = Op(14, "ALLOC_MW", AllocMW, AllocMWReply, mr.alloc_mw, creates=KIND_MW,
              uses=(KIND_PD,), doc="ibv_alloc_mw")  # fmt: skip
CREATE_MKEY = Op(44, "CREATE_MKEY", CreateMkey, MkeyReply, mr.create_mkey, creates=KIND_MKEY,
                 uses=(KIND_PD,),
                 doc="an indirect mkey (mlx5dv_create_mkey); configured by a driver "
                 "WQE")  # fmt: skip
MKEY_CHECK = Op(45, "MKEY_CHECK", Handle, MkeyErr, mr.mkey_check, uses=(KIND_MKEY,),
                doc="the first signature error the mkey saw since the last check, "
                "cleared")  # fmt: skip

# --- completion channels and CQs: cq.py ---------------------------------------------------------

CREATE_COMP_CHANNEL = Op(16, "CREATE_COMP_CHANNEL", Ctx, Handle, cq.create_comp_channel,
                         takes=COMP_SOCKET, creates=KIND_CHANNEL, uses=(KIND_CTX,),
                         doc="ibv_create_comp_channel: completion events go to the "
                         "socket")  # fmt: skip
CREATE_CQ = Op(17, "CREATE_CQ", CreateCQ, CreateCQReply, cq.create_cq, takes=CQ_RING,
               creates=KIND_CQ, uses=(KIND_CTX, KIND_CHANNEL), doc="ibv_create_cq")  # fmt: skip
RESIZE_CQ = Op(18, "RESIZE_CQ", ResizeCQ, CreateCQReply, cq.resize_cq, takes=CQ_RING,
               uses=(KIND_CQ,),
               doc="ibv_resize_cq: unpolled CQEs move to the new ring")  # fmt: skip

# --- shared receive queues: srq.py --------------------------------------------------------------

CREATE_SRQ = Op(19, "CREATE_SRQ", CreateSRQ, CreateSRQReply, srq.create_srq, takes=SRQ_RING,
                creates=KIND_SRQ, uses=(KIND_CTX, KIND_PD, KIND_XRCD, KIND_CQ),
                doc="ibv_create_srq(_ex)")  # fmt: skip
MODIFY_SRQ = Op(20, "MODIFY_SRQ", ModifySRQ, Empty, srq.modify_srq, takes=SRQ_RING,
                uses=(KIND_SRQ,), doc="ibv_modify_srq")  # fmt: skip
QUERY_SRQ = Op(21, "QUERY_SRQ", Handle, QuerySRQReply, srq.query_srq, uses=(KIND_SRQ,),
               doc="ibv_query_srq")  # fmt: skip

# --- XRC domains: xrc.py ------------------------------------------------------------------------

OPEN_XRCD = Op(22, "OPEN_XRCD", OpenXRCD, Handle, xrc.open_xrcd, takes=XRCD_FILE,
               creates=KIND_XRCD, uses=(KIND_CTX,), doc="ibv_open_xrcd")  # fmt: skip

# --- queue pairs: qp.py -------------------------------------------------------------------------

CREATE_QP = Op(23, "CREATE_QP", CreateQP, CreateQPReply, qp.create_qp, takes=QP_RINGS,
               creates=KIND_QP, uses=(KIND_CTX, KIND_PD, KIND_CQ, KIND_SRQ, KIND_XRCD),
               doc="ibv_create_qp(_ex)")  # fmt: skip
MODIFY_QP = Op(24, "MODIFY_QP", ModifyQP, ModifyQPReply, qp.modify_qp, uses=(KIND_QP,),
               doc="ibv_modify_qp: judged by the device's state table, against its own "
               "state")  # fmt: skip
QUERY_QP = Op(25, "QUERY_QP", Handle, QueryQPReply, qp.query_qp, uses=(KIND_QP,),
              doc="ibv_query_qp")  # fmt: skip
OPEN_QP = Op(26, "OPEN_QP", OpenQP, OpenQPReply, qp.open_qp, creates=KIND_QP,
             uses=(KIND_CTX, KIND_XRCD),
             doc="ibv_open_qp: an XRC receive QP by number")  # fmt: skip
DOORBELL: Op[Doorbell, Empty] = Op(27, "DOORBELL", Doorbell, None, qp.doorbell, uses=(KIND_QP,),
                                   doc="one-way: the application moved a queue's db")  # fmt: skip
XRC_RCV_QP_ALLOC = Op(28, "XRC_RCV_QP_ALLOC", XrcRcvAlloc, QpnReply, qp.xrc_rcv_qp_alloc,
                      uses=(KIND_XRCD,), doc="seed 002's xrc_rcv_qp_alloc")  # fmt: skip
XRC_RCV_QP_REGISTER = Op(29, "XRC_RCV_QP_REGISTER", XrcQpn, Empty, qp.xrc_rcv_qp_register,
                         uses=(KIND_XRCD,), doc="seed 002's xrc_rcv_qp_register")  # fmt: skip
XRC_RCV_QP_UNREGISTER = Op(30, "XRC_RCV_QP_UNREGISTER", XrcQpn, Empty,
                           qp.xrc_rcv_qp_unregister, uses=(KIND_XRCD,),
                           doc="seed 002's xrc_rcv_qp_unregister")  # fmt: skip
ATTACH_MCAST = Op(31, "ATTACH_MCAST", Mcast, Empty, qp.attach_mcast, uses=(KIND_QP,),
                  doc="ibv_attach_mcast: the UD QP receives what is sent to the multicast "
                  "GID")  # fmt: skip
DETACH_MCAST = Op(32, "DETACH_MCAST", Mcast, Empty, qp.detach_mcast, uses=(KIND_QP,),
                  doc="ibv_detach_mcast (EINVAL if the QP is not attached to the "
                  "group)")  # fmt: skip
CANCEL_SEND = Op(46, "CANCEL_SEND", CancelSend, Count, qp.cancel_send, uses=(KIND_QP,),
                 doc="turn the posted, not started send WQEs with wr_id into NOPs "
                 "(mlx5dv_qp_cancel_posted_send_wrs; a SIG_PIPELINING QP in SQD, else "
                 "EINVAL)")  # fmt: skip

# --- the RDMA CM (the device service's CM agent answers them) -----------------------------------

CM_EVENTS = Op(
    51, "CM_EVENTS", Handle, Empty, takes=CM_SOCKET,
    doc="where the RDMA CM events of the IDs on event channel `handle` go "
    "(one CmEvent per packet)",
)
CM_CREATE_ID = Op(52, "CM_CREATE_ID", CmCreateId, Handle, doc="rdma_create_id")
CM_DESTROY_ID = Op(53, "CM_DESTROY_ID", Handle, Empty,
                   doc="rdma_destroy_id (a DREQ or REJ to the peer first)")  # fmt: skip
CM_MIGRATE_ID = Op(54, "CM_MIGRATE_ID", CmChannel, Empty,
                   doc="rdma_migrate_id: later events go to event channel `channel`")  # fmt: skip
CM_QUERY = Op(55, "CM_QUERY", Handle, CmIdInfo, doc="ucma_query_route")
CM_BIND_ADDR = Op(56, "CM_BIND_ADDR", CmBind, CmIdInfo, doc="rdma_bind_addr")
CM_RESOLVE_ADDR = Op(57, "CM_RESOLVE_ADDR", CmResolveAddr, Empty,
                     doc="rdma_resolve_addr: ADDR_RESOLVED or ADDR_ERROR follows")  # fmt: skip
CM_RESOLVE_ROUTE = Op(58, "CM_RESOLVE_ROUTE", CmTimeout, Empty,
                      doc="rdma_resolve_route: ROUTE_RESOLVED follows")  # fmt: skip
CM_LISTEN = Op(59, "CM_LISTEN", CmListen, CmIdInfo, doc="rdma_listen")
CM_CONNECT = Op(60, "CM_CONNECT", CmConnect, Empty, doc="rdma_connect: a REQ (UD: a SIDR_REQ)")
CM_ACCEPT = Op(61, "CM_ACCEPT", CmConnect, Empty, doc="rdma_accept: a REP (UD: a SIDR_REP)")
CM_ESTABLISH = Op(62, "CM_ESTABLISH", Handle, Empty,
                  doc="rdma_establish, and librdmacm after a CONNECT_RESPONSE on an ID "
                  "with a QP: the RTU")  # fmt: skip
CM_REJECT = Op(63, "CM_REJECT", CmConnect, Empty,
               doc="rdma_reject: a REJ, reason 28 consumer defined (UD: a SIDR_REP), "
               "with param's private data")  # fmt: skip
CM_DISCONNECT = Op(64, "CM_DISCONNECT", Handle, Empty,
                   doc="rdma_disconnect: a DREQ, or the DREP to the peer's")  # fmt: skip
CM_INIT_QP_ATTR = Op(65, "CM_INIT_QP_ATTR", CmQpState, CmQpAttr,
                     doc="rdma_init_qp_attr: the attributes and mask that move the ID's QP "
                         "to `qp_state`, computed by the agent alone")
CM_SET_OPTION = Op(66, "CM_SET_OPTION", CmOption, Empty,
                   doc="rdma_set_option at level RDMA_OPTION_ID; `length` is the caller's "
                   "optlen, checked as the kernel's ucma does")  # fmt: skip
CM_JOIN_MCAST = Op(67, "CM_JOIN_MCAST", CmMcast, Empty,
                   doc="rdma_join_multicast(_ex): MULTICAST_JOIN follows")  # fmt: skip
CM_LEAVE_MCAST = Op(68, "CM_LEAVE_MCAST", CmMcast, Empty, doc="rdma_leave_multicast")

#: the RDMA CM's operations
CM_OPS: tuple[Op[Any, Any], ...] = (
    CM_EVENTS, CM_CREATE_ID, CM_DESTROY_ID, CM_MIGRATE_ID, CM_QUERY, CM_BIND_ADDR,
    CM_RESOLVE_ADDR, CM_RESOLVE_ROUTE, CM_LISTEN, CM_CONNECT, CM_ACCEPT, CM_ESTABLISH,
    CM_REJECT, CM_DISCONNECT, CM_INIT_QP_ATTR, CM_SET_OPTION, CM_JOIN_MCAST, CM_LEAVE_MCAST,
)  # fmt: skip

#: Every operation, by number.
OPS: tuple[Op[Any, Any], ...] = tuple(
    sorted((v for v in list(globals().values()) if isinstance(v, Op)), key=lambda op: op.code)
)
BY_CODE: dict[int, Op[Any, Any]] = {op.code: op for op in OPS}
BY_NAME: dict[str, Op[Any, Any]] = {op.name: op for op in OPS}
