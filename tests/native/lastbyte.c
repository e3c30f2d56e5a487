/* Last-byte polling (tests/native/test_lastbyte.py): data lands in increasing
 * address order, the last cache line last.
 *
 *   lastbyte OP ITERATIONS SIZE...      OP: write, read or send
 *
 * Two RC QPs of this process, connected to each other over port 1, GID 1.
 * Each iteration takes the next SIZE (round robin), fills the source with a
 * pattern unique to the iteration, fills the destination with the pattern's
 * complement (so every byte must change), posts the operation, and then --
 * before it looks at any completion, as perftest's *_lat and uDAPL's dtest -W
 * do -- spins on the destination's last byte until it holds its new value.
 * At that moment every byte before it must hold its new value too: the
 * program compares the whole buffer, counts the iterations where some byte is
 * stale and reports the first stale offset.  Only then it polls the
 * completion.  The device places the data from another process (softverbsd,
 * through /proc/PID/mem), so a placement that makes the end visible first is
 * seen here as it would be by any such program.
 *
 * Prints "ok OP iterations N errors 0" (exit 0) or "FAIL OP ... first error
 * at OFFSET (len SIZE)" (exit 1); "FAIL setup ..." (exit 2).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "check.h"

enum op { OP_WRITE, OP_READ, OP_SEND };

#define RW (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* the byte at offset i of iteration it's message: differs from one
 * iteration to the next at every offset */
static inline uint8_t pattern(unsigned it, size_t i)
{
	return (uint8_t)(it * 37u + (unsigned)(i >> 6) * 11u + (unsigned)i);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s write|read|send ITERATIONS SIZE...\n", argv[0]);
		return 2;
	}
	enum op op = !strcmp(argv[1], "write") ? OP_WRITE : !strcmp(argv[1], "read") ? OP_READ
		: !strcmp(argv[1], "send") ? OP_SEND : (enum op)-1;
	if ((int)op < 0) {
		fprintf(stderr, "unknown operation %s\n", argv[1]);
		return 2;
	}
	unsigned iters = (unsigned)strtoul(argv[2], NULL, 0);
	int nsizes = argc - 3;
	size_t sizes[64], max = 0;
	if (nsizes > 64)
		nsizes = 64;
	for (int i = 0; i < nsizes; i++) {
		sizes[i] = strtoul(argv[3 + i], NULL, 0);
		if (sizes[i] == 0) {
			fprintf(stderr, "bad size %s\n", argv[3 + i]);
			return 2;
		}
		if (sizes[i] > max)
			max = sizes[i];
	}

	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 2;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *a = cq ? ibv_create_qp(pd, &ia) : NULL;
	struct ibv_qp *b = a ? ibv_create_qp(pd, &ia) : NULL;
	/* the source is A's, the destination B's; for a READ, A reads B's source */
	uint8_t *src = aligned_alloc(4096, (max + 4095) / 4096 * 4096);
	uint8_t *dst = aligned_alloc(4096, (max + 4095) / 4096 * 4096);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *smr = b && src ? ibv_reg_mr(pd, src, max, acc) : NULL;
	struct ibv_mr *dmr = smr && dst ? ibv_reg_mr(pd, dst, max, acc) : NULL;
	union ibv_gid gid;
	if (!dmr || ibv_query_gid(ctx, 1, 1, &gid) || connect_rc(a, b->qp_num, &gid, RW, IBV_MTU_4096, 1) ||
	    connect_rc(b, a->qp_num, &gid, RW, IBV_MTU_4096, 1)) {
		printf("FAIL setup\n");
		return 2;
	}

	unsigned errors = 0;
	long first_error = -1;
	size_t first_len = 0;
	for (unsigned it = 0; it < iters; it++) {
		size_t len = sizes[it % (unsigned)nsizes];
		for (size_t i = 0; i < len; i++) {
			src[i] = pattern(it, i);
			dst[i] = (uint8_t)~pattern(it, i);
		}
		struct ibv_sge sge = {.addr = (uintptr_t)src, .length = (uint32_t)len,
				      .lkey = smr->lkey};
		struct ibv_send_wr wr = {.wr_id = it, .sg_list = &sge, .num_sge = 1,
					 .send_flags = IBV_SEND_SIGNALED}, *bad;
		struct ibv_qp *poster = a;
		int want = 1;
		if (op == OP_WRITE) {
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.wr.rdma.remote_addr = (uintptr_t)dst;
			wr.wr.rdma.rkey = dmr->rkey;
		} else if (op == OP_READ) {
			/* A reads B's src into its dst */
			sge.addr = (uintptr_t)dst;
			sge.lkey = dmr->lkey;
			wr.opcode = IBV_WR_RDMA_READ;
			wr.wr.rdma.remote_addr = (uintptr_t)src;
			wr.wr.rdma.rkey = smr->rkey;
		} else {
			struct ibv_sge rsge = {.addr = (uintptr_t)dst, .length = (uint32_t)len,
					       .lkey = dmr->lkey};
			struct ibv_recv_wr rwr = {.wr_id = it, .sg_list = &rsge, .num_sge = 1}, *rbad;
			if (ibv_post_recv(b, &rwr, &rbad)) {
				printf("FAIL post_recv\n");
				return 2;
			}
			wr.opcode = IBV_WR_SEND;
			want = 2;
		}
		if (ibv_post_send(poster, &wr, &bad)) {
			printf("FAIL post_send\n");
			return 2;
		}
		volatile uint8_t *last = dst + len - 1;
		uint8_t expect = pattern(it, len - 1);
		time_t end = time(NULL) + 10;
		while (*last != expect) {
			if (time(NULL) > end) {
				printf("FAIL %s iteration %u: the last byte never came (len %zu)\n",
				       argv[1], it, len);
				return 1;
			}
		}
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		for (size_t i = 0; i < len; i++) {
			if (((volatile uint8_t *)dst)[i] != pattern(it, i)) {
				if (first_error < 0) {
					first_error = (long)i;
					first_len = len;
				}
				errors++;
				break;
			}
		}
		struct ibv_wc wc[2];
		int got = poll_n(cq, wc, want);
		for (int k = 0; k < got; k++) {
			if (wc[k].status != IBV_WC_SUCCESS) {
				printf("FAIL %s iteration %u: completion %s\n", argv[1], it,
				       ibv_wc_status_str(wc[k].status));
				return 1;
			}
		}
		if (got != want) {
			printf("FAIL %s iteration %u: %d of %d completions\n", argv[1], it, got, want);
			return 1;
		}
		if (memcmp(src, dst, len)) {
			printf("FAIL %s iteration %u: wrong data after the completion\n", argv[1], it);
			return 1;
		}
	}
	if (errors)
		printf("FAIL %s iterations %u errors %u first error at %ld (len %zu)\n", argv[1],
		       iters, errors, first_error, first_len);
	else
		printf("ok %s iterations %u errors 0\n", argv[1], iters);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(smr);
	ibv_destroy_qp(b);
	ibv_destroy_qp(a);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	free(src);
	free(dst);
	return errors ? 1 : 0;
}
