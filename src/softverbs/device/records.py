"""The records of the device's operations, and the words the ops table is written in.

A softverbs device is driven the way a NIC is driven by its provider
library: through rings (:mod:`softverbs.engine.rings`) for the data path,
and through *operations* for everything else -- open a context, allocate a
PD, register memory, create, modify and destroy queues.  This module holds
what an operation's declaration (:mod:`softverbs.device.ops`) is made of:

* the request and reply bodies, as fixed records (:mod:`softverbs.layout`),
  from which the service's wire format, the C header and the protocol
  document are generated;
* :class:`Op`, one operation's declaration: its number, its records, its
  handler, what it takes beyond its record (:class:`Takes`: descriptors, a
  text tail) and the objects it creates and uses;
* :class:`Reply`, what a handler answers: the reply record and its tail.

It imports nothing of the device's handlers, so the clients (the verbs
providers, the C header generator) read the records without them; the
handlers' types are named for the type checker only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Generic, TypeVar

from softverbs.layout import I32, U8, U16, U32, U64, Gid, Name, Record

if TYPE_CHECKING:  # the handlers' argument types; core imports this module
    from softverbs.device.core import Host, Owner, Resources

#: Object kinds, as ``DESTROY`` and async events name them.
KIND_CTX, KIND_PD, KIND_MR, KIND_MW, KIND_AH, KIND_CHANNEL, KIND_CQ, KIND_SRQ, KIND_QP, \
    KIND_XRCD, KIND_CAPTURE, KIND_MKEY = range(1, 13)  # fmt: skip
KIND_NAMES = {KIND_CTX: "ctx", KIND_PD: "pd", KIND_MR: "mr", KIND_MW: "mw", KIND_AH: "ah",
              KIND_CHANNEL: "channel", KIND_CQ: "cq", KIND_SRQ: "srq", KIND_QP: "qp",
              KIND_XRCD: "xrcd", KIND_CAPTURE: "capture", KIND_MKEY: "mkey"}  # fmt: skip

# --- embedded records ---------------------------------------------------------------------------


class AddressVector(Record):
    """``ibv_ah_attr``, flattened (its ``grh`` fields inline)."""

    dgid: Gid
    dlid: U32
    sl: U32
    src_path_bits: U32
    static_rate: U32
    is_global: U32
    port_num: U32
    flow_label: U32
    sgid_index: U32
    hop_limit: U32
    traffic_class: U32


class QPAttrs(Record):
    """``ibv_qp_attr``, flattened; which fields count is the modify's mask."""

    ah: AddressVector
    alt_ah: AddressVector
    qp_state: U32
    cur_qp_state: U32
    path_mtu: U32
    path_mig_state: U32
    qkey: U32
    rq_psn: U32
    sq_psn: U32
    dest_qp_num: U32
    qp_access_flags: U32
    pkey_index: U32
    alt_pkey_index: U32
    en_sqd_async_notify: U32
    sq_draining: U32
    max_rd_atomic: U32
    max_dest_rd_atomic: U32
    min_rnr_timer: U32
    port_num: U32
    timeout: U32
    retry_cnt: U32
    rnr_retry: U32
    alt_port_num: U32
    alt_timeout: U32
    rate_limit: U32
    reserved: U32


class QPCaps(Record):
    """``ibv_qp_cap``."""

    max_send_wr: U32
    max_recv_wr: U32
    max_send_sge: U32
    max_recv_sge: U32
    max_inline_data: U32
    reserved: U32


class DeviceEntry(Record):
    """One device of ``LIST_DEVICES``."""

    name: Name
    node_guid: U64
    index: U32
    node_type: U32
    transport: U32
    kind: U32  #: 0 the host device, 1 a UDP link, 2 in-process


class DeviceAttrs(Record):
    """``ibv_device_attr`` plus what ``ibv_query_device_ex`` adds that softverbs fills."""

    fw_ver: Name
    node_guid: U64
    sys_image_guid: U64
    max_mr_size: U64
    page_size_cap: U64
    max_dm_size: U64
    device_cap_flags_ex: U64
    vendor_id: U32
    vendor_part_id: U32
    hw_ver: U32
    max_qp: U32
    max_qp_wr: U32
    device_cap_flags: U32
    max_sge: U32
    max_sge_rd: U32
    max_cq: U32
    max_cqe: U32
    max_mr: U32
    max_pd: U32
    max_qp_rd_atom: U32
    max_ee_rd_atom: U32
    max_res_rd_atom: U32
    max_qp_init_rd_atom: U32
    max_ee_init_rd_atom: U32
    atomic_cap: U32
    max_ee: U32
    max_rdd: U32
    max_mw: U32
    max_raw_ipv6_qp: U32
    max_raw_ethy_qp: U32
    max_mcast_grp: U32
    max_mcast_qp_attach: U32
    max_total_mcast_qp_attach: U32
    max_ah: U32
    max_fmr: U32
    max_map_per_fmr: U32
    max_srq: U32
    max_srq_wr: U32
    max_srq_sge: U32
    max_pkeys: U32
    local_ca_ack_delay: U32
    phys_port_cnt: U32
    max_inline_data: U32
    odp_general_caps: U32
    odp_rc_caps: U32
    odp_uc_caps: U32
    odp_ud_caps: U32
    odp_xrc_caps: U32
    reserved: U32


class PortAttrs(Record):
    """``ibv_port_attr``."""

    max_msg_sz: U64
    state: U32
    max_mtu: U32
    active_mtu: U32
    gid_tbl_len: U32
    port_cap_flags: U32
    bad_pkey_cntr: U32
    qkey_viol_cntr: U32
    pkey_tbl_len: U32
    lid: U32
    sm_lid: U32
    lmc: U32
    max_vl_num: U32
    sm_sl: U32
    subnet_timeout: U32
    init_type_reply: U32
    active_width: U32
    active_speed: U32
    phys_state: U32
    link_layer: U32
    flags: U32
    port_cap_flags2: U32
    active_speed_ex: U32


class AsyncEventRecord(Record):
    """One async event, written to a context's event socket (then the reason text)."""

    event_type: U32
    kind: U32  #: KIND_QP, KIND_CQ, KIND_SRQ, or 0 for the port
    handle: U32  #: the object's handle (0: a device-owned XRC receive QP: see qpn)
    qpn: U32


class CompEventRecord(Record):
    """One completion event, written to a completion channel's socket."""

    cq: U32
    reserved: U32


# --- operations ---------------------------------------------------------------------------------

Req = TypeVar("Req", bound=Record)
Rep = TypeVar("Rep", bound=Record)


@dataclasses.dataclass(frozen=True, slots=True)
class Reply(Generic[Rep]):
    """What an operation answers: its reply record and what follows it."""

    body: Rep
    tail: bytes = b""


@dataclasses.dataclass(frozen=True)
class Takes:
    """What a request brings beyond its record, as a rule its receiver applies.

    The service turns the descriptors a request passed into
    :class:`~softverbs.device.core.Resources` by one rule per ``Takes``
    (``softverbs.service.server.TAKES``); the in-process provider hands over
    the same things as objects.  ``doc`` is the protocol document's
    "descriptors" column."""

    name: str
    doc: str = ""


#: the request is its record alone (no descriptor)
NOTHING = Takes("nothing")
#: HELLO: optionally the process's /proc/self/mem
PROCESS_MEMORY = Takes("process memory", "optional: the process's /proc/self/mem (flags bit 0), "
                       "then the doorbell eventfd (flags bit 2)")
ASYNC_SOCKET = Takes("async event socket",
                     "the context's async event socket (a SOCK_SEQPACKET end)")  # fmt: skip
COMP_SOCKET = Takes("completion event socket",
                    "the channel's event socket (a SOCK_SEQPACKET end)")  # fmt: skip
REGION = Takes("region", "optional: a memfd holding the region")
CQ_RING = Takes("CQ ring", "the CQ ring (a memfd)")
SRQ_RING = Takes("SRQ ring", "the SRQ ring (a memfd); MODIFY_SRQ: only with IBV_SRQ_MAX_WR")
QP_RINGS = Takes("QP rings",
                 "the send queue ring if sq_slot, then the receive queue ring if rq_slot")
XRCD_FILE = Takes("XRC domain file", "optional: the file that names the domain")
PCAP_FILE = Takes("pcap file", "the pcap file, open for writing")
#: FAULTS: the rules, as text after the record
RULES_TEXT = Takes("rules text")
#: SANITIZE: a file for the reports, and the options as text after the record
REPORT_FILE = Takes("report file", "the program's stderr, where reports go")
CM_SOCKET = Takes("CM event socket", "an event channel's socket (SOCK_SEQPACKET)")


@dataclasses.dataclass(frozen=True)
class Op(Generic[Req, Rep]):
    """One operation, declared once (:mod:`softverbs.device.ops`).

    ``handler`` runs it on a :class:`~softverbs.device.core.Host`, under the
    host's lock, with the request's record and what :attr:`takes` became;
    it answers the reply record, or a :class:`Reply` when a tail follows.
    An operation without a handler is a connection's own (``HELLO``, the
    RDMA CM's): the device service answers it.  ``creates`` and ``uses``
    name object kinds (``KIND_*``): what the operation makes, and what its
    request names by handle."""

    code: int
    name: str
    request: type[Req]
    reply: type[Rep] | None  #: None: no reply (a doorbell)
    handler: Callable[[Host, Owner, Req, Resources], Rep | Reply[Rep]] | None = None
    takes: Takes = NOTHING
    creates: int = 0
    uses: tuple[int, ...] = ()
    tail: str = ""  #: what follows the reply body, if anything
    doc: str = ""
    #: the request may carry a tail after its record; every other request is
    #: exactly its record (a longer one is EPROTO)
    request_tail: bool = False




class Empty(Record):
    pass


HELLO_MEMORY = 1  #: the request passes the process's memory (/proc/self/mem)
HELLO_JOIN = 2  #: a forked child joins the owner ``token`` names (its parent's objects)
#: the request passes an eventfd (after the memory's descriptor): the client's send
#: queues ring by writing it instead of sending DOORBELL messages (docs/rings.md)
HELLO_DOORBELL_FD = 4
#: HelloReply.features: the service took the HELLO_DOORBELL_FD eventfd
FEATURE_DOORBELL_FD = 1


class Hello(Record):
    DOCS = {"token": "HELLO_JOIN: the token the parent's HELLO reply gave"}
    token: U64
    version: U32
    flags: U32  #: HELLO_MEMORY, HELLO_JOIN, HELLO_DOORBELL_FD
    pid: U32
    reserved: U32


class HelloReply(Record):
    DOCS = {"token": "names this connection's owner; a forked child joins it with HELLO_JOIN"}
    token: U64
    version: U32
    service_pid: U32
    ndevices: U32
    features: U32


class ListDevicesReply(Record):
    count: U32
    reserved: U32


class OpenDevice(Record):
    name: Name


class OpenDeviceReply(Record):
    node_guid: U64
    ctx: U32
    index: U32
    active_mtu: U32  #: bytes
    gid_count: U32


class Ctx(Record):
    ctx: U32
    reserved: U32


class QueryPort(Record):
    ctx: U32
    port: U32


class QueryGid(Record):
    ctx: U32
    port: U32
    index: U32
    reserved: U32


class QueryGidReply(Record):
    gid: Gid
    gid_type: U32
    ifindex: U32


class QueryPkeyReply(Record):
    pkey: U32
    reserved: U32


class Handle(Record):
    handle: U32
    reserved: U32


DESTROY_CASCADE = 1  #: destroy what still uses the object first (pyverbs' close())


class Destroy(Record):
    kind: U32
    handle: U32
    flags: U32  #: DESTROY_CASCADE, or 0 (ibv_destroy_*: EBUSY while anything uses it)
    reserved: U32


REG_MR_HAS_FD = 1  #: the request passes a memfd holding the region (at ``offset``)
REG_MR_IMPLICIT = 2  #: an implicit on-demand paging MR: the whole address space


class RegMR(Record):
    addr: U64
    length: U64
    iova: U64
    offset: U64  #: offset of ``addr`` in the passed memfd
    pd: U32
    access: U32
    flags: U32
    reserved: U32


class RegMRReply(Record):
    mr: U32
    lkey: U32
    rkey: U32
    reserved: U32


class ReregMR(Record):
    addr: U64
    length: U64
    offset: U64
    mr: U32
    change: U32  #: IBV_REREG_MR_CHANGE_* bits
    pd: U32
    access: U32
    flags: U32
    reserved: U32


class Keys(Record):
    lkey: U32
    rkey: U32


class AllocMW(Record):
    pd: U32
    type: U32


class AllocMWReply(Record):
    mw: U32
    rkey: U32


class CreateAH(Record):
    av: AddressVector
    pd: U32
    reserved: U32


class CreateCQ(Record):
    ctx: U32
    cqe: U32
    channel: U32  #: 0: none
    comp_vector: U32


class CreateCQReply(Record):
    cq: U32
    cqe: U32


class ResizeCQ(Record):
    cq: U32
    cqe: U32


class CreateSRQ(Record):
    ctx: U32
    pd: U32
    srq_type: U32
    max_wr: U32
    max_sge: U32
    limit: U32
    xrcd: U32
    cq: U32
    slot: U32  #: bytes per WQE slot (recv_slot_size(max_sge) or more)
    reserved: U32


class CreateSRQReply(Record):
    srq: U32
    srqn: U32
    max_wr: U32
    max_sge: U32


class ModifySRQ(Record):
    srq: U32
    mask: U32  #: IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT
    max_wr: U32
    limit: U32


class QuerySRQReply(Record):
    max_wr: U32
    max_sge: U32
    limit: U32
    reserved: U32


OPEN_XRCD_HAS_FD = 1


class CaptureReq(Record):
    ctx: U32
    flags: U32


#: CAPTURE: the file already holds a pcap header (several taps share one file)
CAPTURE_APPEND = 1


class OpenXRCD(Record):
    ctx: U32
    oflags: U32
    flags: U32
    reserved: U32


#: CreateQP.sq_slot / rq_slot, CreateSRQ.slot: a slot is a multiple of 16 bytes, at
#: least what the queue's SGEs (and inline data) need, at most this
MAX_SLOT = 1 << 16

#: DeviceEntry.kind
DEVICE_HOST, DEVICE_UDP, DEVICE_INPROC = 0, 1, 2


class CreateQP(Record):
    send_ops_flags: U64
    caps: QPCaps
    ctx: U32
    pd: U32
    qp_type: U32
    send_cq: U32
    recv_cq: U32
    srq: U32
    xrcd: U32
    sq_sig_all: U32
    create_flags: U32
    sq_slot: U32  #: bytes per send WQE slot; 0: no send queue ring is passed
    rq_slot: U32  #: bytes per receive WQE slot; 0: no receive queue ring is passed
    dv_flags: U32  #: provider (mlx5dv) create flags: DV_SIG_PIPELINING


#: CreateQP.dv_flags: MLX5DV_QP_CREATE_SIG_PIPELINING (stop in SQD after a signature error)
DV_SIG_PIPELINING = 1 << 6  # the value of MLX5DV_QP_CREATE_SIG_PIPELINING


class CreateQPReply(Record):
    caps: QPCaps
    qp: U32
    qpn: U32


class ModifyQP(Record):
    attr: QPAttrs
    qp: U32
    mask: U32


class ModifyQPReply(Record):
    state: U32
    reserved: U32


class QueryQPReply(Record):
    attr: QPAttrs
    caps: QPCaps
    state: U32
    sq_sig_all: U32


class OpenQP(Record):
    ctx: U32
    xrcd: U32
    qpn: U32
    qp_type: U32


class OpenQPReply(Record):
    qp: U32
    qpn: U32
    state: U32
    reserved: U32


DB_SQ, DB_RQ = 1, 2


class Doorbell(Record):
    qp: U32
    queue: U32  #: DB_SQ or DB_RQ


class XrcRcvAlloc(Record):
    """The seed's ``xrc_rcv_qp_alloc``: create, RESET->INIT->RTR, register."""

    init: QPAttrs
    rtr: QPAttrs
    xrcd: U32
    init_mask: U32
    rtr_mask: U32
    reserved: U32


class XrcQpn(Record):
    xrcd: U32
    qpn: U32


class QpnReply(Record):
    qpn: U32
    reserved: U32


class Mcast(Record):
    """``ibv_attach_mcast``/``ibv_detach_mcast``: a UD QP and a multicast group."""

    DOCS = {"lid": "the multicast LID; RoCE has none, and the device ignores it"}
    gid: Gid
    qp: U32
    lid: U32



class CreateMkey(Record):
    pd: U32
    flags: U32  #: MKEY_BLOCK_SIGNATURE
    max_entries: U32
    reserved: U32


#: CreateMkey.flags: the mkey checks and generates block signatures
MKEY_BLOCK_SIGNATURE = 1


class MkeyReply(Record):
    handle: U32
    key: U32  #: the lkey and rkey


class MkeyErr(Record):
    """mlx5dv_mkey_check's answer: the first signature error since the last check."""

    err_type: U32  #: 0 none, 1 bad guard, 2 bad reference tag, 3 bad application tag
    domain: U32  #: 0 memory, 1 wire
    expected: U64
    actual: U64
    offset: U64


class CancelSend(Record):
    qp: U32
    reserved: U32
    wr_id: U64


class Count(Record):
    count: U32
    reserved: U32


# --- the mkey configuration a driver WQE carries ---------------------------------------
# A WR_DRIVER1 send WQE whose driver_op is an mkey's handle configures that mkey
# when it runs, in send-queue order (mlx5dv_wr_mkey_configure; mlx5's UMR WQE).  Its
# inline data is an MkeyConf, then ``nentries`` MkeyEntry, then -- with
# MKEY_CONF_SIG -- two MkeySigDomain (memory, wire).


class MkeyConf(Record):
    flags: U32  #: MKEY_CONF_ACCESS, MKEY_CONF_LAYOUT, MKEY_CONF_SIG, MKEY_CONF_AUTO_COPY
    access: U32  #: with MKEY_CONF_ACCESS: the new access flags
    repeat: U32  #: interleaved layouts: times the entries repeat (1: a plain list)
    nentries: U32
    check_mask: U8
    copy_mask: U8
    reserved0: U16
    reserved1: U32


MKEY_CONF_ACCESS, MKEY_CONF_LAYOUT, MKEY_CONF_SIG = 1, 2, 4
#: with MKEY_CONF_SIG: copy_mask is ignored, the device works out the copy mask itself
#: (mlx5dv without MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK; the C libmlx5 sets it)
MKEY_CONF_AUTO_COPY = 8


class MkeyEntry(Record):
    addr: U64
    lkey: U32
    count: U32  #: bytes taken from the region
    skip: U32  #: interleaved: bytes skipped after them
    reserved: U32


class MkeySigDomain(Record):
    present: U8
    kind: U8  #: 0 CRC32, 1 CRC32C, 2 T10-DIF
    escape: U8  #: 0 none, 1 application tag, 2 application and reference tags
    ref_remap: U8
    block_size: U32
    seed: U32
    app_tag: U32
    ref_tag: U32
    reserved: U32


# --- the RDMA CM -----------------------------------------------------------------------------
# librdmacm's commands to the CM agent (the kernel's ``rdma_ucm_cmd_*``), one operation
# each, and the event record written to an event channel's socket
# (``rdma_ucm_event_resp``).  The agent is softverbs.cm.agent; docs/cm.md.

PrivateData = Annotated[bytes, "256s"]  #: private data; its length is a field beside it


class CmAddr(Record):
    """A socket address: ``family`` AF_INET (2), AF_INET6 (10) or 0 (none)."""

    DOCS = {"ip": "network byte order; IPv4 in the first 4 bytes", "port": "host byte order"}
    ip: Gid
    family: U16
    port: U16
    reserved: U32


class CmIdInfo(Record):
    """What the agent says of an ID (``ucma_query_route``): device, addresses, path."""

    DOCS = {"dev": "the device the ID is bound to (empty: none yet)",
            "has_path": "1 if sgid, dgid and sgid_index are known (an address is resolved)",
            "state": "rdma_cm's state (enum rdma_cm_state)",
            "cm_state": "ib_cm's state (enum ib_cm_state)"}  # fmt: skip
    src: CmAddr
    dst: CmAddr
    sgid: Gid
    dgid: Gid
    dev: Name
    handle: U32
    ps: U32
    qp_type: U32
    port_num: U32
    sgid_index: U32
    has_path: U32
    state: U32
    cm_state: U32


class CmConnParam(Record):
    """``rdma_conn_param`` (and ``rdma_ud_param``'s private data, qp_num and qkey)."""

    private_data: PrivateData
    qp_num: U32
    qkey: U32
    private_data_len: U8
    responder_resources: U8
    initiator_depth: U8
    flow_control: U8
    retry_count: U8
    rnr_retry_count: U8
    srq: U8
    reserved: U8


#: CmEvent.flags: which parts of the event are filled
CM_EVENT_INFO, CM_EVENT_CONN, CM_EVENT_UD, CM_EVENT_AH, CM_EVENT_MC = 1, 2, 4, 8, 16


class CmEvent(Record):
    """One RDMA CM event, written to its event channel's socket."""

    DOCS = {"info": "CM_EVENT_INFO: CONNECT_REQUEST: the new ID; ADDR_RESOLVED, "
                    "ROUTE_RESOLVED: the ID",
            "param": "CM_EVENT_CONN: rdma_conn_param; CM_EVENT_UD: rdma_ud_param's",
            "ah": "CM_EVENT_AH: rdma_ud_param.ah_attr",
            "mc": "CM_EVENT_MC: MULTICAST_JOIN: the group",
            "handle": "the ID the event is for (CONNECT_REQUEST: the listener)",
            "status": "0, a negative errno, or a REJ reason",
            "flags": "CM_EVENT_INFO, _CONN, _UD, _AH, _MC"}  # fmt: skip
    info: CmIdInfo
    param: CmConnParam
    ah: AddressVector
    mc: CmAddr
    handle: U32
    event: U32  #: enum rdma_cm_event_type
    status: I32
    join_flags: U32
    flags: U32
    reserved: U32


class CmCreateId(Record):
    ps: U32  #: enum rdma_port_space
    qp_type: U32
    channel: U32  #: the event channel (CM_EVENTS) its events go to
    reserved: U32


class CmChannel(Record):
    handle: U32
    channel: U32


class CmBind(Record):
    addr: CmAddr
    handle: U32
    reserved: U32


class CmResolveAddr(Record):
    DOCS = {"src": "family 0: none"}
    src: CmAddr
    dst: CmAddr
    handle: U32
    timeout_ms: U32


class CmTimeout(Record):
    handle: U32
    timeout_ms: U32


class CmListen(Record):
    handle: U32
    backlog: I32


class CmConnect(Record):
    param: CmConnParam
    handle: U32
    reserved: U32


class CmQpState(Record):
    """``rdma_init_qp_attr``'s question: the attributes to move the ID's QP to
    ``qp_state``.  ``rdma_accept`` moves its QP before its REP carries the
    accepted connection parameters, so it passes them here too."""

    DOCS = {"responder_resources": "rdma_accept's value (max_dest_rd_atomic at RTR); "
                                   "0xFF (RDMA_MAX_RESP_RES): the ID's own",
            "initiator_depth": "rdma_accept's value (max_rd_atomic at RTS); "
                               "0xFF (RDMA_MAX_INIT_DEPTH): the ID's own"}  # fmt: skip
    handle: U32
    qp_state: U32
    responder_resources: U8
    initiator_depth: U8
    reserved0: U16
    reserved: U32


class CmQpAttr(Record):
    attr: QPAttrs
    mask: U32
    reserved: U32


class CmOption(Record):
    value: U64
    handle: U32
    level: U32
    name: U32
    length: U32  #: the caller's optlen


class CmMcast(Record):
    addr: CmAddr
    handle: U32
    join_flags: U32  #: enum rdma_cm_mc_join_flags
