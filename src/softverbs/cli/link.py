"""``softverbs link``: configure UDP devices, as ``rdma link`` configures rxe.

::

    softverbs link add sv1 --netdev eth0          # bind to an interface
    softverbs link add lo2 --addr 127.0.0.2       # or to explicit addresses
    softverbs link show [-j] [NAME]
    softverbs link set sv1 cc dcqcn rpg_ai_rate=10 min_time_between_cnps=50
    softverbs link set sv1 cc slow_restart        # back to the default
    softverbs link del sv1

The table is a JSON file (see :mod:`softverbs.config`); devices in it are
opened on demand by any process that uses them.

``add`` checks what it is given before it writes the table, so that a typo
fails here and not later in some program's ``Context()``: the name must be
one an RDMA device can have (at most 63 bytes, no ``/``, no white space, not
taken), the netdev must exist, and each address must be one the kernel lets
this host bind (a test bind on an ephemeral port).  Then the new device is
opened where it will be served -- this network namespace's softverbsd, or
this process with ``SOFTVERBS_SERVICE=0`` -- which binds UDP port 4791 on its
addresses at once; if that fails (the port is held, the address is not
there) the table is left as it was and the reason is printed.

Each network namespace has a table of its own (:func:`softverbs.config.netns_suffix`).
A device whose netdev is gone or down, or whose address is no longer on this
host, is listed with ``state DOWN physical_state DISABLED``, as ``rdma link``
shows a port whose netdev is down; opening it fails with the reason, and
every other device keeps working.

``set NAME cc KIND [KEY=VALUE ...]`` chooses the device's congestion
control (:mod:`softverbs.engine.congestion`): ``slow_restart`` (the
default), ``none`` or ``dcqcn``, whose parameters are mlx5's ``roce_rp`` /
``roce_np`` knobs with mlx5's defaults; a value out of range is refused with
the range.  It applies to the QPs of every process that opens the device
afterwards.

``show`` prints the rows ``rdma link show`` prints under ``softverbs exec``
(:func:`softverbs.cli.rdma.link_rows`), in the same text and JSON shapes,
with each UDP device's configured addresses added (``addrs``).  A UDP device
bound by address shows the netdev that carries it; an in-process device has
no netdev, as an InfiniBand port has none.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from softverbs.cli.main import UserError
from softverbs.cli.rdma import configured_specs, link_rows, link_text
from softverbs.config import LinkSpec, config_path, inproc_names, load_links, save_links
from softverbs.engine.congestion import KINDS, check_params
from softverbs.fabric.udp import address_error

#: the longest RDMA device name (IB_DEVICE_NAME_MAX is 64 with the NUL)
MAX_NAME = 63
MTUS = (256, 512, 1024, 2048, 4096)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="add a UDP device bound to a netdev or addresses")
    add.add_argument("name", help=f"the device name (at most {MAX_NAME} bytes, no '/')")
    where = add.add_mutually_exclusive_group(required=True)
    where.add_argument("--netdev", help="network interface to bind to (like rxe's netdev)")
    where.add_argument("--addr", action="append",
                       help="an address of this host to bind to (repeatable)")  # fmt: skip
    add.add_argument(
        "--mtu", type=int, default=0, help="active IB MTU in bytes (default: from the netdev MTU)"
    )
    show = sub.add_parser("show", help="list devices")
    show.add_argument("name", nargs="?")
    show.add_argument("-j", "--json", action="store_true", help="JSON output")
    delete = sub.add_parser("del", help="remove a device")
    delete.add_argument("name")
    st = sub.add_parser("set", help="set a device's congestion control: cc KIND [KEY=VALUE ...]")
    st.add_argument("name")
    st.add_argument("what", choices=("cc",), help="what to set")
    st.add_argument("kind", help=f"one of {', '.join(KINDS)}")
    st.add_argument("params", nargs="*", metavar="KEY=VALUE",
                    help="DCQCN parameters by mlx5's names (rpg_ai_rate=5 ...)")  # fmt: skip


def name_error(name: str, taken: list[str]) -> str | None:
    """Why ``name`` cannot name a new device, or None."""
    if not name or name in (".", ".."):
        return f"{name!r} is not a device name"
    if "/" in name or any(c.isspace() for c in name) or not name.isprintable():
        return f"device name {name!r} may not contain '/', white space or control characters"
    if len(name.encode()) > MAX_NAME:
        return f"device name {name!r} is longer than {MAX_NAME} bytes"
    if name in taken:
        return f"device {name!r} already exists (see 'softverbs link show')"
    return None


def _add(args: argparse.Namespace) -> int:
    links = load_links()
    problem = name_error(args.name, inproc_names() + [link.name for link in links])
    if problem:
        raise UserError(problem)
    if args.netdev and not Path(f"/sys/class/net/{args.netdev}").exists():
        raise UserError(f"--netdev {args.netdev}: no such network interface (see 'ip link')")
    used = {a: link.name for link in links for a in link.addrs}
    for addr in args.addr or []:
        problem = address_error(addr)
        if problem:
            raise UserError(f"--addr {problem}")
        if addr in used:
            raise UserError(f"--addr {addr}: device {used[addr]!r} is already bound to it")
    if args.mtu and args.mtu not in MTUS:
        raise UserError(f"--mtu must be one of {', '.join(map(str, MTUS))}, not {args.mtu}")
    save_links([*links, LinkSpec(args.name, "udp", args.netdev or "", list(args.addr or []),
                                 args.mtu)])  # fmt: skip
    problem = open_error(args.name)
    if problem:
        save_links(links)
        raise UserError(f"cannot add device {args.name!r}: {problem}")
    return 0


def open_error(name: str) -> str | None:
    """Open device ``name`` where it is served and close it again: None if it
    opened, else why not (a UDP device binds its addresses when it opens)."""
    from softverbs.errors import PyverbsError
    from softverbs.verbs.device import Context

    try:
        Context(name=name).close()
    except PyverbsError as exc:
        return str(exc)
    return None


def rows(name: str | None = None) -> list[dict[str, Any]]:
    """``rdma link show -j`` rows, and each UDP device's configured ``addrs``."""
    specs = configured_specs()
    table = {link.name: link for link in load_links()}
    out = link_rows(specs)
    for row, spec in zip(out, specs, strict=True):
        if spec.addrs:
            row["addrs"] = list(spec.addrs)
        link = table.get(spec.name)
        if link is not None and link.cc:
            row["cc"] = link.cc
            row["cc_params"] = dict(sorted(link.cc_params.items()))
    return [r for r in out if name is None or r["ifname"] == name]


def _show(args: argparse.Namespace) -> int:
    selected = rows(args.name)
    if args.name and not selected:
        raise UserError(f"no device {args.name!r} (see 'softverbs link show')")
    if args.json:
        print(json.dumps(selected))
        return 0
    for r in selected:
        addrs = f" addrs {','.join(r['addrs'])}" if "addrs" in r else ""
        cc = ""
        if "cc" in r:
            cc = " cc " + " ".join([r["cc"]] + [f"{k}={v}" for k, v in r["cc_params"].items()])
        print(link_text(r) + addrs + cc)
    return 0


def _delete(args: argparse.Namespace) -> int:
    links = load_links()
    kept = [link for link in links if link.name != args.name]
    if len(kept) == len(links):
        if args.name in inproc_names():
            raise UserError(f"{args.name!r} is an in-process device (SOFTVERBS_INPROC_DEVICES)")
        raise UserError(f"no device {args.name!r} in {config_path()}")
    save_links(kept)
    return 0


def parse_params(items: list[str]) -> dict[str, int]:
    """``KEY=VALUE`` words as a dict; UserError for a malformed one."""
    out: dict[str, int] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UserError(f"{item!r}: parameters are KEY=VALUE (say rpg_ai_rate=5)")
        try:
            out[key] = int(value, 0)
        except ValueError:
            raise UserError(f"{key}: {value!r} is not an integer") from None
    return out


def _set(args: argparse.Namespace) -> int:
    links = load_links()
    link = next((x for x in links if x.name == args.name), None)
    if link is None:
        if args.name in inproc_names():
            raise UserError(f"{args.name!r} is an in-process device: set its congestion control "
                            "from Python (Simulation.set_cc, or the device's HCA)")  # fmt: skip
        raise UserError(f"no device {args.name!r} (see 'softverbs link show')")
    params = parse_params(args.params)
    problem = check_params(args.kind, params)
    if problem:
        raise UserError(problem)
    link.cc = args.kind
    link.cc_params = params
    save_links(links)
    return 0


def run(args: argparse.Namespace) -> int:
    action = {"add": _add, "show": _show, "del": _delete, "set": _set}[args.action]
    return action(args)
