/* ibv_import_device, ibv_import_pd/mr/dm from C (tests/native/test_c_tools.py).
 *
 * As on rdma-core: a context imported from a duplicate of another's cmd_fd is
 * the same device context, so the PD, MR and DM handles of the one name the
 * same objects in the other; objects made on an imported PD work with the
 * original's; the imported context outlives the original's ibv_close_device.
 * A descriptor that is no context's, or a handle no object has, is refused.
 * Prints one line per check; exits 0 if all hold.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 1;
	check(ctx->cmd_fd >= 0, "an opened context has a cmd_fd");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE);
	struct ibv_alloc_dm_attr dma = {.length = 64};
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &dma);

	errno = 0;
	check(!ibv_import_device(-1) && errno == EBADF, "import of a closed fd: EBADF");
	int notctx = dup(STDIN_FILENO);
	errno = 0;
	check(!ibv_import_device(notctx) && errno == EINVAL, "import of a non-context fd: EINVAL");
	close(notctx);

	struct ibv_context *imp = ibv_import_device(dup(ctx->cmd_fd));
	check(imp && imp != ctx && imp->cmd_fd >= 0, "ibv_import_device of a dup of cmd_fd");
	if (!imp || !pd || !mr || !dm)
		return 1;
	errno = 0;
	check(!ibv_import_pd(imp, pd->handle + 1000) && errno == EINVAL,
	      "import of a PD handle no PD has: EINVAL");
	struct ibv_pd *ipd = ibv_import_pd(imp, pd->handle);
	check(ipd && ipd->context == imp && ipd->handle == pd->handle, "ibv_import_pd");
	struct ibv_mr *imr = ipd ? ibv_import_mr(ipd, mr->handle) : NULL;
	check(imr && imr->lkey == mr->lkey && imr->rkey == mr->rkey && imr->addr == mr->addr &&
	      imr->length == mr->length && imr->pd == ipd, "ibv_import_mr: the same keys and range");
	errno = 0;
	check(ipd && !ibv_import_mr(ipd, mr->handle + 1000) && errno == EINVAL,
	      "import of an MR handle no MR has: EINVAL");
	struct ibv_dm *idm = ibv_import_dm(imp, dm->handle);
	unsigned char in[64], out[64];
	memset(in, 0xab, sizeof(in));
	check(idm && !ibv_memcpy_to_dm(dm, 0, in, sizeof(in)) &&
	      !ibv_memcpy_from_dm(out, idm, 0, sizeof(out)) && !memcmp(in, out, sizeof(in)),
	      "ibv_import_dm: the same device memory");

	/* an RC QP on the imported PD writes with the imported MR's key into a
	 * buffer registered on the original context, and completes on an
	 * imported-context CQ */
	struct ibv_cq *cq = ibv_create_cq(imp, 4, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 2, .max_recv_wr = 2,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *a = cq ? ibv_create_qp(ipd, &ia) : NULL;
	struct ibv_qp *b = cq ? ibv_create_qp(pd, &ia) : NULL;
	union ibv_gid gid;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	int ok = a && b && !ibv_query_gid(ctx, 1, 1, &gid) &&
		 !connect_rc(a, b->qp_num, &gid, acc, IBV_MTU_1024, 1) &&
		 !connect_rc(b, a->qp_num, &gid, acc, IBV_MTU_1024, 1);
	strcpy(buf, "imported");
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 9, .lkey = imr ? imr->lkey : 0};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 2048;
	wr.wr.rdma.rkey = mr->rkey;
	struct ibv_wc wc;
	ok = ok && !ibv_post_send(a, &wr, &bad) && poll_n(cq, &wc, 1) == 1 &&
	     wc.status == IBV_WC_SUCCESS;
	check(ok && !strcmp(buf + 2048, "imported"), "an RDMA WRITE through imported objects");
	if (a)
		ibv_destroy_qp(a);
	if (b)
		ibv_destroy_qp(b);

	ibv_unimport_dm(idm);
	ibv_unimport_mr(imr);
	/* the original goes first: the imported context keeps the device context */
	ibv_free_dm(dm);
	ibv_dereg_mr(mr);
	check(ibv_close_device(ctx) == 0, "ibv_close_device of the original");
	struct ibv_mr *mr2 = ibv_reg_mr(ipd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	check(mr2 != NULL, "the imported context works after the original is closed");
	if (mr2)
		ibv_dereg_mr(mr2);
	if (cq)
		ibv_destroy_cq(cq);
	/* the original's PD struct still names the PD: destroying through it, the
	 * imported struct is then only unimported */
	check(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd after the original context's close");
	errno = 0;
	check(!ibv_import_pd(imp, ipd->handle) && errno == EINVAL, "a destroyed PD is not imported");
	ibv_unimport_pd(ipd);
	check(ibv_close_device(imp) == 0, "ibv_close_device of the imported context");
	return failures ? 1 : 0;
}
