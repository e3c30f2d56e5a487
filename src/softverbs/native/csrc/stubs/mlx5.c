/* libmlx5.so.1 for programs linked against it (perftest, UCX, SPDK): softverbs is
 * not an mlx5 device, so the mlx5dv entry points here say so -- NULL with
 * errno, or EOPNOTSUPP -- and the program takes its generic path.  Only the
 * symbols such programs link are here, with their symbol versions.  The
 * signature offload subset (mlx5dv_is_supported, mlx5dv_create_qp, mkeys,
 * mlx5dv_mkey_check, mlx5dv_qp_cancel_posted_send_wrs) is in mlx5_sig.c: with
 * SOFTVERBS_MLX5=sig it works, else it too says EOPNOTSUPP. */
#include <errno.h>
#include <stddef.h>

#define STUB_NULL(name) \
	void *name(void); \
	void *name(void) { errno = EOPNOTSUPP; return NULL; }
#define STUB_INT(name) \
	int name(void); \
	int name(void) { return EOPNOTSUPP; }
#define STUB_MINUS1(name) \
	long name(void); \
	long name(void) { errno = EOPNOTSUPP; return -1; }

STUB_NULL(mlx5dv_open_device)
STUB_INT(mlx5dv_devx_general_cmd)
STUB_INT(mlx5dv_crypto_login)
STUB_NULL(mlx5dv_dek_create)
STUB_INT(mlx5dv_dek_destroy)
STUB_INT(mlx5dv_query_device)
STUB_NULL(mlx5dv_create_cq)
STUB_INT(mlx5dv_init_obj)
STUB_NULL(mlx5dv_devx_alloc_uar)
STUB_INT(mlx5dv_devx_free_uar)
STUB_NULL(mlx5dv_devx_obj_create)
STUB_INT(mlx5dv_devx_obj_destroy)
STUB_INT(mlx5dv_devx_obj_modify)
STUB_INT(mlx5dv_devx_obj_query)
STUB_NULL(mlx5dv_devx_umem_reg)
STUB_INT(mlx5dv_devx_umem_dereg)
STUB_INT(mlx5dv_devx_qp_modify)
STUB_INT(mlx5dv_devx_qp_query)
STUB_NULL(mlx5dv_devx_create_event_channel)
STUB_INT(mlx5dv_devx_destroy_event_channel)
STUB_MINUS1(mlx5dv_devx_get_event)
STUB_INT(mlx5dv_devx_subscribe_devx_event)
