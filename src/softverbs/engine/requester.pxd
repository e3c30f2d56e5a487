# Cython declarations for requester.py (compiled mode only; see softverbs.compiled).
# The requester is an extension type with typed fields; its hot methods are
# cpdef, so the completer (which cimports it) calls them as C functions.
# Methods that hold a generator stay plain Python methods (Cython has no
# closures in cpdef functions): cancel_posted; fetch_sq, per doorbell, is cpdef and
# leaves its generator to the module function _turn_cancelled.

cimport cython

cimport softverbs.engine.psn as P
from softverbs.engine.core cimport QPCore, ack_every
from softverbs.engine.completer cimport Completer
from softverbs.engine.congestion cimport CongestionControl
from softverbs.engine.memory cimport KeyTable
from softverbs.engine.rings cimport SendWQE, WorkRing
from softverbs.engine.wr cimport WrInfo, info_of, move, pending
from softverbs.wire.packet cimport Packet, burst, new_packet

# enum members the per-WQE path compares with: C globals, no dict lookup
cdef object _SIG_PENDING, _W_QUEUED, _W_ACTIVE, _W_CANCELLED, _W_DONE, _W_FAILED
cdef object _WR_SEND, _WR_WRITE, _WR_READ, _WR_ATOMIC, _WR_LOCAL
# the QP states the send queue's path compares with: C integers, compared with the
# state read once into a C local (pump_sq, doorbell)
cdef long long _RTS, _SQD, _ERR, _SQE

cdef class Requester:
    cdef public QPCore qp
    cdef public object cancelled, sig, paced_until, reported_rate
    cdef public CongestionControl cc  # window, quantum, may-send, per message: C calls
    cdef public Completer comp
    cdef public long long sq_next, npsn, rd_out, sent_end, resent_pkts
    cdef public bint blocked, draining

    cpdef reset(self)
    @cython.locals(state=cython.longlong)
    cpdef doorbell(self, double now)
    @cython.locals(sq=WorkRing, first=cython.longlong)
    cpdef fetch_sq(self, bint everything=*)
    @cython.locals(wqe=SendWQE, info=WrInfo, comp=Completer, held=bint, rd=bint, sq=WorkRing,
                   cc=CongestionControl, state=cython.longlong)
    cpdef pump_sq(self, double now)
    @cython.locals(cc=CongestionControl)
    cpdef bint _may_send(self, double now)
    cpdef bint started(self, long long psn)
    cpdef rd_answered(self)
    cpdef acked(self, long long npkts, double now)
    cpdef lost(self, double now)
    @cython.locals(comp=Completer, npkts=cython.longlong, keys=KeyTable)
    cpdef _start(self, SendWQE wqe, WrInfo info, double now)
    cpdef _resolve(self, SendWQE wqe, object klass)
    @cython.locals(views=list)
    cpdef list _local_views(self, SendWQE wqe, bint write)
    @cython.locals(keys=KeyTable)
    cpdef _local(self, SendWQE wqe, object sge, bint write)
    cpdef fail(self, SendWQE wqe, object status, object reason)
    cpdef _execute_local(self, SendWQE wqe)
    @cython.locals(info=WrInfo, asked_all=bint)
    cpdef bint _transmit(self, SendWQE wqe, double now)
    @cython.locals(n=cython.longlong, i=cython.longlong, psn=cython.longlong,
                   count=cython.longlong, ack=cython.longlong, window=cython.longlong,
                   room=cython.longlong, pmtu=cython.longlong, quantum=cython.longlong,
                   again=cython.longlong, pkt=Packet, cc=CongestionControl)
    cpdef bint _send_message(self, SendWQE wqe, WrInfo info, double now)
    @cython.locals(pkt=Packet)
    cpdef bint _send_read(self, SendWQE wqe)
    @cython.locals(pkt=Packet)
    cpdef _send_atomic(self, SendWQE wqe)
    cpdef _check_drained(self)
    cpdef signature_failed(self)
    cpdef _sig_stop(self)
    cpdef flush_sq(self)
