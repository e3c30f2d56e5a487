"""The CM agent's records of one CM ID, shared by its rdma_cm and ib_cm halves.

:class:`CmId` is both the kernel's ``rdma_id_private`` (addresses, port,
listener, rdma_cm state) and its ``cm_id_private`` (communication IDs, PSNs,
the outstanding MAD and its timer, ib_cm state): :class:`~softverbs.cm.agent.CmAgent`
(rdma_cm) and :class:`~softverbs.cm.ibcm.IbCm` (ib_cm) each keep their own
fields of it up to date.  The timing constants are rdma_cm's choices.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from softverbs.cm import mad
from softverbs.cm.gsi import GsiQP
from softverbs.cm.states import CmState, RdmaState
from softverbs.device.core import LIMITS
from softverbs.engine.rings import Route
from softverbs.enums import bytes_to_mtu

#: librdmacm's Q_Key for RDMA_PS_UDP QPs (``RDMA_UDP_QKEY``).
RDMA_UDP_QKEY = 0x01234567
#: rdma_cm's choices (``cma.c``): CM response timeout, retries, RoCE packet life.
CM_RESPONSE_TIMEOUT = 20
MAX_CM_RETRIES = 15
IBOE_PACKET_LIFETIME = 18
#: ``CMA_CM_MRA_SETTING``: a delayed MRA asking for 2**24 * 4.096 us.
MRA_SERVICE_TIMEOUT = 24
#: The local CA ACK delay softverbs devices report (query_device).
LOCAL_CA_ACK_DELAY = 15

Addr = tuple[bytes, int]  #: (packed IP, port)
Sink = Callable[[dict[str, Any]], None]


#: rdma_conn_param's "the device decides" values (rdma_cma.h)
RDMA_MAX_RESP_RES = 0xFF
RDMA_MAX_INIT_DEPTH = 0xFF
#: what a device offers: responder resources (RDMA READ/atomic requests a QP
#: serves at once) and initiator depth (the ones it keeps outstanding)
MAX_RESPONDER = LIMITS["max_qp_rd_atom"]
MAX_INITIATOR = LIMITS["max_qp_init_rd_atom"]

@dataclass
class Path:
    """The one path of a connection (an SA path record, for RoCE)."""

    sgid: bytes
    dgid: bytes
    sgid_index: int
    mtu: int  #: ibv_mtu code
    flow_label: int = 0
    hop_limit: int = 64
    tclass: int = 0
    pkey: int = 0xFFFF
    packet_life_time: int = IBOE_PACKET_LIFETIME


@dataclass
class DeviceCtx:
    """One device the agent uses: its engine, runtime and QP1."""

    name: str
    device: Any  #: a SoftDevice whose engine runs in this process
    gsi: GsiQP

    @property
    def runtime(self) -> Any:
        return self.device.runtime

    @property
    def gids(self) -> list[bytes]:
        return list(self.device.hca.gids)

    @property
    def mtu(self) -> int:
        return int(bytes_to_mtu(self.device.mtu))

    @property
    def guid(self) -> int:
        return int(self.device.guid)


class CmId:
    """One CM ID: rdma_cm's ``rdma_id_private`` and ib_cm's ``cm_id_private``."""

    def __init__(self, handle: int, ps: int, qp_type: int, sink: Sink, owner: object) -> None:
        self.handle = handle
        self.ps = ps
        self.qp_type = qp_type
        self.sink = sink
        self.owner = owner
        self.state = RdmaState.IDLE
        self.cm = CmState.IDLE
        self.dev: str | None = None
        self.src: Addr | None = None
        self.dst: Addr | None = None
        self.path: Path | None = None
        self.listener: CmId | None = None
        self.backlog = 0
        self.bound: tuple[int, int] | None = None  #: (port space, port) held
        # ib_cm
        self.local_comm_id = 0
        self.remote_comm_id = 0
        self.remote_ca_guid = 0
        self.tid = 0
        self.service_id = 0
        self.qp_num = 0
        self.srq = 0
        self.remote_qpn = 0
        self.seq_num = 0  #: the PSN this side receives from (REQ/REP starting PSN)
        self.sq_psn = 0  #: the PSN this side sends from (the peer's starting PSN)
        self.responder_resources = 0
        self.initiator_depth = 0
        self.retry_count = 7
        self.rnr_retry_count = 7
        self.flow_control = 0
        self.av_timeout = IBOE_PACKET_LIFETIME + 1
        self.timeout_set = False
        self.timeout_opt = 0
        self.tos = 0
        self.reuseaddr = False  #: RDMA_OPTION_ID_REUSEADDR
        self.afonly = False  #: a wildcard bind takes its own family only
        self.afonly_set = False  #: RDMA_OPTION_ID_AFONLY was given (else bind decides)
        self.qkey = 0
        self.max_cm_retries = MAX_CM_RETRIES
        self.rep_timeout_ms = mad.ms_of(CM_RESPONSE_TIMEOUT)
        # the one outstanding retransmittable MAD, or timewait
        self.msg: bytes | None = None
        self.route: Route | None = None
        self.retries_left = 0
        self.msg_timeout = 0.0
        self.deadline: float | None = None
        self.timer = ""  #: "mad" or "timewait"
        #: multicast groups joined: (group address, join flags), in join order
        self.mcast: list[tuple[Addr, int]] = []

    @property
    def family(self) -> int:
        addr = self.src or self.dst
        return 0 if addr is None else (4 if len(addr[0]) == 4 else 6)

    def info(self) -> dict[str, Any]:
        """What ``ucma_query_route`` tells the user-side library."""
        p = self.path
        return {
            "handle": self.handle, "dev": self.dev, "port_num": 1, "ps": self.ps,
            "qp_type": self.qp_type, "src": _addr_out(self.src), "dst": _addr_out(self.dst),
            "sgid": p.sgid.hex() if p else None, "dgid": p.dgid.hex() if p else None,
            "sgid_index": p.sgid_index if p else None, "state": self.state.name,
            "cm_state": self.cm.name,
        }  # fmt: skip

    def __repr__(self) -> str:
        return f"<CmId {self.handle} {self.state.name}/{self.cm.name} dev={self.dev}>"


def _addr_out(addr: Addr | None) -> list[Any] | None:
    if addr is None:
        return None
    return [str(ipaddress.ip_address(addr[0])), addr[1]]
