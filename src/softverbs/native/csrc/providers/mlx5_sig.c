/* libmlx5.so.1: mlx5dv signature offload for C programs (docs/signature.md),
 * opted into with SOFTVERBS_MLX5=sig.  A thin client like libibverbs: the
 * QPs are libibverbs' (sv_dv.h), an mkey is a service object (CREATE_MKEY),
 * mlx5dv_wr_mkey_configure and its setters encode the configuration into a
 * driver WQE (MkeyConf, MkeyEntry..., two MkeySigDomain), and the device
 * applies it in send-queue order, checks and generates the signatures, keeps
 * the errors for mlx5dv_mkey_check and stops a SIG_PIPELINING send queue
 * (SQD, IBV_EVENT_SQ_DRAINED).  Here are only the ABI of Debian's mlx5dv.h
 * (rdma-core 44) and the argument checks; the rest of mlx5 is EOPNOTSUPP. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <infiniband/mlx5dv.h>

#include "../sv_dv.h"

/* the room a configuration WQE needs: its header, 40 layout entries, two
 * domains (the Python client's MKEY_WQE_INLINE) */
#define CONF_INLINE 1024

enum { SET_ACCESS = 1, SET_LAYOUT = 2, SET_SIG = 4 };

struct dv_mkey {
	struct mlx5dv_mkey mkey;	/* first: the program's lkey and rkey */
	uint32_t handle;
	uint16_t max_entries;
	bool sig;
};

/* A QP's state, in the room libibverbs keeps for it (sv_dv_qp). */
struct dv_qp {
	struct mlx5dv_qp_ex dv;		/* first: what mlx5dv_qp_ex_from_ibv_qp_ex gives */
	struct ibv_qp_ex *qpx;
	uint64_t send_ops;
	int (*wr_complete)(struct ibv_qp_ex *);	/* libibverbs' */
	void (*wr_abort)(struct ibv_qp_ex *);
	/* the configuration WR being built: NULL when none */
	struct sv_send_wqe_header *wqe;
	size_t room;
	struct dv_mkey *mkey;
	uint8_t num_setters, setters;
	unsigned set;			/* SET_* */
	struct sv_mkey_conf conf;
	struct sv_mkey_sig_domain dom[2];	/* memory, wire */
};

static bool opted_in(void)
{
	const char *v = getenv("SOFTVERBS_MLX5");
	for (const char *p = v; p && *p; p += strcspn(p, ","), p += *p == ',') {
		size_t n = strcspn(p, ",");
		while (n && p[n - 1] == ' ')
			n--;
		while (n && *p == ' ')
			p++, n--;
		if (n == 3 && !strncasecmp(p, "sig", 3))
			return true;
	}
	return false;
}

bool mlx5dv_is_supported(struct ibv_device *device)
{
	(void)device;
	return opted_in();
}

static struct dv_qp *dv_of(struct mlx5dv_qp_ex *m)
{
	return (struct dv_qp *)m;
}

static void fail(struct dv_qp *q, int err)
{
	sv_dv_wr_fail(q->qpx, err);
}

/* Write the configuration into the WQE's inline data: the header, the entries
 * (written by the layout setters in place), the domains. */
static void encode(struct dv_qp *q)
{
	char *p = (char *)(q->wqe + 1);
	size_t entries = q->conf.nentries * sizeof(struct sv_mkey_entry);
	size_t doms = (q->conf.flags & SV_MKEY_CONF_SIG) ? sizeof(q->dom) : 0;
	memcpy(p, &q->conf, sizeof(q->conf));
	memcpy(p + sizeof(q->conf) + entries, q->dom, doms);
	q->wqe->flags |= SV_RING_F_INLINE;
	q->wqe->inline_len = (uint32_t)(sizeof(q->conf) + entries + doms);
}

/* The configuration WR a setter belongs to, counting the setter; NULL (and
 * the batch fails) if there is none, the setter came twice or one too many. */
static struct dv_qp *setter(struct mlx5dv_qp_ex *m, unsigned what)
{
	struct dv_qp *q = dv_of(m);
	if (!q->wqe || (q->set & what) || ++q->setters > q->num_setters) {
		fail(q, EINVAL);
		return NULL;
	}
	q->set |= what;
	return q;
}

/* announced setters not all called: the WR is malformed */
static void end_conf(struct dv_qp *q)
{
	if (q->wqe && q->setters != q->num_setters)
		fail(q, EINVAL);
	q->wqe = NULL;
}

static void wr_mkey_configure(struct mlx5dv_qp_ex *m, struct mlx5dv_mkey *mkey,
			      uint8_t num_setters, struct mlx5dv_mkey_conf_attr *attr)
{
	struct dv_qp *q = dv_of(m);
	end_conf(q);
	if (!(q->send_ops & MLX5DV_QP_EX_WITH_MKEY_CONFIGURE) || !mkey || !attr)
		return fail(q, EINVAL);
	if (!(q->qpx->wr_flags & IBV_SEND_INLINE))	/* as mlx5: a UMR WQE is inline */
		return fail(q, EOPNOTSUPP);
	if ((attr->conf_flags & ~MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR) || attr->comp_mask)
		return fail(q, EOPNOTSUPP);
	struct dv_mkey *k = (struct dv_mkey *)mkey;
	q->wqe = sv_dv_wr_driver(q->qpx, k->handle, &q->room);
	if (!q->wqe)
		return;
	q->mkey = k;
	q->num_setters = num_setters;
	q->setters = 0;
	q->set = 0;
	memset(&q->conf, 0, sizeof(q->conf));
	memset(q->dom, 0, sizeof(q->dom));
	q->conf.repeat = 1;
	if (attr->conf_flags & MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR)
		q->conf.flags |= SV_MKEY_CONF_SIG;	/* no domain: none */
	encode(q);
}

static void wr_set_mkey_access_flags(struct mlx5dv_qp_ex *m, uint32_t access)
{
	struct dv_qp *q = setter(m, SET_ACCESS);
	uint32_t ok = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		      IBV_ACCESS_REMOTE_ATOMIC;
	if (!q)
		return;
	if (access & ~ok)
		return fail(q, EINVAL);
	q->conf.flags |= SV_MKEY_CONF_ACCESS;
	q->conf.access = access;
	encode(q);
}

/* n entries (addr, lkey, count, skip), repeated `repeat` times */
static void set_layout(struct mlx5dv_qp_ex *m, uint32_t repeat, uint16_t n, uint32_t most,
		       const struct ibv_sge *sge, const struct mlx5dv_mr_interleaved *il)
{
	struct dv_qp *q = setter(m, SET_LAYOUT);
	if (!q)
		return;
	size_t need = sizeof(q->conf) + n * sizeof(struct sv_mkey_entry) + sizeof(q->dom);
	if (n > most || repeat < 1 || need > q->room)
		return fail(q, EINVAL);
	struct sv_mkey_entry *e = (struct sv_mkey_entry *)((char *)(q->wqe + 1) + sizeof(q->conf));
	for (unsigned i = 0; i < n; i++)
		e[i] = sge ? (struct sv_mkey_entry){sge[i].addr, sge[i].lkey, sge[i].length, 0, 0}
			   : (struct sv_mkey_entry){il[i].addr, il[i].lkey, il[i].bytes_count,
						    il[i].bytes_skip, 0};
	q->conf.flags |= SV_MKEY_CONF_LAYOUT;
	q->conf.repeat = repeat;
	q->conf.nentries = n;
	encode(q);
}

static void wr_set_mkey_layout_list(struct mlx5dv_qp_ex *m, uint16_t n, const struct ibv_sge *sge)
{
	struct dv_qp *q = dv_of(m);
	set_layout(m, 1, n, q->wqe ? q->mkey->max_entries : 0, sge, NULL);
}

/* as mlx5: one of the mkey's entries holds the repeat header */
static void wr_set_mkey_layout_interleaved(struct mlx5dv_qp_ex *m, uint32_t repeat, uint16_t n,
					   const struct mlx5dv_mr_interleaved *data)
{
	struct dv_qp *q = dv_of(m);
	set_layout(m, repeat, n, q->wqe ? q->mkey->max_entries - 1u : 0, NULL, data);
}

/* An mlx5dv signature domain as the device's MkeySigDomain; 0 or EINVAL. */
static int domain(const struct mlx5dv_sig_block_domain *d, struct sv_mkey_sig_domain *out)
{
	memset(out, 0, sizeof(*out));
	if (!d)
		return 0;
	if (d->comp_mask || (d->block_size != MLX5DV_BLOCK_SIZE_512 &&
			     d->block_size != MLX5DV_BLOCK_SIZE_4096))
		return EINVAL;
	out->present = 1;
	out->block_size = d->block_size == MLX5DV_BLOCK_SIZE_512 ? 512 : 4096;
	if (d->sig_type == MLX5DV_SIG_TYPE_CRC) {
		const struct mlx5dv_sig_crc *crc = d->sig.crc;
		if (!crc || crc->type > MLX5DV_SIG_CRC_TYPE_CRC32C ||
		    (crc->seed != 0 && crc->seed != 0xFFFFFFFF))
			return EINVAL;
		out->kind = crc->type == MLX5DV_SIG_CRC_TYPE_CRC32 ? 0 : 1;
		out->seed = (uint32_t)crc->seed;
		return 0;
	}
	const struct mlx5dv_sig_t10dif *dif = d->sig.dif;
	if (d->sig_type != MLX5DV_SIG_TYPE_T10DIF || !dif || dif->bg_type != MLX5DV_SIG_T10DIF_CRC ||
	    (dif->bg != 0 && dif->bg != 0xFFFF) || (dif->flags & ~7u))
		return EINVAL;
	out->kind = 2;
	out->seed = dif->bg;
	out->app_tag = dif->app_tag;
	out->ref_tag = dif->ref_tag;
	out->ref_remap = !!(dif->flags & MLX5DV_SIG_T10DIF_FLAG_REF_REMAP);
	out->escape = (dif->flags & MLX5DV_SIG_T10DIF_FLAG_APP_REF_ESCAPE) ? 2
		      : (dif->flags & MLX5DV_SIG_T10DIF_FLAG_APP_ESCAPE) ? 1 : 0;
	return 0;
}

static void wr_set_mkey_sig_block(struct mlx5dv_qp_ex *m, const struct mlx5dv_sig_block_attr *a)
{
	struct dv_qp *q = setter(m, SET_SIG);
	if (!q)
		return;
	if (!q->mkey->sig || !a || (!a->mem && !a->wire) || a->comp_mask ||
	    (a->flags & ~MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK) ||
	    domain(a->mem, &q->dom[0]) || domain(a->wire, &q->dom[1]))
		return fail(q, EINVAL);
	q->conf.flags |= SV_MKEY_CONF_SIG;
	q->conf.check_mask = a->check_mask;
	if (a->flags & MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK)
		q->conf.copy_mask = a->copy_mask;
	else
		q->conf.flags |= SV_MKEY_CONF_AUTO_COPY;	/* the device works it out */
	encode(q);
}

/* the rest of mlx5dv_qp_ex: not offered (the batch fails with EOPNOTSUPP) */
static void no_dc_addr(struct mlx5dv_qp_ex *m, struct ibv_ah *ah, uint32_t dctn, uint64_t key)
{
	(void)ah, (void)dctn, (void)key;
	fail(dv_of(m), EOPNOTSUPP);
}

static void no_dc_addr_stream(struct mlx5dv_qp_ex *m, struct ibv_ah *ah, uint32_t dctn,
			      uint64_t key, uint16_t stream)
{
	(void)ah, (void)dctn, (void)key, (void)stream;
	fail(dv_of(m), EOPNOTSUPP);
}

static void no_mr_interleaved(struct mlx5dv_qp_ex *m, struct mlx5dv_mkey *mkey, uint32_t access,
			      uint32_t repeat, uint16_t n, struct mlx5dv_mr_interleaved *data)
{
	(void)mkey, (void)access, (void)repeat, (void)n, (void)data;
	fail(dv_of(m), EOPNOTSUPP);
}

static void no_mr_list(struct mlx5dv_qp_ex *m, struct mlx5dv_mkey *mkey, uint32_t access,
		       uint16_t n, struct ibv_sge *sge)
{
	(void)mkey, (void)access, (void)n, (void)sge;
	fail(dv_of(m), EOPNOTSUPP);
}

static void no_raw_wqe(struct mlx5dv_qp_ex *m, const void *wqe)
{
	(void)wqe;
	fail(dv_of(m), EOPNOTSUPP);
}

static void no_memcpy(struct mlx5dv_qp_ex *m, uint32_t dlkey, uint64_t daddr, uint32_t slkey,
		      uint64_t saddr, size_t len)
{
	(void)dlkey, (void)daddr, (void)slkey, (void)saddr, (void)len;
	fail(dv_of(m), EOPNOTSUPP);
}

static void no_crypto(struct mlx5dv_qp_ex *m, const struct mlx5dv_crypto_attr *attr)
{
	(void)attr;
	fail(dv_of(m), EOPNOTSUPP);
}

/* libibverbs' wr_complete and wr_abort, ending an open configuration first */
static int wr_complete(struct ibv_qp_ex *x)
{
	struct dv_qp *q = sv_dv_qp(&x->qp_base);
	end_conf(q);
	return q->wr_complete(x);
}

static void wr_abort(struct ibv_qp_ex *x)
{
	struct dv_qp *q = sv_dv_qp(&x->qp_base);
	q->wqe = NULL;
	q->wr_abort(x);
}

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr,
				struct mlx5dv_qp_init_attr *mattr)
{
	uint64_t mask = mattr ? mattr->comp_mask : 0;
	uint32_t flags = (mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) ? mattr->create_flags : 0;
	uint64_t ops = (mask & MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS) ? mattr->send_ops_flags : 0;
	uint32_t known_flags = MLX5DV_QP_CREATE_SIG_PIPELINING |
			       MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;	/* never scattered */
	errno = EOPNOTSUPP;
	if (!opted_in() || !attr || attr->qp_type != IBV_QPT_RC ||
	    (mask & ~(uint64_t)(MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS |
				MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS)) ||
	    (flags & ~known_flags) || (ops & ~(uint64_t)MLX5DV_QP_EX_WITH_MKEY_CONFIGURE))
		return NULL;
	if (attr->cap.max_inline_data < CONF_INLINE)	/* reported back, as any rounding up */
		attr->cap.max_inline_data = CONF_INLINE;
	struct ibv_qp *qp = sv_dv_create_qp(context, attr, flags & MLX5DV_QP_CREATE_SIG_PIPELINING,
					    sizeof(struct dv_qp));
	if (!qp)
		return NULL;
	struct dv_qp *q = sv_dv_qp(qp);
	q->qpx = ibv_qp_to_qp_ex(qp);
	q->send_ops = ops;
	q->wr_complete = q->qpx->wr_complete;
	q->wr_abort = q->qpx->wr_abort;
	q->qpx->wr_complete = wr_complete;
	q->qpx->wr_abort = wr_abort;
	q->dv = (struct mlx5dv_qp_ex){
		.wr_set_dc_addr = no_dc_addr,
		.wr_mr_interleaved = no_mr_interleaved,
		.wr_mr_list = no_mr_list,
		.wr_mkey_configure = wr_mkey_configure,
		.wr_set_mkey_access_flags = wr_set_mkey_access_flags,
		.wr_set_mkey_layout_list = wr_set_mkey_layout_list,
		.wr_set_mkey_layout_interleaved = wr_set_mkey_layout_interleaved,
		.wr_set_mkey_sig_block = wr_set_mkey_sig_block,
		.wr_raw_wqe = no_raw_wqe,
		.wr_set_dc_addr_stream = no_dc_addr_stream,
		.wr_memcpy = no_memcpy,
		.wr_set_mkey_crypto = no_crypto,
	};
	return qp;
}

struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp)
{
	struct dv_qp *q = qp ? sv_dv_qp(&qp->qp_base) : NULL;
	if (!q)
		errno = EOPNOTSUPP;
	return q ? &q->dv : NULL;
}

struct mlx5dv_mkey *mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *attr)
{
	uint32_t known = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			 MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE;
	if (!opted_in() || (attr && (attr->create_flags & ~known))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!attr || !attr->pd || !(attr->create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT)) {
		errno = EINVAL;
		return NULL;
	}
	struct dv_mkey *k = calloc(1, sizeof(*k));
	if (!k) {
		errno = ENOMEM;
		return NULL;
	}
	k->sig = attr->create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE;
	struct sv_create_mkey req = {
		.pd = attr->pd->handle,
		.flags = k->sig ? SV_MKEY_BLOCK_SIGNATURE : 0,
		.max_entries = attr->max_entries,
	};
	struct sv_mkey_reply rep;
	if (sv_dv_call(SV_OP_CREATE_MKEY, &req, sizeof(req), &rep, sizeof(rep))) {
		free(k);
		return NULL;
	}
	k->handle = rep.handle;
	k->max_entries = attr->max_entries;
	k->mkey.lkey = k->mkey.rkey = rep.key;
	return &k->mkey;
}

int mlx5dv_destroy_mkey(struct mlx5dv_mkey *mkey)
{
	if (!mkey)
		return EINVAL;
	struct dv_mkey *k = (struct dv_mkey *)mkey;
	struct sv_destroy req = {.kind = SV_KIND_MKEY, .handle = k->handle};
	int err = sv_dv_call(SV_OP_DESTROY, &req, sizeof(req), NULL, 0);
	if (!err)
		free(k);
	return err;
}

int _mlx5dv_mkey_check(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info,
		       size_t err_info_size)
{
	if (!mkey || !err_info || err_info_size < sizeof(*err_info))
		return EINVAL;
	struct sv_handle req = {.handle = ((struct dv_mkey *)mkey)->handle};
	struct sv_mkey_err rep;
	int err = sv_dv_call(SV_OP_MKEY_CHECK, &req, sizeof(req), &rep, sizeof(rep));
	if (err)
		return err;
	memset(err_info, 0, err_info_size);
	err_info->err_type = (enum mlx5dv_mkey_err_type)rep.err_type;
	err_info->err.sig.actual_value = rep.actual;
	err_info->err.sig.expected_value = rep.expected;
	err_info->err.sig.offset = rep.offset;
	return 0;
}

/* The count cancelled, or -EINVAL: only on a SIG_PIPELINING QP in SQD. */
int mlx5dv_qp_cancel_posted_send_wrs(struct mlx5dv_qp_ex *m, uint64_t wr_id)
{
	if (!m)
		return -EINVAL;
	struct sv_cancel_send req = {.qp = dv_of(m)->qpx->qp_base.handle, .wr_id = wr_id};
	struct sv_count rep;
	int err = sv_dv_call(SV_OP_CANCEL_SEND, &req, sizeof(req), &rep, sizeof(rep));
	return err ? -err : (int)rep.count;
}
