# Cython declarations for memory.py (compiled mode only; see softverbs.compiled).
# The objects of every access the service makes to a client's memory become
# extension types: a span's slice is made without a call to __init__, its
# fields are C struct slots, and the memory it belongs to is held typed, so
# the bounds of a copy, the mapping check and the pread/pwrite are C calls
# up to the system call.  Addresses and lengths stay Python integers: they
# come from the application or the wire and may use all 64 bits.  Nothing
# cimports this module (it is not in softverbs.compiled.LINKED).

cimport cython


@cython.final
cdef class Pin:
    cdef public list segments


@cython.final
cdef class ProcessMemory:
    cdef public int fd, maps
    cdef public object pid
    cdef public long long faults, _seen_pass
    cdef public bint closed, reuse
    # the mapping-check cache: (start, end, backing) the kernel gave this pass
    cdef public list _seen
    cdef public bytearray _query

    @cython.locals(seen=tuple, got=tuple)
    cpdef backing(self, object addr)
    cpdef pin(self, object addr, object length)
    @cython.locals(segments=list, got=tuple, seg=tuple)
    cpdef bint still_pinned(self, Pin pin, object addr, object length)
    @cython.locals(data=bytes)
    cpdef bytes read(self, object addr, Py_ssize_t length)
    @cython.locals(done=Py_ssize_t, parts=list, more=bytes)
    cpdef bytes _read_rest(self, bytes data, object addr, Py_ssize_t length)
    @cython.locals(view=memoryview, done=Py_ssize_t)
    cpdef object read_pooled(self, object addr, Py_ssize_t length)
    @cython.locals(n=Py_ssize_t, length=Py_ssize_t)
    cpdef _read_rest_into(self, memoryview view, object addr, Py_ssize_t done)
    @cython.locals(done=Py_ssize_t)
    cpdef write(self, object addr, object data)
    @cython.locals(n=Py_ssize_t)
    cpdef _write_rest(self, object addr, object data, Py_ssize_t done)
    cpdef ProcessSpan span(self, object addr, object length, bint pinned=*)
    cpdef close(self)


cpdef bint _unshared(bytearray buf)


@cython.final
cdef class ReadBuffers:
    cdef public dict rings, next
    cdef public Py_ssize_t held, limit
    cdef public object lock

    @cython.locals(buf=bytearray)
    cpdef object take(self, Py_ssize_t length)
    @cython.locals(size=Py_ssize_t, ring=list, n=Py_ssize_t, i=Py_ssize_t, start=Py_ssize_t,
                   buf=bytearray)
    cpdef object _find(self, Py_ssize_t length)
    @cython.locals(size=Py_ssize_t, ring=list, kept=list)
    cpdef release(self)


@cython.final
@cython.freelist(16)
cdef class ProcessSpan:
    cdef public ProcessMemory mem
    cdef public object addr, length
    cdef public Pin pin

    cpdef object read(self)
    cpdef bint still_mapped(self)


@cython.locals(part=ProcessSpan)
cdef ProcessSpan _subspan(ProcessSpan span, object start, object length)
