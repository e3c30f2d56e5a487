# Cython declarations for memory.py (compiled mode only; see softverbs.compiled).
# MemKey and KeyTable become extension types: the requester and the responder
# hold the key table typed (through HCA.keys), so the lkey and rkey checks
# they make per SGE and per remote access are C calls reading C struct fields.
# The key, its rights and its window bookkeeping are C integers, and so is the
# lkey or rkey a check is asked about (32 bits: its index and the key compare
# are C operations); a region's address and length stay Python integers (an
# implicit region is 2**64 long, and an address may use all 64 bits), as do
# the other arguments that come from the application or the wire.

cimport cython

# module constants read per SGE and per remote access: C globals, no dict lookup
cdef long long _SHIFT, _LOCAL_WRITE, _REMOTE_READ, _REMOTE_ATOMIC
cdef object _MR, _MKEY, _MW2
# the service's pass (new_pass): a C counter, not a module dict entry rewritten per message
cdef long long _pass
# read by device/memory's mapping checks, twice per WRITE the service serves: a C call
cpdef long long current_pass()
# begun by the service per message and per doorbell wake-up (service/server.py): a C call
cpdef new_pass()

cdef class MemKey:
    cdef public object kind, pd, owner, iova, length, view, mr, resolver, xform
    cdef public long long key, access, qpn, binds
    cdef public bint valid, unmapped

    cpdef slice(self, object addr, object length)


cdef class KeyTable:
    cdef public object counters, on_unmapped, _key_byte
    cdef public dict _keys
    cdef public long long _next_index, integrity_errors

    @cython.locals(mk=MemKey)
    cpdef local(self, long long lkey, object pd, object addr, object length, bint write)
    @cython.locals(mk=MemKey, got=object)
    cpdef remote(self, long long rkey, object pd, object qpn, object va, object length,
                 long long right)
    @cython.locals(span=object, off=object, got=object, view=object)
    cdef _access(self, MemKey mk, object addr, object length, bint write, str name,
                 long long key)
    cpdef unmapped(self, MemKey mk, object what)
