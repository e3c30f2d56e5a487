/* libefa.so.1 for programs linked against it (perftest, libfabric, pyverbs):
 * softverbs is not an EFA device, and every efadv entry point says so, as
 * rdma-core's libefa does for a device of another vendor -- NULL with errno
 * EOPNOTSUPP, or EOPNOTSUPP returned.  The table of every rdma-core 44 libefa
 * symbol, one line each (../unsupported.h). */
#include "../unsupported.h"

SV_UNSUP_NULL(efadv_cq_from_ibv_cq_ex, EOPNOTSUPP)
SV_UNSUP_NULL(efadv_create_cq, EOPNOTSUPP)
SV_UNSUP_NULL(efadv_create_driver_qp, EOPNOTSUPP)
SV_UNSUP_NULL(efadv_create_qp_ex, EOPNOTSUPP)
SV_UNSUP_ERRNO(efadv_query_ah, EOPNOTSUPP)
SV_UNSUP_ERRNO(efadv_query_device, EOPNOTSUPP)
