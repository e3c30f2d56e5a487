# Cython declarations for hca.py (compiled mode only; see softverbs.compiled).
# HCA becomes an extension type and QPCore holds it typed (core.pxd), so the
# reads every part makes of its device per packet (counters, observer, keys,
# cc) are C struct reads and the per-packet calls (queue, defer_ack, hold_tx,
# schedule, find_srq) are C calls.  The fields keep their Python types; the
# instance keeps a __dict__, so what the fabric or a test hangs on a device
# (or an instance method it replaces, such as receive) still works.

from softverbs.engine.core cimport QPCore
from softverbs.engine.memory cimport KeyTable
from softverbs.wire.packet cimport Packet
from softverbs.wire.opcodes cimport OpInfo

cimport cython

cdef class HCA:
    cdef dict __dict__
    cdef public object name, gids, counters, _outbox, _put, srqs, cqs
    cdef public list _acks, _timers
    cdef public dict qps
    cdef public object xrc_refs, xrcds, events, on_event, observer, rx_buffer, tx_waiting
    cdef public object mcast, on_mcast, cc, max_window
    cdef public KeyTable keys
    cdef public long long _timer_seq, _next_qpn, _xrc_gen, _xrc_slot, _next_srqn, _next_xrcd
    cdef public bint tx_paused
    # the hot counters (hca.HOT_COUNTERS), which DeviceCounters shows by name
    cdef public long long sent_pkts, rcvd_pkts, doorbells, rdma_sends, rdma_recvs, ack_deferred
    cdef public double cnp_sent_at

    cpdef queue(self, object pkt)
    cpdef pending(self)
    cpdef _flush_acks(self)
    cpdef defer_ack(self, QPCore qp)
    cpdef find_srq(self, object srqn)
    cpdef bint hold_tx(self, QPCore qp)
    cpdef schedule(self, QPCore qp, double deadline)
    # per packet and per pass of a runtime's progress loop: the packet, its OpInfo, the QP
    # and the timer heap's entries typed.  The instance has a __dict__, so the runtimes'
    # C call of receive finds one set on an instance (a test's), which receives instead.
    @cython.locals(qp=QPCore, count=cython.longlong, info=OpInfo)
    cpdef receive(self, Packet pkt, object now)
    @cython.locals(timers=list, top=tuple, qp=QPCore)
    cpdef next_deadline(self)
