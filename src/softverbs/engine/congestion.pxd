# Cython declarations for congestion.py (compiled mode only; see softverbs.compiled).
# The requester asks its congestion control for the window, the quantum and
# whether it may send on every message, and reports every burst sent: the
# interface and the default kinds (slow_restart, none) are extension types and
# the requester holds the object typed (requester.pxd), so those are C calls.
# Dcqcn stays a Python subclass (its many fields, its Python overrides of these
# cpdef methods are found and called as Python methods).

cdef class CongestionControl:
    cpdef reset(self, long long window)
    cpdef long long window(self, long long limit)
    cpdef bint can_send(self, double now)
    cpdef object next_send_time(self)
    cpdef long long quantum(self, long long pmtu)
    cpdef on_packet_sent(self, long long nbytes, long long npkts, double now)
    cpdef on_ack(self, long long npkts, double now)
    cpdef on_loss(self, double now)
    cpdef bint on_cnp(self, double now)
    cpdef object rate(self)


cdef class NoControl(CongestionControl):
    pass


cdef class SlowRestart(CongestionControl):
    cdef public long long cwnd, cwnd_credit, limit
