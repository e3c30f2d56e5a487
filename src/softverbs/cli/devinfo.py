"""``softverbs devinfo``: devices and ports in ``ibv_devinfo``'s format.

::

    softverbs devinfo [-v] [-d DEV] [-i PORT] [-l]

The same output as libibverbs' ``ibv_devinfo`` (rdma-core v44, the version
Debian ships): the same field names in the same order, the same tabs, the
same value formats (``node_guid`` as ``xxxx:xxxx:xxxx:xxxx``, enums as
``NAME (value)``), so scripts and eyes used to the C tool read it unchanged.
It needs no compiler: everything comes from the pyverbs-shaped API
(``Context.query_device``, ``query_device_ex``, ``query_port``,
``query_gid``, ``query_gid_type``), exactly what a pyverbs program sees.

Each line is ``label:`` then tabs then the value; the tab count of each
label is ibv_devinfo's, kept in the tables below next to the label.  Flag
words (capabilities) are printed one per line after their field, five tabs
in, in the C tool's order.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable, Iterator
from typing import Any

from softverbs import Context, get_device_list
from softverbs.cli.main import UserError
from softverbs.enums import (
    IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
    IBV_GID_TYPE_SYSFS_ROCE_V2,
    IBV_LINK_LAYER_ETHERNET,
    IBV_QPT_RAW_PACKET,
    IBV_QPT_UD,
    IBV_TRANSPORT_IB,
)

# --- value names, as ibv_devinfo spells them ---------------------------------------------

TRANSPORTS = {0: "InfiniBand", 1: "iWARP", 2: "usNIC", 3: "usNIC UDP", 4: "unspecified"}
PORT_STATES = {1: "PORT_DOWN", 2: "PORT_INIT", 3: "PORT_ARMED", 4: "PORT_ACTIVE"}
PHYS_STATES = {1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION TRAINNING",
               5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY TEST"}  # fmt: skip
ATOMIC_CAPS = {0: "ATOMIC_NONE", 1: "ATOMIC_HCA", 2: "ATOMIC_GLOB"}
MTUS = {1: "256", 2: "512", 3: "1024", 4: "2048", 5: "4096"}
WIDTHS = {1: "1", 2: "4", 4: "8", 8: "12", 16: "2"}
SPEEDS = {1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
          32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}  # fmt: skip
VLS = {1: "1", 2: "2", 3: "4", 4: "8", 5: "15"}
LINK_LAYERS = {0: "Unspecified", 1: "InfiniBand", 2: "Ethernet"}
GID_TYPES: dict[int, str] = {
    IBV_GID_TYPE_SYSFS_IB_ROCE_V1: "RoCE v1",
    IBV_GID_TYPE_SYSFS_ROCE_V2: "RoCE v2",
}

#: device_cap_flags bits, in the order ibv_devinfo lists them
DEVICE_CAP_FLAGS = (
    (1 << 0, "RESIZE_MAX_WR"), (1 << 1, "BAD_PKEY_CNTR"), (1 << 2, "BAD_QKEY_CNTR"),
    (1 << 3, "RAW_MULTI"), (1 << 4, "AUTO_PATH_MIG"), (1 << 5, "CHANGE_PHY_PORT"),
    (1 << 6, "UD_AV_PORT_ENFORCE"), (1 << 7, "CURR_QP_STATE_MOD"), (1 << 8, "SHUTDOWN_PORT"),
    (1 << 9, "INIT_TYPE"), (1 << 10, "PORT_ACTIVE_EVENT"), (1 << 11, "SYS_IMAGE_GUID"),
    (1 << 12, "RC_RNR_NAK_GEN"), (1 << 13, "SRQ_RESIZE"), (1 << 14, "N_NOTIFY_CQ"),
    (1 << 17, "MEM_WINDOW"), (1 << 18, "UD_IP_CSUM"), (1 << 20, "XRC"),
    (1 << 21, "MEM_MGT_EXTENSIONS"), (1 << 23, "MEM_WINDOW_TYPE_2A"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"), (1 << 25, "RC_IP_CSUM"), (1 << 26, "RAW_IP_CSUM"),
    (1 << 29, "MANAGED_FLOW_STEERING"),
)  # fmt: skip
#: the upper half of device_cap_flags_ex that ibv_devinfo names
DEVICE_CAP_FLAGS_EX = ((1 << 32, "RAW_SCATTER_FCS"), (1 << 36, "PCI_WRITE_END_PADDING"))
ODP_GENERAL = ((1 << 0, "ODP_SUPPORT"), (1 << 1, "ODP_SUPPORT_IMPLICIT"))
ODP_TRANSPORT = ((1 << 0, "SUPPORT_SEND"), (1 << 1, "SUPPORT_RECV"), (1 << 2, "SUPPORT_WRITE"),
                 (1 << 3, "SUPPORT_READ"), (1 << 4, "SUPPORT_ATOMIC"),
                 (1 << 5, "SUPPORT_SRQ"))  # fmt: skip
RAW_PACKET_CAPS = ((1 << 0, "C-VLAN stripping offload"), (1 << 1, "Scatter FCS offload"),
                   (1 << 2, "IP csum offload"), (1 << 3, "Delay drop"))  # fmt: skip
QPT_CAPS = ((1 << IBV_QPT_RAW_PACKET, "SUPPORT_RAW_PACKET"), (1 << IBV_QPT_UD, "SUPPORT_UD"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-d", "--ib-dev", metavar="DEV",
                        help="use device DEV (default: every device)")  # fmt: skip
    parser.add_argument("-i", "--ib-port", type=_port, default=0, metavar="PORT",
                        help="use port PORT of the device (default: every port)")  # fmt: skip
    parser.add_argument("-l", "--list", action="store_true", help="print only the device names")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print all the attributes of the device(s)")  # fmt: skip


def _port(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1, 2, ...)")
    return value


# --- formatting ---------------------------------------------------------------------------


def field(indent: int, label: str, tabs: int, value: object) -> str:
    """One line: ``indent`` tabs, ``label:``, ``tabs`` tabs, the value."""
    return "\t" * indent + f"{label}:" + "\t" * tabs + str(value)


def named(names: dict[int, str], value: int, invalid: str) -> str:
    """``NAME (value)``, as ibv_devinfo prints an enum."""
    return f"{names.get(int(value), invalid)} ({int(value)})"


def guid_str(guid: int) -> str:
    h = f"{guid & (2**64 - 1):016x}"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def flag_lines(value: int, table: tuple[tuple[int, str], ...], unknown_mask: int | None = None,
               width: str = "") -> Iterator[str]:  # fmt: skip
    """The flag words set in ``value``, then any bits the table does not know."""
    known = 0
    for bit, name in table:
        known |= bit
        if value & bit:
            yield "\t" * 5 + name
    rest = value & ~known & (unknown_mask if unknown_mask is not None else ~0)
    if rest:
        yield "\t" * 5 + f"Unknown flags: 0x{rest:{width}X}"


def _qpt_caps(supported: int) -> Iterator[str]:
    yield "\t\tsupported_qp:"
    yield from flag_lines(supported, QPT_CAPS)


def device_lines(name: str, transport: int, ctx: Context, verbose: bool,
                 ib_port: int) -> Iterator[str]:  # fmt: skip
    """ibv_devinfo's lines for one device."""
    attr_ex: Any = ctx.query_device_ex()
    a: Any = attr_ex.orig_attr
    if ib_port and ib_port > a.phys_port_cnt:
        raise UserError(f"-i {ib_port}: invalid port requested for device {name} "
                        f"(it has {a.phys_port_cnt})")  # fmt: skip
    yield f"hca_id:\t{name}"
    yield field(1, "transport", 3, named(TRANSPORTS, transport, "invalid transport"))
    if a.fw_version:
        yield field(1, "fw_ver", 4, a.fw_version)
    yield field(1, "node_guid", 3, guid_str(a.node_guid))
    yield field(1, "sys_image_guid", 3, guid_str(a.sys_image_guid))
    yield field(1, "vendor_id", 3, f"0x{a.vendor_id:04x}")
    yield field(1, "vendor_part_id", 3, a.vendor_part_id)
    yield field(1, "hw_ver", 4, f"0x{a.hw_ver:X}")
    yield field(1, "phys_port_cnt", 3, a.phys_port_cnt)
    if verbose:
        yield from _verbose_device(ctx, attr_ex, a)
    for port in range(1, a.phys_port_cnt + 1):
        if not ib_port or port == ib_port:
            yield from port_lines(ctx, port, transport, verbose)


#: the plain verbose device fields: (label, tabs, value of the DeviceAttr)
_VERBOSE: tuple[tuple[str, int, Callable[[Any], object]], ...] = (
    ("max_mr_size", 3, lambda a: f"0x{a.max_mr_size:x}"),
    ("page_size_cap", 3, lambda a: f"0x{a.page_size_cap:x}"),
    ("max_qp", 4, lambda a: a.max_qp),
    ("max_qp_wr", 3, lambda a: a.max_qp_wr),
    ("device_cap_flags", 2, lambda a: f"0x{a.device_cap_flags:08x}"),
    ("max_sge", 3, lambda a: a.max_sge),
    ("max_sge_rd", 3, lambda a: a.max_sge_rd),
    ("max_cq", 4, lambda a: a.max_cq),
    ("max_cqe", 3, lambda a: a.max_cqe),
    ("max_mr", 4, lambda a: a.max_mr),
    ("max_pd", 4, lambda a: a.max_pd),
    ("max_qp_rd_atom", 3, lambda a: a.max_qp_rd_atom),
    ("max_ee_rd_atom", 3, lambda a: a.max_ee_rd_atom),
    ("max_res_rd_atom", 2, lambda a: a.max_res_rd_atom),
    ("max_qp_init_rd_atom", 2, lambda a: a.max_qp_init_rd_atom),
    ("max_ee_init_rd_atom", 2, lambda a: a.max_ee_init_rd_atom),
    ("atomic_cap", 3, lambda a: named(ATOMIC_CAPS, a.atomic_caps, "invalid atomic capability")),
    ("max_ee", 4, lambda a: a.max_ee),
    ("max_rdd", 3, lambda a: a.max_rdd),
    ("max_mw", 4, lambda a: a.max_mw),
    ("max_raw_ipv6_qp", 2, lambda a: a.max_raw_ipv6_qps),
    ("max_raw_ethy_qp", 2, lambda a: a.max_raw_ethy_qp),
    ("max_mcast_grp", 3, lambda a: a.max_mcast_grp),
    ("max_mcast_qp_attach", 2, lambda a: a.max_mcast_qp_attach),
    ("max_total_mcast_qp_attach", 1, lambda a: a.max_total_mcast_qp_attach),
    ("max_ah", 4, lambda a: a.max_ah),
    ("max_fmr", 3, lambda a: a.max_fmr),
    ("max_map_per_fmr", 2, lambda a: a.max_map_per_fmr),  # only with max_fmr
    ("max_srq", 3, lambda a: a.max_srq),
    ("max_srq_wr", 3, lambda a: a.max_srq_wr),  # these two only with max_srq
    ("max_srq_sge", 3, lambda a: a.max_srq_sge),
    ("max_pkeys", 3, lambda a: a.max_pkeys),
    ("local_ca_ack_delay", 2, lambda a: a.local_ca_ack_delay),
)
#: fields printed only when another field is non-zero
_ONLY_WITH = {"max_map_per_fmr": "max_fmr", "max_srq_wr": "max_srq", "max_srq_sge": "max_srq"}


def _verbose_device(ctx: Context, x: Any, a: Any) -> Iterator[str]:
    for label, tabs, value in _VERBOSE:
        if label in _ONLY_WITH and not getattr(a, _ONLY_WITH[label]):
            continue
        yield field(1, label, tabs, value(a))
        if label == "device_cap_flags":
            yield from flag_lines(a.device_cap_flags, DEVICE_CAP_FLAGS, 0xFFFFFFFF)
    odp = x.odp_caps
    yield "\tgeneral_odp_caps:"
    yield from flag_lines(odp.general_caps, ODP_GENERAL)
    for kind, caps in (("rc", odp.rc_odp_caps), ("uc", odp.uc_odp_caps),
                       ("ud", odp.ud_odp_caps), ("xrc", x.xrc_odp_caps)):  # fmt: skip
        yield f"\t{kind}_odp_caps:"
        yield from flag_lines(caps, ODP_TRANSPORT) if caps else iter(["\t" * 5 + "NO SUPPORT"])
    if x.completion_timestamp_mask:
        yield field(1, "completion timestamp_mask", 3, f"0x{x.completion_timestamp_mask:016x}")
    else:
        yield "\tcompletion_timestamp_mask not supported"
    if x.hca_core_clock:
        yield field(1, "hca_core_clock", 3, f"{x.hca_core_clock}kHZ")
    else:
        yield "\tcore clock not supported"
    if x.raw_packet_caps:
        yield "\traw packet caps:"
        yield from flag_lines(x.raw_packet_caps, RAW_PACKET_CAPS, 0)
    yield field(1, "device_cap_flags_ex", 2, f"0x{x.device_cap_flags_ex:X}")
    yield from flag_lines(x.device_cap_flags_ex & ~0xFFFFFFFF, DEVICE_CAP_FLAGS_EX)
    yield from _caps_ex(x)
    yield field(1, "num_comp_vectors", 2, ctx.num_comp_vectors)


def _caps_ex(x: Any) -> Iterator[str]:
    """TSO, RSS, WQ, packet pacing, tag matching, CQ moderation and device memory."""
    tso, rss, pp, tm, cqm = x.tso_caps, x.rss_caps, x.packet_pacing_caps, x.tm_caps, x.cq_mod_caps
    yield "\ttso_caps:"
    yield field(2, "max_tso", 3, tso.max_tso)
    if tso.max_tso:
        yield from _qpt_caps(tso.supported_qpts)
    yield "\trss_caps:"
    yield field(2, "max_rwq_indirection_tables", 3, rss.max_rwq_indirection_tables)
    yield field(2, "max_rwq_indirection_table_size", 3, rss.max_rwq_indirection_table_size)
    yield field(2, "rx_hash_function", 4, f"0x{rss.rx_hash_function:x}")
    yield field(2, "rx_hash_fields_mask", 4, f"0x{rss.rx_hash_fields_mask:X}")
    if rss.supported_qpts:
        yield from _qpt_caps(rss.supported_qpts)
    yield field(1, "max_wq_type_rq", 3, x.max_wq_type_rq)
    yield "\tpacket_pacing_caps:"
    yield field(2, "qp_rate_limit_min", 1, f"{pp.qp_rate_limit_min}kbps")
    yield field(2, "qp_rate_limit_max", 1, f"{pp.qp_rate_limit_max}kbps")
    if pp.qp_rate_limit_max:
        yield from _qpt_caps(pp.supported_qpts)
    if tm.max_num_tags:
        yield field(1, "max_rndv_hdr_size", 2, tm.max_rndv_hdr_size)
        yield field(1, "max_num_tags", 3, tm.max_num_tags)
        yield field(1, "max_ops", 3, tm.max_ops)
        yield field(1, "max_sge", 3, tm.max_sge)
        yield "\tflags:"
        if tm.flags & 1:
            yield "\t" * 5 + "IBV_TM_CAP_RC"
    else:
        yield "\ttag matching not supported"
    if cqm.max_cq_count and cqm.max_cq_period:
        yield "\n\tcq moderation caps:"
        yield field(2, "max_cq_count", 1, cqm.max_cq_count)
        yield field(2, "max_cq_period", 1, f"{cqm.max_cq_period} us\n")
    if x.max_dm_size:
        yield field(1, "maximum available device memory", 1, f"{x.max_dm_size}Bytes\n")


def port_lines(ctx: Context, port: int, transport: int, verbose: bool) -> Iterator[str]:
    p: Any = ctx.query_port(port)
    yield f"\t\tport:\t{port}"
    yield field(3, "state", 3, named(PORT_STATES, p.state, "invalid state"))
    yield field(3, "max_mtu", 2, named(MTUS, p.max_mtu, "invalid MTU"))
    yield field(3, "active_mtu", 2, named(MTUS, p.active_mtu, "invalid MTU"))
    yield field(3, "sm_lid", 3, p.sm_lid)
    yield field(3, "port_lid", 2, p.lid)
    yield field(3, "port_lmc", 2, f"0x{p.lmc:02x}")
    yield field(3, "link_layer", 2, LINK_LAYERS.get(p.link_layer, "Unknown"))
    if verbose:
        yield field(3, "max_msg_sz", 2, f"0x{p.max_msg_sz:x}")
        yield field(3, "port_cap_flags", 2, f"0x{int(p.port_cap_flags):08x}")
        yield field(3, "port_cap_flags2", 1, f"0x{p.port_cap_flags2:04x}")
        yield field(3, "max_vl_num", 2, named(VLS, p.max_vl_num, "invalid value"))
        yield field(3, "bad_pkey_cntr", 2, f"0x{p.bad_pkey_cntr:x}")
        yield field(3, "qkey_viol_cntr", 2, f"0x{p.qkey_viol_cntr:x}")
        yield field(3, "sm_sl", 3, p.sm_sl)
        yield field(3, "pkey_tbl_len", 2, p.pkey_tbl_len)
        yield field(3, "gid_tbl_len", 2, p.gid_tbl_len)
        yield field(3, "subnet_timeout", 2, p.subnet_timeout)
        yield field(3, "init_type_reply", 1, p.init_type_reply)
        width = WIDTHS.get(p.active_width, "invalid width")
        yield field(3, "active_width", 2, f"{width}X ({p.active_width})")
        yield field(3, "active_speed", 2, named(SPEEDS, p.active_speed, "invalid speed"))
        if transport == IBV_TRANSPORT_IB:
            yield field(3, "phys_state", 2, named(PHYS_STATES, p.phys_state,
                                                  "invalid physical state"))  # fmt: skip
        yield from gid_lines(ctx, port, p)
    yield ""


def gid_lines(ctx: Context, port: int, p: Any) -> Iterator[str]:
    """The port's GIDs whose interface half is not zero, as ibv_devinfo -v lists them."""
    for index in range(p.gid_tbl_len):
        raw = bytes(ctx.query_gid(port, index).raw)
        if not any(raw[8:]):
            continue
        try:
            kind = int(ctx.query_gid_type(port, index))
        except Exception:  # ibv_devinfo: a GID whose type cannot be read has no type
            kind = -1
        suffix = f", {GID_TYPES.get(kind, 'Invalid gid type')}" if (
            p.link_layer == IBV_LINK_LAYER_ETHERNET) else ""  # fmt: skip
        if kind == IBV_GID_TYPE_SYSFS_IB_ROCE_V1:
            text = ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))
        elif kind == IBV_GID_TYPE_SYSFS_ROCE_V2:
            text = socket.inet_ntop(socket.AF_INET6, raw)
        else:
            continue  # ibv_devinfo prints neither form for an unknown type
        yield f"\t\t\tGID[{index:3d}]:\t\t{text}{suffix}"


# --- the command --------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    devices = [(d.name.decode() if isinstance(d.name, bytes) else str(d.name),
                int(getattr(d, "transport_type", 0))) for d in get_device_list()]  # fmt: skip
    if args.list:
        print(f"{len(devices)} HCA{'s' if len(devices) != 1 else ''} found:")
        for name, _ in devices:
            print(f"\t{name}")
        print()
        return 0
    if args.ib_dev is not None:
        devices = [d for d in devices if d[0] == args.ib_dev]
        if not devices:
            raise UserError(f"-d {args.ib_dev}: no such device (see 'softverbs devinfo -l')")
    if not devices:
        raise UserError("no devices found (see 'softverbs link show')")
    for name, transport in devices:
        with Context(name=name) as ctx:
            for line in device_lines(name, transport, ctx, args.verbose, args.ib_port):
                print(line)
    return 0
