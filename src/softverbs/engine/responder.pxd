# Cython declarations for responder.py (compiled mode only; see softverbs.compiled).
# The responder is an extension type with typed fields; its per-packet
# methods are cpdef, and so is a burst's execution; the rare paths stay Python methods.

cimport cython

cimport softverbs.engine.psn as P
from softverbs.engine.core cimport QPCore
from softverbs.engine.memory cimport KeyTable
from softverbs.engine.rings cimport CQE, RecvWQE, SharedRecvRing, WorkRing, place
from softverbs.wire.opcodes cimport OpInfo
from softverbs.wire.packet cimport Burst, Packet

# module constants the per-packet path reads: C globals, no dict lookup
cdef object _K_ATOMIC, _K_READ_REQ, _K_SEND, _K_WRITE
cdef object _MSG_DROPPING, _MSG_IDLE, _MSG_SEND, _MSG_WRITE
cdef object _R_DONE, _R_BURST, _R_DUPLICATE, _R_PSN_OUT_OF_SEQ, _R_OP_SEQ, _R_RNR, _R_SRQ
cdef object _R_RQE, _R_LENGTH, _R_RKEY, _R_QKEY
cdef object _OP_ACK, _ACK_SYNDROME, _XRC_BAD_SRQ
cdef dict _INSIDE

cdef class Responder:
    cdef public QPCore qp
    cdef public object replay, msg, rqe, views, wview, ack_req
    cdef public long long epsn, msn, rq_next, off, wkey, ack_psn
    cdef public bint nak_sent

    cpdef reset(self)
    cpdef on_request(self, Packet pkt, OpInfo info, double now)
    @cython.locals(d=cython.longlong)
    cpdef _rc_receive(self, Packet pkt, OpInfo info, double now)
    @cython.locals(inside=bint)
    cpdef bint _out_of_sequence(self, OpInfo info)
    cpdef _accept(self, Packet pkt, long long n=*, object asked=*)
    cpdef emit_ack(self)
    # a burst: its fields C struct reads, its body and its last packet C calls
    # (QPCore.receive, core.pxd)
    @cython.locals(qp=QPCore, count=cython.longlong, body=cython.longlong,
                   done=cython.longlong, j=cython.longlong, info=OpInfo, seg=Packet)
    cpdef _burst(self, Burst b, double now)
    @cython.locals(info=OpInfo, first=bint, seg=cython.longlong, size=cython.longlong,
                   off=cython.longlong, room=cython.longlong, every=cython.longlong,
                   index=cython.longlong)
    cpdef long long _burst_body(self, Burst b, long long k, double now)
    # the ACK typed: its AETH fields are C struct stores
    @cython.locals(ack=Packet)
    cpdef _send_ack(self, Packet req, long long psn)
    @cython.locals(rq=WorkRing, srq=SharedRecvRing)
    cpdef _take_rqe(self, Packet pkt)
    cpdef _rqe_pd(self, Packet pkt)
    @cython.locals(keys=KeyTable)
    cpdef _rqe_views(self, RecvWQE rqe, object pd)
    @cython.locals(cqe=CQE, srq=SharedRecvRing)
    cpdef _complete_rqe(self, RecvWQE rqe, object status, object byte_len, object opcode=*,
                        object flags=*, object imm=*, object src_qp=*, object solicited=*,
                        object reason=*)
    cpdef _begin_recv(self, Packet pkt, double now)
    @cython.locals(n=cython.longlong, last=bint)
    cpdef _recv_send(self, Packet pkt, OpInfo info, double now)
    @cython.locals(n=cython.longlong, off=cython.longlong, pmtu=cython.longlong, last=bint)
    cpdef _recv_write(self, Packet pkt, OpInfo info, double now)
    cpdef _remote(self, Packet pkt, object kind, object va, object length, double now)
