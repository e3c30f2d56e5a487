/* libmlx5.so.1 for programs linked against it (perftest): softverbs is not an
 * mlx5 device, so every mlx5dv entry point says so -- NULL with errno, or
 * EOPNOTSUPP -- and the program takes its generic path (mlx5dv_is_supported
 * is false: UCX then uses rc_verbs/ud_verbs).  Only the symbols such programs
 * link (perftest, UCX's libuct_ib) are here, with their symbol versions. */
#include <errno.h>
#include <stddef.h>

#define STUB_NULL(name) \
	void *name(void); \
	void *name(void) { errno = EOPNOTSUPP; return NULL; }
#define STUB_INT(name) \
	int name(void); \
	int name(void) { return EOPNOTSUPP; }
#define STUB_FALSE(name) \
	int name(void); \
	int name(void) { return 0; }
#define STUB_MINUS1(name) \
	long name(void); \
	long name(void) { errno = EOPNOTSUPP; return -1; }

STUB_NULL(mlx5dv_create_qp)
STUB_NULL(mlx5dv_open_device)
STUB_INT(mlx5dv_devx_general_cmd)
STUB_NULL(mlx5dv_create_mkey)
STUB_INT(mlx5dv_destroy_mkey)
STUB_NULL(mlx5dv_qp_ex_from_ibv_qp_ex)
STUB_INT(mlx5dv_crypto_login)
STUB_NULL(mlx5dv_dek_create)
STUB_INT(mlx5dv_dek_destroy)
STUB_INT(mlx5dv_query_device)
STUB_NULL(mlx5dv_create_cq)
STUB_INT(mlx5dv_init_obj)
STUB_FALSE(mlx5dv_is_supported)
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
