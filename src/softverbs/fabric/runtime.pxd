# Cython declarations for runtime.py (compiled mode only; see softverbs.compiled).
# The runtimes become extension types: the service's calls into them
# (progress, next_deadline), their progress loop's calls into their own
# methods and into the devices (HCA, typed: pending, receive, next_deadline)
# are C calls, and their fields C struct reads.  The instances keep a
# __dict__.  The UDP fabric's runtime extends Runtime as an extension type too
# (fabric/udp.pxd); the switched fabric's (SwitchedRuntime) is a Python class
# whose overrides the compiled callers find and call; its settings (bursts,
# own_events, direct) are fields it sets in __init__.

from softverbs.engine.hca cimport HCA
from softverbs.wire.packet cimport Packet

cimport cython


cdef class Runtime:
    cdef dict __dict__
    cdef public object lock, cond, clock, faults
    cdef public list hcas, inbox, inbox_to, _delayed, taps
    cdef public long long _delay_seq, generation, sleepers
    cdef public bint bursts, own_events

    cpdef arrive(self, HCA dst, Packet pkt)
    cpdef transmit(self, HCA src, Packet pkt, double now)
    @cython.locals(count=cython.longlong)
    cpdef _send(self, HCA src, Packet pkt, double now)
    @cython.locals(moved=cython.bint, hca=HCA)
    cpdef bint send_outboxes(self, double now)
    # now stays the clock's float object: every device's receive and run_timers takes
    # it, and the timers' deadlines (Python floats) are compared with it, per packet
    @cython.locals(did=cython.bint, moved=cython.bint, pkts=list, to=list,
                   i=cython.Py_ssize_t, hca=HCA, pkt=Packet, delayed=list)
    cpdef bint progress(self)
    cpdef woke(self)
    cpdef bint posted(self)
    cpdef bint release_due(self, double now)
    cpdef _release_delayed(self, double now)
    @cython.locals(hca=HCA)
    cpdef next_deadline(self)


cdef class InprocRuntime(Runtime):
    cdef public dict by_gid
    cdef public bint direct
    cdef public object _to_gid, _to

    @cython.locals(moved=cython.bint, hca=HCA, pkt=Packet, dst=HCA, n=cython.Py_ssize_t,
                   taken=cython.Py_ssize_t, _=cython.Py_ssize_t)
    cpdef bint send_outboxes(self, double now)
    cpdef transmit(self, HCA src, Packet pkt, double now)
