/* The device-node section of libsoftverbs_preload.so (tests/native/test_preload.py).
 *
 *   preload_check present|absent
 *
 * "present": every path call the library interposes sees
 * /dev/infiniband/softverbs7 (and softverbs12) as a character device anyone
 * may read and write, and can open it; names that are not a softverbs
 * device's node -- softverbs, softverbs01, softverbs0x, uverbs0, a relative
 * path -- are passed on untouched (ENOENT).  "absent" (run without the
 * library): the node is not there, for the same calls.  One line per check,
 * "ok ..." or "FAIL ..."; exit 1 if any failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "check.h"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
/* the glibc < 2.33 entry point, referenced as a binary built then does
 * (__xstat@GLIBC_2.2.5, now a compatibility symbol); not in the ASan build,
 * whose link makes a broken reference of it */
int old_xstat(int ver, const char *path, struct stat *buf);
__asm__(".symver old_xstat, __xstat@GLIBC_2.2.5");
#endif

static int is_node(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && (st->st_mode & 0666) == 0666;
}

/* every interposed call on `path`; `want`: does the node exist? */
static void probe(const char *path, int want)
{
	char what[160];
	struct stat st;
	struct stat64 st64;
	struct statx stx;
	int r;

#define CHECK(name, cond)                                                        \
	do {                                                                     \
		snprintf(what, sizeof(what), "%s %s", name, path);               \
		check(want ? (cond) : (r != 0 && errno == ENOENT), what);        \
	} while (0)

	r = stat(path, &st);
	CHECK("stat", r == 0 && is_node(&st));
	r = lstat(path, &st);
	CHECK("lstat", r == 0 && is_node(&st));
	r = fstatat(AT_FDCWD, path, &st, 0);
	CHECK("fstatat", r == 0 && is_node(&st));
	r = stat64(path, &st64);
	CHECK("stat64", r == 0 && S_ISCHR(st64.st_mode));
	r = fstatat64(AT_FDCWD, path, &st64, AT_SYMLINK_NOFOLLOW);
	CHECK("fstatat64", r == 0 && S_ISCHR(st64.st_mode));
	r = statx(AT_FDCWD, path, 0, STATX_TYPE | STATX_MODE, &stx);
	CHECK("statx", r == 0 && S_ISCHR(stx.stx_mode));
	r = access(path, R_OK | W_OK);
	CHECK("access", r == 0);
	r = faccessat(AT_FDCWD, path, R_OK | W_OK, 0);
	CHECK("faccessat", r == 0);
	r = euidaccess(path, R_OK | W_OK);
	CHECK("euidaccess", r == 0);
	/* /dev/null has no such attribute: ENODATA, not ENOENT, once it is found */
	int found = lgetxattr(path, "user.none", NULL, 0) >= 0 || errno != ENOENT;
	snprintf(what, sizeof(what), "lgetxattr %s", path);
	check(found == want, what);
	int fd = open(path, O_RDWR);
	r = fd < 0;
	CHECK("open", fd >= 0);
	if (fd >= 0)
		close(fd);
	fd = openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	r = fd < 0;
	CHECK("openat", fd >= 0);
	if (fd >= 0)
		close(fd);
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
	r = old_xstat(1, path, &st); /* 1: _STAT_VER_LINUX on x86-64 */
	CHECK("__xstat", r == 0 && is_node(&st));
#endif
#undef CHECK
}

int main(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "present") && strcmp(argv[1], "absent"))) {
		fprintf(stderr, "usage: %s present|absent\n", argv[0]);
		return 2;
	}
	int want = !strcmp(argv[1], "present");
	probe("/dev/infiniband/softverbs7", want);
	probe("/dev/infiniband/softverbs12", want);
	static const char *const others[] = {
		"/dev/infiniband/softverbs", "/dev/infiniband/softverbs01",
		"/dev/infiniband/softverbs0x", "/dev/infiniband/uverbs0",
		"infiniband/softverbs0",
	};
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
		probe(others[i], 0);
	return failures ? 1 : 0;
}
