# Cython declarations for opcodes.py (compiled mode only; see softverbs.compiled).
# OpInfo becomes an extension type with read-only typed fields: an engine
# method whose .pxd types its ``info`` argument OpInfo reads first/last/imm/inv
# as C ints and kind/transport as C struct members, with no attribute lookup
# by name.  Python code reads them as before, through the attribute descriptors.

# the AETH syndrome's parts, read for every ACK: C calls from a cimporting module
cpdef long long aeth_kind(long long syndrome)
cpdef long long aeth_value(long long syndrome)

cdef class OpInfo:
    cdef readonly long long opcode, position
    cdef readonly object name, transport, op, kind, hdrs
    cdef readonly bint payload, request, first, last, imm, inv
