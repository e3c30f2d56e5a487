# Cython declarations for codec.py (compiled mode only; see softverbs.compiled).
# Every packet sent or received over UDP passes through _encode or
# _decode_transport and the ICRC helpers.  Typed as Packet, a packet's fields
# are read and written as C struct members, not looked up by name (generic
# attribute access was most of a small packet's encode and decode), and the
# helpers call each other as C functions.  The public functions stay Python
# functions with their keyword arguments; each calls its typed positional form.

cimport cython

from softverbs.wire.packet cimport Packet

cdef dict _PSEUDO_CRCS, _GIDS

@cython.locals(h=cython.longlong, hlen=cython.longlong, n=cython.longlong,
               pad=cython.longlong, end=cython.longlong, off=cython.longlong,
               start=cython.longlong, b1=cython.longlong)
cpdef tuple _encode(Packet pkt, long long head, long long tail)

@cython.locals(pkt=Packet, n=cython.longlong, h=cython.longlong, hlen=cython.longlong,
               end=cython.longlong, pad=cython.longlong, off=cython.longlong,
               op=cython.longlong, b1=cython.longlong)
cpdef Packet _decode_transport(object data, bint has_icrc)

@cython.locals(pkt=Packet, end=cython.longlong)
cpdef Packet _decode_udp(object data, object src_ip, object dst_ip, object sport,
                         object dport, bint check_icrc, object ip_id)

cpdef object _pseudo_crc(object tlen, object w0, object src, object dst, object sport,
                         object dport, object ip_id=*)

cpdef object _icrc(object mv, long long start, long long end, object w0, object src,
                   object dst, object sport, object dport, object ip_id=*)

cpdef bytes _gid(object ip)

cpdef _seal(bytearray buf, long long end, object w0, object src_ip, object dst_ip,
            object sport, object dport, object ip_id)

@cython.locals(t_end=cython.longlong)
cpdef object _icrc_id(object mv, long long off, long long end, object seed, bint v4)


cdef class BurstMerger:
    cdef public object flow, head, tail, run
    cdef public long long next_id

    cpdef list flush(self)

    @cython.locals(n=cython.longlong, off=cython.longlong, end=cython.longlong,
                   length=cython.longlong, t_end=cython.longlong, head=Packet, pkt=Packet,
                   tail=list, v4=bint)
    cpdef list feed(self, object data, long long size, object src_ip, object dst_ip,
                    object sport, object dport=*)
