/* What the C check programs share (C_CHECKS and fork.c in tests/native/test_c_tools.py):
 * one line per check, "ok ..." or "FAIL ...", counted for the exit status, the
 * first device, opened, and polling for a number of completions. */
#ifndef SV_TEST_CHECK_H
#define SV_TEST_CHECK_H

#include <stdio.h>
#include <time.h>

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

/* Poll exactly n completions (up to 5 s) into wc; how many came. */
static inline int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	time_t end = time(NULL) + 5;
	while (got < n && time(NULL) <= end) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		if (k < 0)
			return got;
		got += k;
	}
	return got;
}

#endif
