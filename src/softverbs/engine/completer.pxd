# Cython declarations for completer.py (compiled mode only; see softverbs.compiled).
# The completer is an extension type with typed fields; its hot methods are
# cpdef.  _retry and handle_timer hold generators and stay Python methods.

cimport cython

cimport softverbs.engine.psn as P
from softverbs.engine.core cimport QPCore
from softverbs.engine.requester cimport Requester
from softverbs.engine.rings cimport CQE, SendWQE, new_cqe
from softverbs.engine.wr cimport WrInfo, finished, info_of, move
from softverbs.wire.opcodes cimport OpInfo, aeth_kind, aeth_value
from softverbs.wire.packet cimport Packet

# enum members the per-response path compares with: C globals, no dict lookup
cdef object _C_ACK, _C_BURST, _C_DUPLICATE, _C_ERROR_RETRY, _C_AFTER_GAP, _C_INVALID
cdef object _K_ACK, _K_READ_RESP, _W_DONE, _W_ACTIVE, _W_FAILED
cdef object _WR_READ, _WR_ATOMIC, _WR_SEND, _RTS, _SQD
cdef long long _AETH_ACK, _AETH_RNR_NAK, _AETH_NAK

cdef class Completer:
    cdef public QPCore qp
    cdef public object inflight, deadline, rnr_until
    cdef object _popleft  # inflight.popleft, bound once
    cdef public Requester req
    cdef public long long una, retry_left, rnr_left, rnr_psn
    cdef public bint resending

    cpdef reset(self)
    cpdef track(self, SendWQE wqe)
    cpdef started(self)
    cpdef bint idle(self)
    cpdef long long unacked(self, long long psn)
    cpdef bint backing_off(self)
    cpdef list take_all(self)
    cpdef next_deadline(self)
    cpdef stop_timers(self)
    @cython.locals(seconds=double, deadline=double)
    cpdef arm_ack_timer(self, double now)
    cpdef on_response(self, Packet pkt, OpInfo info, double now)
    @cython.locals(wqe=SendWQE, pmtu=cython.longlong, count=cython.longlong,
                   expected=cython.longlong, piece=cython.longlong, end=cython.longlong,
                   final=bint, size=cython.longlong)
    cpdef bint _read_burst(self, object b, double now)
    cpdef _response(self, Packet pkt, OpInfo info, double now)
    @cython.locals(wqe=SendWQE)
    cpdef SendWQE _find(self, long long psn)
    @cython.locals(wqe=SendWQE, info=WrInfo)
    cpdef _acked(self, long long psn, double now)
    cpdef _progress(self, double now, long long una)
    @cython.locals(wqe=SendWQE)
    cpdef _rnr_nak(self, Packet pkt, double now)
    @cython.locals(wqe=SendWQE)
    cpdef _nak(self, Packet pkt, double now)
    cpdef _fail_remote(self, SendWQE wqe, object status, object reason)
    @cython.locals(wqe=SendWQE, expected=cython.longlong, final=bint, bad_first=bint,
                   pmtu=cython.longlong)
    cpdef _read_response(self, Packet pkt, OpInfo info, double now)
    @cython.locals(wqe=SendWQE)
    cpdef _atomic_ack(self, Packet pkt, double now)
    @cython.locals(wqe=SendWQE, end=cython.longlong, off=cython.longlong)
    cpdef rewind(self, long long psn)
    @cython.locals(wqe=SendWQE, info=WrInfo, ok=bint, cqe=CQE, tag=tuple)
    cpdef complete(self, double now)
