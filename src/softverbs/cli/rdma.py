"""``rdma`` under ``softverbs exec``: iproute2's ``rdma link`` / ``rdma dev`` for softverbs devices.

Programs find an RDMA device's network interface by asking iproute2:
rdma-core's tests run ``rdma link show -j`` and read each row's ``netdev``.
Under ``softverbs exec`` the devices are softverbs', not the kernel's, so
``exec`` puts a small ``rdma`` script first on ``PATH`` (``compat/bin``) that
runs this module.  It answers from softverbs' own state, in iproute2's
shapes (text, and JSON with ``-j``):

* ``rdma link [show] [DEV[/PORT]]`` -- one row per port: ``ifindex`` (the
  device index), ``ifname``, ``port``, ``state`` and ``physical_state`` (ACTIVE /
  LINK_UP, or DOWN / DISABLED for a UDP device whose netdev is down or gone
  or whose address this host no longer has: :func:`port_up`), and for a UDP device its
  ``netdev`` and ``netdev_index``: the interface it is bound to (``softverbs
  link add --netdev``), or the one that carries its address.  In-process
  devices have no netdev, as an InfiniBand port has none, so the key is
  absent.
* ``rdma dev [show] [DEV]`` -- node type and GUIDs.

Devices are not opened to answer (opening a UDP device would bind its
address), and nothing else is emulated: any other object or command fails
with a message and exit status 1, as an unknown command does in iproute2.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

USAGE = "Usage: rdma [ -j ] [ -p ] { link | dev } [ show ] [ DEV[/PORT] ]"


def _netdev(spec: Any) -> str:
    if spec.kind != "udp":
        return ""
    if spec.netdev:
        return str(spec.netdev)
    if spec.addrs:
        from softverbs.fabric.udp import netdev_of_address

        return netdev_of_address(spec.addrs[0].split("%")[0])[0]
    return ""


@dataclass
class _LinkSpec:
    name: str
    kind: str
    netdev: str = ""
    addrs: tuple[str, ...] = ()


def _device_specs() -> Sequence[Any]:
    from softverbs.verbs import registry, world

    specs = world.active().specs()
    if any(getattr(s, "kind", "") == "service" for s in specs):
        # Devices served by softverbsd: their netdevs are in the link table it serves.
        table = {s.name: s for s in registry.Registry().specs()}
        specs = [table.get(s.name, s) for s in specs]
    return specs


def configured_specs() -> list[Any]:
    """The devices this process would open, in ``get_device_list`` order, read from
    the configuration alone (``softverbs link show`` uses the same rows)."""
    from softverbs import config

    specs: list[Any] = [_LinkSpec(name, "inproc") for name in config.inproc_names()]
    specs += [_LinkSpec(link.name, "udp", link.netdev, tuple(link.addrs))
              for link in config.load_links()]  # fmt: skip
    return specs


def _link_specs() -> Sequence[Any]:
    """The devices, in ``get_device_list`` order, read from the link table itself:
    ``rdma link`` runs once per test setUp, so it must not load the whole device."""
    from softverbs import config

    if not config.service_disabled():
        return _device_specs()
    return configured_specs()


def port_up(spec: Any, netdev: str) -> bool:
    """Whether a device's port is up, as rxe's follows its netdev: an in-process
    port always is; a UDP device's is down when its netdev is gone or down, or
    when one of its addresses is no longer this host's."""
    if spec.kind != "udp":
        return True
    if spec.netdev:
        try:
            state = Path(f"/sys/class/net/{spec.netdev}/operstate").read_text().strip()
        except OSError:
            return False
        return state not in ("down", "lowerlayerdown", "notpresent")
    from softverbs.fabric.udp import address_error

    return bool(netdev) and not any(address_error(a) for a in spec.addrs)


def link_rows(specs: Sequence[Any]) -> list[dict[str, Any]]:
    """``rdma link show -j`` rows for ``specs`` (softverbs device specs)."""
    rows: list[dict[str, Any]] = []
    for index, spec in enumerate(specs):
        netdev = _netdev(spec)
        up = port_up(spec, netdev)
        row: dict[str, Any] = {"ifindex": index, "ifname": spec.name, "port": 1,
                               "state": "ACTIVE" if up else "DOWN",
                               "physical_state": "LINK_UP" if up else "DISABLED"}  # fmt: skip
        if netdev:
            row["netdev"] = netdev
            with contextlib.suppress(OSError):
                row["netdev_index"] = socket.if_nametoindex(netdev)
        rows.append(row)
    return rows


def _guid(guid: int) -> str:
    h = f"{guid:016x}"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def dev_rows(specs: Sequence[Any]) -> list[dict[str, Any]]:
    """``rdma dev show -j`` rows."""
    return [
        {"ifindex": i, "ifname": s.name, "node_type": "ca", "fw": "0.0.0",
         "node_guid": _guid(s.guid), "sys_image_guid": _guid(s.guid)}
        for i, s in enumerate(specs)
    ]  # fmt: skip


def link_text(row: dict[str, Any]) -> str:
    text = (f"link {row['ifname']}/{row['port']} state {row['state']} "
            f"physical_state {row['physical_state']}")  # fmt: skip
    if "netdev" in row:
        text += f" netdev {row['netdev']}"
    return text


def _dev_text(row: dict[str, Any]) -> str:
    return (f"{row['ifindex']}: {row['ifname']}: node_type {row['node_type']} fw {row['fw']} "
            f"node_guid {row['node_guid']} sys_image_guid {row['sys_image_guid']}")  # fmt: skip


def _select(rows: list[dict[str, Any]], target: str | None) -> list[dict[str, Any]] | None:
    if target is None:
        return rows
    name, _, port = target.partition("/")
    out = [r for r in rows if r["ifname"] == name and (not port or str(r.get("port")) == port)]
    return out or None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = pretty = False
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt in ("-j", "-json", "--json"):
            as_json = True
        elif opt in ("-p", "-pretty", "--pretty"):
            pretty = True
        elif opt in ("-d", "-details", "--details"):
            pass
        else:
            print(f'Option "{opt}" is unknown, try "rdma -help".', file=sys.stderr)
            return 1
    if not args:
        print(USAGE, file=sys.stderr)
        return 1
    obj = args.pop(0)
    # iproute2 accepts options after the object as well
    rest = [a for a in args if not a.startswith("-")]
    as_json = as_json or any(a in ("-j", "-json") for a in args)
    if rest and rest[0] in ("show", "list", "sh", "ls"):
        rest = rest[1:]
    elif rest:
        print(f"softverbs rdma: '{obj} {rest[0]}' is not provided: softverbs answers only "
              "'rdma link show' and 'rdma dev show' (devices are managed with "
              "'softverbs link')", file=sys.stderr)  # fmt: skip
        return 1
    if "link".startswith(obj) and obj:
        rows, fmt = link_rows(_link_specs()), link_text
    elif "dev".startswith(obj) and obj:
        rows, fmt = dev_rows(_device_specs()), _dev_text
    else:
        print(f'Object "{obj}" is unknown, try "rdma help".', file=sys.stderr)
        return 1
    selected = _select(rows, rest[0] if rest else None)
    if selected is None:
        print(f"Wrong device name {rest[0]}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(selected, indent=4 if pretty else None))
    else:
        for row in selected:
            print(fmt(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
