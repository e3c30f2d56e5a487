/* What the C check programs share (C_CHECKS and fork.c in tests/native/test_c_tools.py):
 * one line per check, "ok ..." or "FAIL ...", counted for the exit status, and
 * the first device, opened. */
#ifndef SV_TEST_CHECK_H
#define SV_TEST_CHECK_H

#include <stdio.h>

#include <infiniband/verbs.h>

static int failures;

static inline void check(int ok, const char *what)
{
	printf("%s %s\n", ok ? "ok" : "FAIL", what);
	fflush(stdout);
	if (!ok)
		failures++;
}

/* The first device, opened; NULL, with a FAIL line, if there is none. */
static inline struct ibv_context *open_first_device(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	if (list)
		ibv_free_device_list(list);
	if (!ctx)
		printf("FAIL no device\n");
	return ctx;
}

#endif
