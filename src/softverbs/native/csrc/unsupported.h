/* The entry points softverbs exports but does not implement, as one table per
 * library (unsupported_ibverbs.c, unsupported_rdmacm.c, providers/mlx5.c,
 * providers/efa.c): one line per symbol, so a program linked against rdma-core
 * loads (Debian links BIND_NOW: one missing symbol kills it at start) and the
 * call answers what rdma-core answers on a device without the feature.
 *
 * Each macro defines NAME with the return convention of its family -- the
 * arguments are never read, so the definitions take none (the caller's
 * registers are simply ignored, which the SysV x86-64 and AArch64 calling
 * conventions allow):
 *
 *   SV_UNSUP_NULL(NAME, ERR)    pointer: NULL with errno = ERR
 *   SV_UNSUP_ERRNO(NAME, ERR)   int, "0 or an errno value": returns ERR (errno = ERR too)
 *   SV_UNSUP_MINUS1(NAME, ERR)  int/ssize_t/off_t, "-1 and errno": -1 with errno = ERR
 *   SV_UNSUP_ZERO(NAME)         a count, flag or GUID: 0 ("none", "false")
 *   SV_UNSUP_VOID(NAME)         void: does nothing
 *
 * SV_SYMVER(NAME, "sym@VERSION") gives a definition a non-default version
 * (rdma-core's compatibility symbols: old binaries bind to them, new links never
 * do).  A symbol that gets a real implementation is deleted from its table and
 * defined where it belongs; the version script (*.map) does not change.
 */
#ifndef SV_UNSUPPORTED_H
#define SV_UNSUPPORTED_H

#include <errno.h>
#include <stddef.h>

#define SV_UNSUP_NULL(name, err) \
	void *name(void); \
	void *name(void) { errno = (err); return NULL; }
#define SV_UNSUP_ERRNO(name, err) \
	int name(void); \
	int name(void) { errno = (err); return (err); }
#define SV_UNSUP_MINUS1(name, err) \
	long name(void); \
	long name(void) { errno = (err); return -1; }
#define SV_UNSUP_ZERO(name) \
	long name(void); \
	long name(void) { return 0; }
#define SV_UNSUP_VOID(name) \
	void name(void); \
	void name(void) { }
#define SV_SYMVER(name, versioned) __asm__(".symver " #name "," versioned);

#endif
