/* libibverbs.so.1's table of the rdma-core 44 symbols softverbs exports without
 * implementing them (unsupported.h says how each macro answers).  Two groups:
 *
 * IBVERBS_PRIVATE_34 -- the provider ABI: what a vendor driver (Debian's real
 * libmlx4.so.1, libmana.so.1 ...) calls to talk to the kernel's uverbs.  A
 * program that links such a library loads it with softverbs' libibverbs: the
 * driver's constructor registers itself (verbs_register_driver_34, a no-op
 * here) and is never asked to open a device, because softverbs lists only its
 * own devices.  Every kernel command (ibv_cmd_*, execute_ioctl) answers
 * EOPNOTSUPP, rdma-core's "0 or an errno value" convention for them, since
 * softverbs has no uverbs to send it to.
 *
 * IBVERBS_1.0 (and ibv_register_driver@IBVERBS_1.1) -- rdma-core's compatibility
 * entry points for binaries linked before 2006, with the old struct layouts;
 * current links bind to the IBVERBS_1.1 versions, which are implemented.  They
 * answer ENOSYS: the function, not the device, is missing.
 */
#include "unsupported.h"

/* --- IBVERBS_PRIVATE_34: the provider ABI ------------------------------------------------ */

SV_UNSUP_ERRNO(ibv_cmd_advise_mr, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_alloc_dm, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_alloc_mw, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_alloc_pd, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_attach_mcast, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_close_xrcd, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_ah, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_counters, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_cq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_cq_ex, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_flow, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_flow_action_esp, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_qp, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_qp_ex2, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_qp_ex, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_rwq_ind_table, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_srq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_srq_ex, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_create_wq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_dealloc_mw, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_dealloc_pd, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_dereg_mr, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_ah, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_counters, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_cq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_flow, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_flow_action, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_qp, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_rwq_ind_table, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_srq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_destroy_wq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_detach_mcast, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_free_dm, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_get_context, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_modify_cq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_modify_flow_action_esp, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_modify_qp, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_modify_qp_ex, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_modify_srq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_modify_wq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_open_qp, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_open_xrcd, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_poll_cq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_post_recv, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_post_send, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_post_srq_recv, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_query_context, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_query_device_any, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_query_mr, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_query_port, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_query_qp, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_query_srq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_read_counters, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_reg_dm_mr, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_reg_dmabuf_mr, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_reg_mr, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_req_notify_cq, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_rereg_mr, EOPNOTSUPP)
SV_UNSUP_ERRNO(ibv_cmd_resize_cq, EOPNOTSUPP)
SV_UNSUP_ERRNO(execute_ioctl, EOPNOTSUPP)
SV_UNSUP_ZERO(__ioctl_final_num_attrs)
SV_UNSUP_NULL(_verbs_init_and_alloc_context, EOPNOTSUPP)
SV_UNSUP_NULL(verbs_open_device, EOPNOTSUPP)
SV_UNSUP_MINUS1(ibv_read_ibdev_sysfs_file, EOPNOTSUPP)
/* a variable, not a function: drivers read it to decide whether a destroy may
 * succeed after the device went away; false, as in rdma-core by default */
extern _Bool verbs_allow_disassociate_destroy;
_Bool verbs_allow_disassociate_destroy;
SV_UNSUP_VOID(verbs_register_driver_34)
SV_UNSUP_VOID(verbs_set_ops)
SV_UNSUP_VOID(verbs_init_cq)
SV_UNSUP_VOID(verbs_uninit_context)
SV_UNSUP_VOID(__verbs_log)

/* --- IBVERBS_1.0: the compatibility ABI (non-default versions) ------------------------- */

SV_UNSUP_VOID(sv_ibv_ack_async_event_1_0) SV_SYMVER(sv_ibv_ack_async_event_1_0, "ibv_ack_async_event@IBVERBS_1.0")
SV_UNSUP_VOID(sv_ibv_ack_cq_events_1_0) SV_SYMVER(sv_ibv_ack_cq_events_1_0, "ibv_ack_cq_events@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_alloc_pd_1_0, ENOSYS) SV_SYMVER(sv_ibv_alloc_pd_1_0, "ibv_alloc_pd@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_attach_mcast_1_0, ENOSYS) SV_SYMVER(sv_ibv_attach_mcast_1_0, "ibv_attach_mcast@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_close_device_1_0, ENOSYS) SV_SYMVER(sv_ibv_close_device_1_0, "ibv_close_device@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_create_ah_1_0, ENOSYS) SV_SYMVER(sv_ibv_create_ah_1_0, "ibv_create_ah@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_create_cq_1_0, ENOSYS) SV_SYMVER(sv_ibv_create_cq_1_0, "ibv_create_cq@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_create_qp_1_0, ENOSYS) SV_SYMVER(sv_ibv_create_qp_1_0, "ibv_create_qp@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_create_srq_1_0, ENOSYS) SV_SYMVER(sv_ibv_create_srq_1_0, "ibv_create_srq@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_dealloc_pd_1_0, ENOSYS) SV_SYMVER(sv_ibv_dealloc_pd_1_0, "ibv_dealloc_pd@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_dereg_mr_1_0, ENOSYS) SV_SYMVER(sv_ibv_dereg_mr_1_0, "ibv_dereg_mr@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_destroy_ah_1_0, ENOSYS) SV_SYMVER(sv_ibv_destroy_ah_1_0, "ibv_destroy_ah@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_destroy_cq_1_0, ENOSYS) SV_SYMVER(sv_ibv_destroy_cq_1_0, "ibv_destroy_cq@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_destroy_qp_1_0, ENOSYS) SV_SYMVER(sv_ibv_destroy_qp_1_0, "ibv_destroy_qp@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_destroy_srq_1_0, ENOSYS) SV_SYMVER(sv_ibv_destroy_srq_1_0, "ibv_destroy_srq@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_detach_mcast_1_0, ENOSYS) SV_SYMVER(sv_ibv_detach_mcast_1_0, "ibv_detach_mcast@IBVERBS_1.0")
SV_UNSUP_VOID(sv_ibv_free_device_list_1_0) SV_SYMVER(sv_ibv_free_device_list_1_0, "ibv_free_device_list@IBVERBS_1.0")
SV_UNSUP_MINUS1(sv_ibv_get_async_event_1_0, ENOSYS) SV_SYMVER(sv_ibv_get_async_event_1_0, "ibv_get_async_event@IBVERBS_1.0")
SV_UNSUP_MINUS1(sv_ibv_get_cq_event_1_0, ENOSYS) SV_SYMVER(sv_ibv_get_cq_event_1_0, "ibv_get_cq_event@IBVERBS_1.0")
SV_UNSUP_ZERO(sv_ibv_get_device_guid_1_0) SV_SYMVER(sv_ibv_get_device_guid_1_0, "ibv_get_device_guid@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_get_device_list_1_0, ENOSYS) SV_SYMVER(sv_ibv_get_device_list_1_0, "ibv_get_device_list@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_get_device_name_1_0, ENOSYS) SV_SYMVER(sv_ibv_get_device_name_1_0, "ibv_get_device_name@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_modify_qp_1_0, ENOSYS) SV_SYMVER(sv_ibv_modify_qp_1_0, "ibv_modify_qp@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_modify_srq_1_0, ENOSYS) SV_SYMVER(sv_ibv_modify_srq_1_0, "ibv_modify_srq@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_open_device_1_0, ENOSYS) SV_SYMVER(sv_ibv_open_device_1_0, "ibv_open_device@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_query_device_1_0, ENOSYS) SV_SYMVER(sv_ibv_query_device_1_0, "ibv_query_device@IBVERBS_1.0")
SV_UNSUP_MINUS1(sv_ibv_query_gid_1_0, ENOSYS) SV_SYMVER(sv_ibv_query_gid_1_0, "ibv_query_gid@IBVERBS_1.0")
SV_UNSUP_MINUS1(sv_ibv_query_pkey_1_0, ENOSYS) SV_SYMVER(sv_ibv_query_pkey_1_0, "ibv_query_pkey@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_query_port_1_0, ENOSYS) SV_SYMVER(sv_ibv_query_port_1_0, "ibv_query_port@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_query_qp_1_0, ENOSYS) SV_SYMVER(sv_ibv_query_qp_1_0, "ibv_query_qp@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_query_srq_1_0, ENOSYS) SV_SYMVER(sv_ibv_query_srq_1_0, "ibv_query_srq@IBVERBS_1.0")
SV_UNSUP_NULL(sv_ibv_reg_mr_1_0, ENOSYS) SV_SYMVER(sv_ibv_reg_mr_1_0, "ibv_reg_mr@IBVERBS_1.0")
SV_UNSUP_ERRNO(sv_ibv_resize_cq_1_0, ENOSYS) SV_SYMVER(sv_ibv_resize_cq_1_0, "ibv_resize_cq@IBVERBS_1.0")
SV_UNSUP_VOID(sv_ibv_register_driver_1_1) SV_SYMVER(sv_ibv_register_driver_1_1, "ibv_register_driver@IBVERBS_1.1")
