"""EFA direct-verbs enums, with the values of rdma-core's ``efadv.h``.

softverbs is not an EFA device and implements none of EFA's direct verbs
(see :mod:`softverbs.compat.vendor_dv`). These are the names pyverbs'
``pyverbs.providers.efa.efa_enums`` exposes, with the ABI values of the
C header, so that programs which merely spell them -- rdma-core's tests import
them at module level -- load. Generated from the header; do not edit by hand.
"""



EFADV_DEVICE_ATTR_CAPS_RDMA_READ = 1
EFADV_DEVICE_ATTR_CAPS_RNR_RETRY = 2
EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID = 4
EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE = 8
EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV = 16
EFADV_QP_DRIVER_TYPE_SRD = 0
EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV = 1
EFADV_WC_EX_WITH_SGID = 1
EFADV_WC_EX_WITH_IS_UNSOLICITED = 2
EFADV_MR_ATTR_VALIDITY_RECV_IC_ID = 1
EFADV_MR_ATTR_VALIDITY_RDMA_READ_IC_ID = 2
EFADV_MR_ATTR_VALIDITY_RDMA_RECV_IC_ID = 4
