"""``softverbs stat``: device counters in the form of ``rdma statistic``.

::

    softverbs stat [show] [link [DEV[/PORT]]] [-j]

One line per port, as iproute2's ``rdma statistic show`` prints rxe's
``hw_counters``: ``link sv0/1 sent_pkts 0 rcvd_pkts 0 ...``; with ``-j``, a
JSON list of ``{"ifindex", "ifname", "port", COUNTER: VALUE, ...}``.  The
counters are :func:`softverbs.counters` of the device, named as rxe names
them where rxe has the counter.

Whose counters.  A device served by the device service (``SOFTVERBS_SERVICE``)
is one device for every process, and ``stat`` shows its counters as they
stand.  An in-process device belongs to the process that opened it, so from
the command line it always shows a fresh device's zeros; a program reads its
own with ``softverbs.counters(ctx)``.  A UDP device is opened to be read,
which binds its address: it fails while another process holds the device.

Per-QP counters (``rdma statistic qp``) are not available: the engine counts
per device.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from softverbs import Context, counters, get_device_list
from softverbs.cli.main import UserError

PORT = 1  #: every softverbs device has one port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Show device and port counters, like 'rdma statistic show'. Per-QP counters "
        "('qp') are not available yet: the engine counts per device. An in-process device "
        "is the calling process's own, so from the command line it shows zeros; a device "
        "served by softverbsd shows the counters every process shares."
    )
    parser.add_argument("words", nargs="*", metavar="[show] [link [DEV[/PORT]]]",
                        help="what to show, in rdma statistic's words (default: every link)")
    parser.add_argument("-j", "--json", action="store_true", help="JSON output")


def _target(words: list[str]) -> str | None:
    """The DEV[/PORT] asked for, or None for every link."""
    rest = list(words)
    if rest and rest[0] in ("show", "list"):
        rest.pop(0)
    if rest and rest[0] == "qp":
        raise UserError("per-QP counters ('stat qp') are not available: the engine counts "
                        "per device; see 'softverbs stat link'")  # fmt: skip
    if rest and rest[0] == "link":
        rest.pop(0)
    if len(rest) > 1 or (rest and rest[0] in ("show", "list", "link", "mode", "set")):
        raise UserError(f"{' '.join(words)}: expected [show] [link [DEV[/PORT]]]")
    return rest[0] if rest else None


def rows(target: str | None) -> list[dict[str, Any]]:
    """One row per port: ifindex, ifname, port, then the counters."""
    names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name)
             for d in get_device_list()]  # fmt: skip
    dev, _, port = (target or "").partition("/")
    if port and port != str(PORT):
        raise UserError(f"{target}: {dev} has only port {PORT}")
    if dev and dev not in names:
        raise UserError(f"{dev}: no such device (softverbs devices: {', '.join(names)})")
    out = []
    for index, name in enumerate(names):
        if dev and name != dev:
            continue
        with Context(name=name) as ctx:
            values = counters(ctx)
        out.append({"ifindex": index, "ifname": name, "port": PORT, **values})
    return out


def text(row: dict[str, Any]) -> str:
    pairs = " ".join(f"{k} {v}" for k, v in row.items() if k not in ("ifindex", "ifname", "port"))
    return f"link {row['ifname']}/{row['port']} {pairs}"


def run(args: argparse.Namespace) -> int:
    selected = rows(_target(args.words))
    if args.json:
        print(json.dumps(selected))
    else:
        for row in selected:
            print(text(row))
    return 0
