/* libmlx5.so.1 for programs linked against it (perftest): softverbs is not an
 * mlx5 device, so every mlx5dv entry point says so -- NULL with errno, or
 * EOPNOTSUPP -- and the program takes its generic path.  Only the symbols such
 * programs link are here, with their symbol versions. */
#include <errno.h>
#include <stddef.h>

#define STUB_NULL(name) \
	void *name(void); \
	void *name(void) { errno = EOPNOTSUPP; return NULL; }
#define STUB_INT(name) \
	int name(void); \
	int name(void) { return EOPNOTSUPP; }

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
