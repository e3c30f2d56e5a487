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

/* Move an RC QP through INIT and RTR to RTS towards QP `dest` at `gid` (GID index 1 on
 * both sides, port 1), granting `access`, with `mtu` and `rd_atomic` reads or atomics in
 * flight each way; 0 or -1. */
static inline int connect_rc(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *gid,
			     int access, enum ibv_mtu mtu, uint8_t rd_atomic)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = (unsigned)access};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		return -1;
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = dest,
		.max_dest_rd_atomic = rd_atomic, .min_rnr_timer = 1,
		.ah_attr = {.is_global = 1, .port_num = 1,
			    .grh = {.dgid = *gid, .sgid_index = 1, .hop_limit = 64}},
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = rd_atomic};
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

#endif
