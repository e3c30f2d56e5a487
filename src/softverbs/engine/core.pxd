# Cython declarations for core.py (compiled mode only; see softverbs.compiled).
# QPCore becomes an extension type: the requester, completer and responder
# hold it typed (their .pxd), so their reads of the QP's attributes are C
# struct reads and its per-packet methods are C calls.  QPEngine stays a
# Python subclass, so an attribute not declared here (the parts, anything a
# test or the device hangs on it) lives in its instance dictionary.
# Integers the parts do arithmetic on are C integers; the attributes whose
# Python type is part of what they say (qp_type and the state are IntEnum
# members, the access flags, sq_sig_all as given) stay Python objects.

from softverbs.engine.hca cimport HCA
from softverbs.engine.rings cimport CQE, CompletionRing, Route, SharedRecvRing, WorkRing
from softverbs.wire.opcodes cimport OpInfo
from softverbs.wire.packet cimport Packet, new_packet

cimport cython

# every how many packets a message asks for an ACK: a C call from the requester,
# dividing by a C constant (ACKS_PER_WINDOW stays a Python name)
cdef long long _ACKS
cpdef long long ack_every(long long window)

cdef class QPCore:
    # the device, the rings and the CQs, typed (hca.pxd, rings.pxd): None where absent
    cdef public HCA hca
    cdef public WorkRing sq, rq
    cdef public SharedRecvRing srq
    cdef public CompletionRing send_cq, recv_cq
    cdef public object transport, pd, owner, xrcd
    cdef public object qp_type, _state, sq_sig_all, route, timer_at, rare_counts, last_error
    # attributes set by modify
    cdef public object port, pkey_index, pkey, qkey, access, dest_qpn, sq_psn, rq_psn
    cdef public object timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic
    cdef public object max_dest_rd_atomic, en_sqd_async_notify, sport
    cdef public long long qpn, pmtu, window, timer_token, sent_pkts, rcvd_pkts
    cdef public bint reliable, comm_established, sig_pipelining, block_self_mcast_lb
    cdef public bint is_ud, is_xrc_send, is_xrc_recv  # qp_type, as tested per packet
    cdef public double cnp_sent_at

    # QPEngine's (qp.pxd), here so that the device (hca.pxd) and a part splitting a
    # burst, which hold the QP as a QPCore, call it by C call; a Python subclass's
    # override (GsiQP's) is still found, as such a type is checked for one
    cpdef receive(self, Packet pkt, OpInfo info, double now)
    cpdef send(self, Packet pkt)  # its count a C struct read
    cpdef count(self, object name)
    cpdef arm(self, double deadline)
    cpdef push_cqe(self, CompletionRing cq, CQE cqe)  # the CQ's error flag and push: C
    # the packets they make and address are typed: their fields are C struct stores
    @cython.locals(pkt=Packet)
    cpdef new_request(self, object opcode, object psn, object payload=*)
    cpdef address(self, Packet pkt, Route route)
    @cython.locals(pkt=Packet)
    cpdef reply(self, Packet req, object opcode, object psn, object payload=*)
