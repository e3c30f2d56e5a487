/* A program that polls an empty CQ of the host device while the test kills the
 * service (tests/native/test_c_service_gone.py): with "ex", through
 * ibv_start_poll on an extended CQ, else through ibv_poll_cq.  It prints
 * "polling" once it polls, then "failed <value> <errno>" when the poll fails and
 * exits 0; "timeout" (exit 1) if the poll still finds nothing after 30 s. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "check.h"

int main(int argc, char **argv)
{
	int ex = argc > 1 && strcmp(argv[1], "ex") == 0;
	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 2;
	struct ibv_cq_init_attr_ex attr = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cqx = ex ? ibv_create_cq_ex(ctx, &attr) : NULL;
	struct ibv_cq *cq = ex ? (cqx ? ibv_cq_ex_to_cq(cqx) : NULL)
			       : ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq) {
		printf("FAIL no CQ\n");
		return 2;
	}
	printf("polling\n");
	fflush(stdout);
	time_t end = time(NULL) + 30;
	while (time(NULL) <= end) {
		if (ex) {
			struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
			int err = ibv_start_poll(cqx, &pa);
			if (err != ENOENT) {
				printf("failed %d %d\n", err, errno);
				return 0;
			}
		} else {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n != 0) {
				printf("failed %d %d\n", n, errno);
				return 0;
			}
		}
	}
	printf("timeout\n");
	return 1;
}
