/* librdmacm.so.1's table of the rdma-core 44 symbols softverbs exports without
 * implementing them (unsupported.h says how each macro answers).  Every
 * librdmacm call reports failure as -1 with errno.
 *
 * rsockets (rsocket.h): softverbs has no rsockets, so rsocket() and raccept()
 * never hand out a socket and every call answers ENOSYS -- "function not
 * implemented", what glibc answers for a call the system lacks -- rather than
 * EOPNOTSUPP, which a program would read as "this socket type or option is not
 * supported" and try another.  rstream, riostream, rcopy and udpong thus load
 * and print "rsocket: Function not implemented".  rpoll and rselect are in
 * cma.c: with no rsocket there, every descriptor is an ordinary one, and they
 * are poll and select.
 */
#include "unsupported.h"

/* --- rsockets ------------------------------------------------------------------------------- */

SV_UNSUP_MINUS1(raccept, ENOSYS)
SV_UNSUP_MINUS1(rbind, ENOSYS)
SV_UNSUP_MINUS1(rclose, ENOSYS)
SV_UNSUP_MINUS1(rconnect, ENOSYS)
SV_UNSUP_MINUS1(rfcntl, ENOSYS)
SV_UNSUP_MINUS1(rgetpeername, ENOSYS)
SV_UNSUP_MINUS1(rgetsockname, ENOSYS)
SV_UNSUP_MINUS1(rgetsockopt, ENOSYS)
SV_UNSUP_MINUS1(riomap, ENOSYS)
SV_UNSUP_MINUS1(riounmap, ENOSYS)
SV_UNSUP_MINUS1(riowrite, ENOSYS)
SV_UNSUP_MINUS1(rlisten, ENOSYS)
SV_UNSUP_MINUS1(rread, ENOSYS)
SV_UNSUP_MINUS1(rreadv, ENOSYS)
SV_UNSUP_MINUS1(rrecv, ENOSYS)
SV_UNSUP_MINUS1(rrecvfrom, ENOSYS)
SV_UNSUP_MINUS1(rrecvmsg, ENOSYS)
SV_UNSUP_MINUS1(rsend, ENOSYS)
SV_UNSUP_MINUS1(rsendmsg, ENOSYS)
SV_UNSUP_MINUS1(rsendto, ENOSYS)
SV_UNSUP_MINUS1(rsetsockopt, ENOSYS)
SV_UNSUP_MINUS1(rshutdown, ENOSYS)
SV_UNSUP_MINUS1(rsocket, ENOSYS)
SV_UNSUP_MINUS1(rwrite, ENOSYS)
SV_UNSUP_MINUS1(rwritev, ENOSYS)
