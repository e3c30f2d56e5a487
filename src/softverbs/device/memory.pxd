# Cython declarations for memory.py (compiled mode only; see softverbs.compiled).
# The objects of every access the service makes to a client's memory become
# extension types: a span's slice is made without a call to __init__, its
# fields are C struct slots, and the memory it belongs to is held typed, so
# the bounds of a copy, the mapping check and the pread/pwrite are C calls
# up to the system call.  Addresses and lengths stay Python integers: they
# come from the application or the wire and may use all 64 bits.  Nothing
# cimports this module; it cimports engine/memory, whose current_pass every
# mapping check asks (so both are in softverbs.compiled.LINKED).

cimport cython
cimport softverbs.engine.memory as engine_memory


@cython.final
cdef class Pin:
    cdef public list segments
    cdef public bytes answer


@cython.final
cdef class ProcessMemory:
    cdef public int fd, maps, pidfd
    cdef public object pid
    cdef public long long faults, _seen_pass, vm_copies
    cdef public bint closed, reuse, vm
    cdef public str vm_why
    # the mapping-check cache: (start, end, backing) the kernel gave this pass
    cdef public list _seen
    # the Pin.answer values the kernel gave again this pass
    cdef public set _good

    cpdef _vm_open(self, int fd, object pid)
    cpdef bint _vm_pidfd(self)
    cpdef _vm_refused(self, str why)
    @cython.locals(n=Py_ssize_t, done=Py_ssize_t)
    cpdef Py_ssize_t _vm_copy(self, object data, object addr, Py_ssize_t cut, bint write)
    cpdef dict copies(self)
    cpdef bytearray _ask(self, object addr)
    cpdef bytearray _query_at(self, object addr)
    cpdef tuple _answer(self, bytearray answer)
    cpdef _new_pass(self, long long now)
    @cython.locals(answer=bytearray, seen=tuple, got=tuple, now=cython.longlong)
    cpdef backing(self, object addr)
    @cython.locals(segments=list, got=tuple, made=Pin, answer=bytearray)
    cpdef pin(self, object addr, object length)
    @cython.locals(segments=list, backed=tuple)
    cpdef object _adopt(self, Pin pin, bytearray answer)
    @cython.locals(answer=bytes, asked=bytearray, good=bytes, now=cython.longlong, seen=tuple,
                   got=tuple)
    cpdef bint still_pinned(self, Pin pin, object addr, object length)
    @cython.locals(seg=tuple)
    cpdef bint _still_pinned(self, Pin pin, object addr, object length, tuple got)
    @cython.locals(data=bytes, n=Py_ssize_t)
    cpdef bytes read(self, object addr, object length)
    @cython.locals(done=Py_ssize_t, parts=list, more=bytes)
    cpdef bytes _read_rest(self, bytes data, object addr, Py_ssize_t length)
    @cython.locals(view=memoryview, done=Py_ssize_t)
    cpdef object read_pooled(self, object addr, Py_ssize_t length)
    @cython.locals(n=Py_ssize_t, length=Py_ssize_t)
    cpdef _read_rest_into(self, memoryview view, object addr, Py_ssize_t done)
    @cython.locals(done=Py_ssize_t, n=Py_ssize_t)
    cpdef write(self, object addr, object data)
    @cython.locals(n=Py_ssize_t)
    cpdef _write_rest(self, object addr, object data, Py_ssize_t done)
    cpdef write_ordered(self, object addr, object data, Py_ssize_t tail)
    # cut: boxed once, for both slices (as a C integer each slice boxed it again)
    @cython.locals(n=Py_ssize_t, cut=object, done=Py_ssize_t)
    cpdef _write_ordered(self, object addr, object view, Py_ssize_t tail)
    cpdef ProcessSpan span(self, object addr, object length, bint pinned=*)
    cpdef close(self)


cpdef bint _unshared(bytearray buf)


# reads of at least this many bytes are pooled: POOLED_READ as a C integer
cdef Py_ssize_t _POOLED_READ
# copies of at least this many bytes go through process_vm_*: VM_COPY as a C integer
cdef Py_ssize_t _VM_COPY
# a PROCMAP_QUERY argument but for the address, copied by each query
cdef bytearray _PROCMAP_ASK


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
cdef class ProcessSpan:
    cdef public ProcessMemory mem
    cdef public object addr, length
    cdef public Pin pin

    @cython.locals(n=Py_ssize_t, view=object)
    cpdef place(self, object offset, object data, Py_ssize_t tail)
    cpdef object read(self)
    cpdef bint still_mapped(self)
    cpdef object fetch(self, object offset, object length)
    cpdef object part(self, object offset, object length)


cdef object _byte_view(object data)
@cython.locals(n=Py_ssize_t)
cdef object _read(ProcessMemory mem, object addr, object length)
@cython.locals(pin=Pin)
cdef object _backed(ProcessSpan span, object offset, object length)


cdef ProcessSpan _cut(ProcessSpan span, slice index)


@cython.locals(part=ProcessSpan)
cdef ProcessSpan _subspan(ProcessSpan span, object start, object length)
