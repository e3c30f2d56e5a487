"""``softverbs link``: configure UDP devices, as ``rdma link`` configures rxe.

::

    softverbs link add sv1 --netdev eth0          # bind to an interface
    softverbs link add lo2 --addr 127.0.0.2       # or to explicit addresses
    softverbs link show [-j]
    softverbs link del sv1

The table is a JSON file (see :mod:`softverbs.config`); devices in it are
opened on demand by any process that uses them.  ``show`` prints lines in
the style of ``rdma link show``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from pathlib import Path

from softverbs.config import LinkSpec, config_path, inproc_names, load_links, save_links


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="add a UDP device bound to a netdev or addresses")
    add.add_argument("name")
    where = add.add_mutually_exclusive_group(required=True)
    where.add_argument("--netdev", help="network interface to bind to (like rxe's netdev)")
    where.add_argument("--addr", action="append", help="address to bind to (repeatable)")
    add.add_argument(
        "--mtu", type=int, default=0, help="active IB MTU in bytes (default: from the netdev MTU)"
    )
    show = sub.add_parser("show", help="list devices")
    show.add_argument("name", nargs="?")
    show.add_argument("-j", "--json", action="store_true", help="JSON output")
    delete = sub.add_parser("del", help="remove a device")
    delete.add_argument("name")


def _error(msg: str) -> int:
    print(f"softverbs link: {msg}", file=sys.stderr)
    return 1


def _add(args: argparse.Namespace) -> int:
    links = load_links()
    if args.name in inproc_names() or any(link.name == args.name for link in links):
        return _error(f"device {args.name!r} already exists")
    if args.netdev and not Path(f"/sys/class/net/{args.netdev}").exists():
        return _error(f"netdev {args.netdev!r} does not exist")
    for addr in args.addr or []:
        try:
            ipaddress.ip_address(addr.split("%")[0])
        except ValueError:
            return _error(f"{addr!r} is not an IP address")
    if args.mtu and args.mtu not in (256, 512, 1024, 2048, 4096):
        return _error(f"--mtu must be 256, 512, 1024, 2048 or 4096, not {args.mtu}")
    links.append(LinkSpec(args.name, "udp", args.netdev or "", list(args.addr or []), args.mtu))
    save_links(links)
    return 0


def _rows(name: str | None) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for n in inproc_names():
        rows.append({"ifname": n, "port": 1, "state": "ACTIVE", "physical_state": "LINK_UP",
                     "netdev": "", "type": "inproc"})  # fmt: skip
    for link in load_links():
        rows.append({"ifname": link.name, "port": 1, "state": "ACTIVE",
                     "physical_state": "LINK_UP", "netdev": link.netdev,
                     "addrs": link.addrs, "type": "udp"})  # fmt: skip
    return [r for r in rows if name is None or r["ifname"] == name]


def _show(args: argparse.Namespace) -> int:
    rows = _rows(args.name)
    if args.name and not rows:
        return _error(f"no device {args.name!r}")
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "type"} for r in rows]))
        return 0
    for r in rows:
        where = (
            f"netdev {r['netdev']}"
            if r["netdev"]
            else (
                "addrs " + ",".join(r.get("addrs", [])) if r.get("addrs") else "in-process"  # type: ignore[arg-type]
            )
        )
        print(f"link {r['ifname']}/1 state ACTIVE physical_state LINK_UP {where}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    links = load_links()
    kept = [link for link in links if link.name != args.name]
    if len(kept) == len(links):
        if args.name in inproc_names():
            return _error(f"{args.name!r} is an in-process device (SOFTVERBS_INPROC_DEVICES)")
        return _error(f"no device {args.name!r} in {config_path()}")
    save_links(kept)
    return 0


def run(args: argparse.Namespace) -> int:
    action = {"add": _add, "show": _show, "del": _delete}[args.action]
    return action(args)
