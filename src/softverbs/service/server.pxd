# Cython declarations for server.py (compiled mode only; see softverbs.compiled).
# The loop's own objects become extension types: the turn, the read of a
# client's socket and the ring of its doorbells read and write their fields as
# C struct members (the counters and flags as C integers), and call each other
# as C functions, and its runtimes are typed (fabric/runtime.pxd), so their
# progress and next_deadline are C calls.  Nothing else in softverbs cimports them.

from softverbs.engine.qp cimport QPEngine
from softverbs.fabric.runtime cimport Runtime

cimport cython
cimport softverbs.engine.memory as engine_memory  # new_pass, per doorbell: a C call

# epoll's and selectors' event bits (_ready, _turn): C integers, not module dict entries
cdef long _READ, _WRITE, _NOT_IN, _NOT_OUT


cdef class Client:
    cdef public object sock, pid, uid, owner, memory, outq, cm_events, _want_write, _send_lock, bell
    cdef public bint memory_lent, alive, greeted, kicked
    cdef public long long events_dropped, single, quiet


cdef class _Bell:
    cdef public object client, fd
    cdef public list queues
    cdef public dict seen
    cdef public long long made


cdef class Service:
    cdef public object path, pidfile, registry, host, idle_exit, sel, stats, started
    cdef public object _idle_since, _writers_lock, _fence, _pid_fd
    cdef public object listener, _wake_r, _wake_w, _epoll
    cdef public dict clients, _polled, _keys
    cdef public list _runtime_list
    cdef public long long _runtime_devices
    cdef public set _writers, _rung
    cdef public double spin, _busy, _timeout
    cdef public bint _flagged, _stopping
    cdef public long long _eventfd_rung
    cdef object __weakref__  # softverbs.cm.service keeps its agents by service

    @cython.locals(served=cython.bint, client=Client, mask=cython.long)
    cpdef _turn(self)
    @cython.locals(out=list, devices=list)
    cpdef list _runtimes(self)
    cpdef list _wait(self, double timeout)
    @cython.locals(keys=dict, out=list, ev=cython.long, mask=cython.long)
    cpdef list _ready(self, double timeout)
    @cython.locals(timeout=cython.double, runtime=Runtime, deadline=cython.double,
                   now=cython.double)
    cpdef double _progress(self, object runtimes)
    @cython.locals(client=Client, budget=cython.longlong, got=cython.longlong, held=dict)
    cpdef _read(self, object sock)
    @cython.locals(n=cython.longlong)
    cpdef _ring_held(self, Client client, dict held)
    @cython.locals(client=Client, made=cython.longlong, moved=list, seen=dict, objects=dict,
                   n=cython.Py_ssize_t, i=cython.Py_ssize_t, runtime=Runtime, now=cython.double,
                   eng=QPEngine)
    cpdef _rang(self, _Bell bell)
    cpdef bint _ring(self, Client client, object qp, object queue)
    cpdef bint _doorbell(self, Client client, object qp, object queue)
