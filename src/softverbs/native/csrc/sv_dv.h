/* softverbs' libibverbs.so.1 <-> its libmlx5.so.1: the private hooks
 * (SOFTVERBS_PRIVATE_2 in libibverbs.map, defined in verbs.c).
 *
 * libmlx5 is a thin client too: an mlx5dv QP is a QP of libibverbs made with
 * provider create flags and room for libmlx5's own state, and an mkey
 * configuration (mlx5dv_wr_mkey_configure) is a driver WQE -- IBV_WR_DRIVER1,
 * driver_op the mkey's handle, the configuration inline (docs/rings.md) --
 * built in the QP's send ring between wr_start and wr_complete.  The device
 * does the rest: it applies the configuration in send-queue order, checks
 * and generates the signatures, and stops a SIG_PIPELINING send queue. */
#ifndef SV_DV_H
#define SV_DV_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include "softverbs/protocol.h"

/* ibv_create_qp_ex with the provider's create flags (CreateQP.dv_flags) and
 * dv_size zeroed bytes of the caller's, freed with the QP (sv_dv_qp).  The QP
 * has the ibv_qp_ex ops whatever its send_ops_flags. */
struct ibv_qp *sv_dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr,
			       uint32_t dv_flags, size_t dv_size);
/* The caller's bytes of a QP made by sv_dv_create_qp; NULL for any other QP. */
void *sv_dv_qp(struct ibv_qp *qp);
/* A driver WQE for driver_op in the batch open on x (wr_id, wr_flags as any
 * WR); *room: the bytes of inline data its slot holds after the header.  NULL
 * if the batch already failed or the send queue is full. */
struct sv_send_wqe_header *sv_dv_wr_driver(struct ibv_qp_ex *x, uint32_t driver_op,
					   size_t *room);
/* Fail the batch open on x: its wr_complete returns err and posts nothing. */
void sv_dv_wr_fail(struct ibv_qp_ex *x, int err);
/* CREATE_MKEY, MKEY_CHECK, CANCEL_SEND or DESTROY to the service; 0 or an
 * errno (also in errno). */
int sv_dv_call(uint16_t op, const void *req, size_t req_len, void *reply, size_t reply_len);

#endif
