/* An LD_PRELOAD shim for tests/native/test_c_ptracer.py: every
 * prctl(PR_SET_PTRACER, ...) a program makes is appended to the file
 * $SV_PRCTL_LOG as "PID ARG2 RESULT ERRNO", then answered by the real prctl --
 * or, with SV_PRCTL_FAIL=N, failed with errno N without asking the kernel.
 * Other options go to the real prctl untouched. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

int prctl(int option, ...)
{
	va_list ap;
	va_start(ap, option);
	unsigned long arg2 = va_arg(ap, unsigned long), arg3 = va_arg(ap, unsigned long);
	unsigned long arg4 = va_arg(ap, unsigned long), arg5 = va_arg(ap, unsigned long);
	va_end(ap);
	int (*real)(int, ...) = (int (*)(int, ...))dlsym(RTLD_NEXT, "prctl");
	if (option != PR_SET_PTRACER)
		return real ? real(option, arg2, arg3, arg4, arg5) : (errno = ENOSYS, -1);
	const char *fail = getenv("SV_PRCTL_FAIL");
	int rc, err = 0;
	if (fail && *fail) {
		rc = -1;
		err = atoi(fail);
	} else {
		rc = real ? real(option, arg2, arg3, arg4, arg5) : (errno = ENOSYS, -1);
		err = rc ? errno : 0;
	}
	const char *log = getenv("SV_PRCTL_LOG");
	FILE *f = log && *log ? fopen(log, "a") : NULL;
	if (f) {
		fprintf(f, "%d %lu %d %d\n", (int)getpid(), arg2, rc, err);
		fclose(f);
	}
	errno = err;
	return rc;
}
