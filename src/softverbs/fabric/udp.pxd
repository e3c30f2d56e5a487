# Cython declarations for udp.py (compiled mode only; see softverbs.compiled).
# The UDP device's runtime becomes an extension type beside the Runtime it
# extends: its fields are C struct slots (the instances keep Runtime's
# __dict__), and the per-datagram path -- the drain, the take and delivery of
# what it received, the transmit and its send, the progress and post hooks the
# verbs call -- is cpdef, C calls from each other and from the compiled
# Runtime.  The device handed to _take, _deliver and the sends stays an object:
# the tests give them stand-ins that count.

from softverbs.engine.hca cimport HCA
from softverbs.fabric.runtime cimport Runtime
from softverbs.wire.codec cimport BurstMerger
from softverbs.wire.packet cimport Packet

cimport cython


cdef class UdpRuntime(Runtime):
    cdef public list addrs
    cdef public dict _by_ip, _rx, _rx_fd, _mergers, _tx, _main, _routes, _groups, _mc_senders
    cdef public set _checksummed
    cdef public object _ready, _woken, _wake_r, _wake_w, _stop, _resume, _driver, _thread
    cdef public object _sleep_until
    cdef public long long _wake_fd, tos
    cdef public double _poller_seen
    cdef public bint gso, gro

    @cython.locals(route=tuple, sport=object)
    cpdef transmit(self, HCA src, Packet pkt, double now)
    cpdef _send_run(self, object src, object sock, list run, long long seg, object dest,
                    tuple addr)
    @cython.locals(got=cython.bint, unanswered=cython.longlong, mergers=dict, rx_fd=dict,
                   ready=list, took=cython.bint, merger=BurstMerger, entry=tuple)
    cpdef bint _drain(self)
    cpdef long long _take(self, object hca, BurstMerger merger, object data, long long size,
                          object peer, object local, object now)
    @cython.locals(datagrams=cython.longlong)
    cpdef long long _deliver(self, object hca, object pkts, object now)
    @cython.locals(got=cython.bint, did=cython.bint)
    cpdef bint progress(self)
    @cython.locals(did=cython.bint)
    cpdef bint posted(self)
    cpdef _timers_moved(self)
    cpdef bint _standing_back(self)


cpdef _sendto(object src, object sock, object parts, object dest)
