# Cython declarations for qp.py (compiled mode only; see softverbs.compiled).
# QPEngine becomes an extension type (a subclass of QPCore) holding its three
# parts typed: a packet's dispatch to the responder or the completer and a
# doorbell's to the requester are C calls.  It keeps a __dict__ and weak
# references, as a Python subclass had: what the device or a test hangs on a
# QP still works, and GsiQP stays a Python subclass of it.

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
    cdef dict __dict__
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
