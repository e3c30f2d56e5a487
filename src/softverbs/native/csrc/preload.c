/* libsoftverbs_preload.so: what `softverbs exec` puts on LD_PRELOAD.
 *
 * Each section below is independent: its own functions, its own state.
 *
 * ---------------------------------------------------------------------------
 * Section 1: device nodes (/dev/infiniband/softverbsN)
 *
 * A kernel verbs device has a character device node, /dev/infiniband/uverbsN,
 * that rdma-core's libibverbs opens.  softverbs' libibverbs talks to
 * softverbsd over a socket instead, so there is no node, and its devices'
 * dev_name is softverbsN (device.c), a name no kernel device has.  Some
 * programs check the node anyway: UCX lists an IB device only if stat() of
 * /dev/infiniband/<dev_name> says "character device" and access(R_OK|W_OK)
 * succeeds (uct_ib_device_is_accessible), and never opens it.  Making that
 * node takes root (mknod), which the users of a soft device -- a CI job, a
 * container -- do not have.
 *
 * So this section makes /dev/infiniband/softverbsN, for the path-taking stat,
 * access and open calls of the C library, the path /dev/null: a character
 * device everyone may read and write, which reads as empty if anything ever
 * opens it.  Every other path, and every call made with a file descriptor,
 * goes to the C library untouched.  The calls are the ones a program can
 * reach through the dynamic linker: stat/lstat/fstatat (and their 64 names,
 * and the __xstat family that binaries built against glibc < 2.33 call),
 * statx, the extended attribute reads ls makes, access/faccessat/euidaccess/
 * eaccess, open/openat (and their 64 and _FORTIFY_SOURCE __open_2 names).  What it cannot see: a raw system call, a
 * statically linked program, a set-user-ID program (the loader ignores
 * LD_PRELOAD there), and readdir of /dev/infiniband (which does not exist).
 * docs/c-programs.md (UCX) says why this and not a mount namespace.
 * ---------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define SV_EXPORT __attribute__((visibility("default")))

/* ======================= Section 1: device nodes ======================= */

#define NODE_PREFIX "/dev/infiniband/softverbs"
#define NODE_TARGET "/dev/null"

/* The path to use for `path`: /dev/null for /dev/infiniband/softverbsN (N a
 * decimal number without leading zeros), else `path` itself. */
static const char *node_path(const char *path)
{
	static const size_t n = sizeof(NODE_PREFIX) - 1;
	if (!path || strncmp(path, NODE_PREFIX, n) != 0)
		return path;
	const char *p = path + n;
	if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] != '\0'))
		return path;
	while (*p >= '0' && *p <= '9')
		p++;
	return *p ? path : NODE_TARGET;
}

/* The C library's `name` (the next definition after this library), looked up
 * once; `version` is tried when the name has no default version (the __xstat
 * family is a compatibility symbol since glibc 2.33).  NULL if there is none. */
static void *node_next(void **slot, const char *name, const char *version)
{
	void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (fn)
		return fn;
	fn = dlsym(RTLD_NEXT, name);
	if (!fn && version)
		fn = dlvsym(RTLD_NEXT, name, version);
	__atomic_store_n(slot, fn, __ATOMIC_RELEASE);
	return fn;
}

#if defined(__x86_64__)
#define GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define GLIBC_BASE "GLIBC_2.17"
#else
#define GLIBC_BASE NULL
#endif

/* Define `ret name(params)` forwarding `args` to the next `name`, with the
 * path argument `path` passed through node_path; ENOSYS if there is no next. */
#define NODE_WRAP(ret, name, version, params, args)                             \
	SV_EXPORT ret name params                                               \
	{                                                                       \
		static void *slot;                                              \
		ret(*next) params = (ret(*) params)node_next(&slot, #name, version); \
		if (!next) {                                                    \
			errno = ENOSYS;                                         \
			return -1;                                              \
		}                                                               \
		path = node_path(path);                                         \
		return next args;                                               \
	}

/* the glibc < 2.33 entry points, no longer declared by <sys/stat.h> */
int __xstat(int ver, const char *path, struct stat *buf);
int __lxstat(int ver, const char *path, struct stat *buf);
int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags);
int __xstat64(int ver, const char *path, struct stat64 *buf);
int __lxstat64(int ver, const char *path, struct stat64 *buf);
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags);
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);

NODE_WRAP(int, stat, NULL, (const char *path, struct stat *buf), (path, buf))
NODE_WRAP(int, lstat, NULL, (const char *path, struct stat *buf), (path, buf))
NODE_WRAP(int, fstatat, NULL, (int dirfd, const char *path, struct stat *buf, int flags),
	  (dirfd, path, buf, flags))
NODE_WRAP(int, stat64, NULL, (const char *path, struct stat64 *buf), (path, buf))
NODE_WRAP(int, lstat64, NULL, (const char *path, struct stat64 *buf), (path, buf))
NODE_WRAP(int, fstatat64, NULL, (int dirfd, const char *path, struct stat64 *buf, int flags),
	  (dirfd, path, buf, flags))
NODE_WRAP(int, __xstat, GLIBC_BASE, (int ver, const char *path, struct stat *buf),
	  (ver, path, buf))
NODE_WRAP(int, __lxstat, GLIBC_BASE, (int ver, const char *path, struct stat *buf),
	  (ver, path, buf))
NODE_WRAP(int, __fxstatat, GLIBC_BASE,
	  (int ver, int dirfd, const char *path, struct stat *buf, int flags),
	  (ver, dirfd, path, buf, flags))
NODE_WRAP(int, __xstat64, GLIBC_BASE, (int ver, const char *path, struct stat64 *buf),
	  (ver, path, buf))
NODE_WRAP(int, __lxstat64, GLIBC_BASE, (int ver, const char *path, struct stat64 *buf),
	  (ver, path, buf))
NODE_WRAP(int, __fxstatat64, GLIBC_BASE,
	  (int ver, int dirfd, const char *path, struct stat64 *buf, int flags),
	  (ver, dirfd, path, buf, flags))
NODE_WRAP(int, statx, NULL,
	  (int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf),
	  (dirfd, path, flags, mask, buf))
NODE_WRAP(ssize_t, getxattr, NULL,
	  (const char *path, const char *name, void *value, size_t size), (path, name, value, size))
NODE_WRAP(ssize_t, lgetxattr, NULL,
	  (const char *path, const char *name, void *value, size_t size), (path, name, value, size))
NODE_WRAP(ssize_t, listxattr, NULL, (const char *path, char *list, size_t size),
	  (path, list, size))
NODE_WRAP(ssize_t, llistxattr, NULL, (const char *path, char *list, size_t size),
	  (path, list, size))
NODE_WRAP(int, access, NULL, (const char *path, int mode), (path, mode))
NODE_WRAP(int, faccessat, NULL, (int dirfd, const char *path, int mode, int flags),
	  (dirfd, path, mode, flags))
NODE_WRAP(int, euidaccess, NULL, (const char *path, int mode), (path, mode))
NODE_WRAP(int, eaccess, NULL, (const char *path, int mode), (path, mode))
NODE_WRAP(int, __open_2, NULL, (const char *path, int flags), (path, flags))
NODE_WRAP(int, __open64_2, NULL, (const char *path, int flags), (path, flags))
NODE_WRAP(int, __openat_2, NULL, (int dirfd, const char *path, int flags),
	  (dirfd, path, flags))
NODE_WRAP(int, __openat64_2, NULL, (int dirfd, const char *path, int flags),
	  (dirfd, path, flags))

/* open and openat take a mode only when they may create a file */
static mode_t node_mode(int flags, va_list ap)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

#define NODE_OPEN(name)                                                         \
	SV_EXPORT int name(const char *path, int flags, ...)                    \
	{                                                                       \
		static void *slot;                                              \
		int (*next)(const char *, int, ...) =                           \
			(int (*)(const char *, int, ...))node_next(&slot, #name, NULL); \
		va_list ap;                                                     \
		va_start(ap, flags);                                            \
		mode_t mode = node_mode(flags, ap);                             \
		va_end(ap);                                                     \
		if (!next) {                                                    \
			errno = ENOSYS;                                         \
			return -1;                                              \
		}                                                               \
		return next(node_path(path), flags, mode);                      \
	}

#define NODE_OPENAT(name)                                                       \
	SV_EXPORT int name(int dirfd, const char *path, int flags, ...)         \
	{                                                                       \
		static void *slot;                                              \
		int (*next)(int, const char *, int, ...) =                      \
			(int (*)(int, const char *, int, ...))node_next(&slot, #name, NULL); \
		va_list ap;                                                     \
		va_start(ap, flags);                                            \
		mode_t mode = node_mode(flags, ap);                             \
		va_end(ap);                                                     \
		if (!next) {                                                    \
			errno = ENOSYS;                                         \
			return -1;                                              \
		}                                                               \
		return next(dirfd, node_path(path), flags, mode);               \
	}

NODE_OPEN(open)
NODE_OPEN(open64)
NODE_OPENAT(openat)
NODE_OPENAT(openat64)
