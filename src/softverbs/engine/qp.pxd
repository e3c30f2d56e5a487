# Cython declarations for qp.py (compiled mode only; see softverbs.compiled).
# QPEngine becomes an extension type (a subclass of QPCore) holding its three
# parts typed: a packet's dispatch to the responder or the completer and a
# doorbell's to the requester are C calls.  It keeps weak references, and no
# __dict__: a cpdef method (QPCore's send, push_cqe, ...) called on an instance
# with one first looks itself up on the instance, in case a Python override
# hides it, and that lookup missed Cython's cache on every call, about 380
# instructions each.  GsiQP stays a Python subclass of it (with a __dict__).

cimport cython

from softverbs.engine.completer cimport Completer
from softverbs.engine.core cimport QPCore
from softverbs.engine.requester cimport Requester
from softverbs.engine.responder cimport Responder
from softverbs.wire.opcodes cimport OpInfo
from softverbs.wire.packet cimport Packet

# the states a QP takes requests and responses in: a C global, no dict lookup per packet
cdef object _RESPONDING

cdef class QPEngine(QPCore):
    cdef object __weakref__
    cdef public Requester req
    cdef public Completer comp
    cdef public Responder resp

    # a packet's dispatch: its OpInfo fields are C struct reads (GsiQP, a Python
    # subclass, overrides it; the device calls it by attribute, which finds that)
    @cython.locals(theirs=cython.longlong, ours=cython.longlong)
    cpdef receive(self, Packet pkt, OpInfo info, double now)
    # the service's ring of a send queue on an eventfd wake-up (service/server.py _rang): a C call
    cpdef doorbell(self, double now)
