/* A create verb whose memory runs out after the device made the object
 * (tests/native/test_c_enomem.py).
 *
 * verbs.c's call_and_alloc makes the device's object first and then callocs
 * this library's side of it; if that calloc fails, it must destroy the
 * device's object again, fail with ENOMEM and return NULL.  verbs.c is
 * included here with its calloc renamed to one that fails once when armed, so
 * that branch runs against a real softverbsd; the program is linked with the
 * library's other sources instead of libibverbs.so.1.
 *
 *   enomem     prints "ready" once the context and the objects the cases need
 *              exist, and waits for a line on stdin; then arms the failure
 *              before each create verb below, prints "ok VERB" where the verb
 *              returned NULL with errno ENOMEM and the armed calloc was the
 *              one that failed ("FAIL VERB ..." otherwise), prints "failed"
 *              and waits for a line again -- the test counts the device's
 *              objects at both waits -- then destroys its objects and exits 0.
 */
#define _GNU_SOURCE	/* as verbs.c, which comes after the headers below */
#include <fcntl.h>
#include <stdlib.h>

static int fail_armed;	/* the next calloc of verbs.c returns NULL */

static void *failing_calloc(size_t n, size_t size)
{
	if (fail_armed) {
		fail_armed = 0;
		return NULL;
	}
	return calloc(n, size);
}

#define calloc failing_calloc
#include "verbs.c"
#undef calloc

static char buf[4096];
static int failures;

static void wait_for_the_test(const char *what)
{
	char line[16];
	printf("%s\n", what);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		exit(3);
}

/* `made` is what the create verb returned with the failure armed: it must be
 * NULL with errno ENOMEM, and the armed calloc must be the one that failed
 * (else the verb failed for another reason and the branch did not run). */
static void check(const char *verb, const void *made)
{
	int err = errno;
	if (!made && err == ENOMEM && !fail_armed) {
		printf("ok %s\n", verb);
		return;
	}
	printf("FAIL %s: returned %p, errno %d (%s), calloc %s\n", verb, made, err, strerror(err),
	       fail_armed ? "not reached" : "failed");
	failures++;
	fail_armed = 0;
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		fprintf(stderr, "enomem: no device\n");
		return 2;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		perror("enomem: setup");
		return 2;
	}
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid)) {
		perror("enomem: ibv_query_gid");
		return 2;
	}
	wait_for_the_test("ready");

	fail_armed = 1;
	check("ibv_alloc_pd", ibv_alloc_pd(ctx));
	fail_armed = 1;
	check("ibv_reg_mr", ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE));
	fail_armed = 1;
	check("ibv_alloc_mw", ibv_alloc_mw(pd, IBV_MW_TYPE_2));
	struct ibv_ah_attr ah = {.is_global = 1, .port_num = 1,
				 .grh = {.dgid = gid, .sgid_index = 1, .hop_limit = 1}};
	fail_armed = 1;
	check("ibv_create_ah", ibv_create_ah(pd, &ah));
	struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD |
					IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1, .oflags = O_CREAT};
	fail_armed = 1;
	check("ibv_open_xrcd", ibv_open_xrcd(ctx, &xa));
	wait_for_the_test("failed");

	if (ibv_dealloc_pd(pd) || ibv_close_device(ctx)) {
		perror("enomem: teardown");
		return 2;
	}
	return failures ? 1 : 0;
}
