"""``softverbs stat``: device counters in the form of ``rdma statistic``.

::

    softverbs stat [show] [link [DEV[/PORT]]] [-j]
    softverbs stat qp [show] [link DEV[/PORT]] [cntn N | lqpn N | pid N | qp-type T] [-j] [-p]

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

Per-QP counters (``rdma statistic qp show``).  Every QP of the host device
counts for itself -- as if rdma's automatic binding gave each QP a counter of
its own, numbered as the QP (``cntn`` is the ``lqpn``) -- and ``stat qp``
shows them for every process's QPs, read from softverbsd's STATUS as
``softverbs res`` reads its objects (never starting the service)::

    link sv0/1 cntn 17 qp-type RC pid 4242 comm python3
        sent_pkts 20
        rcvd_pkts 20
        ...
        LQPN: <17>

The counters (:data:`softverbs.engine.core.QP_COUNTERS`) are the device
counters' that belong to one QP: its packets sent and received (a burst of
segments counts each packet; an ACK is a packet), sequence errors, duplicate
requests, RNR NAKs sent and received, retransmissions (``completer_retry_err``
each time the QP goes back to resend, ``rnr_retries`` after an RNR back-off),
ACK timeouts and the retries exhausted.  Binding counters (``mode``, ``set``,
``bind``, ``unbind``) is not offered: every QP already has its own.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from softverbs import Context, counters, get_device_list
from softverbs.cli import res
from softverbs.cli.main import UserError

PORT = 1  #: every softverbs device has one port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Show device and port counters, like 'rdma statistic show', or every QP's counters "
        "on the host device, like 'rdma statistic qp show'. An in-process device is the "
        "calling process's own, so from the command line it shows zeros; a device served by "
        "softverbsd shows the counters every process shares."
    )
    parser.add_argument("words", nargs="*",
                        metavar="[show] [link [DEV[/PORT]]] | qp [show] [link DEV[/PORT]] "
                                "[NAME VALUE]",
                        help="what to show, in rdma statistic's words (default: every link); "
                             "the qp filters are cntn, lqpn, pid and qp-type")  # fmt: skip
    res.add_common(parser)


def _target(words: list[str]) -> str | None:
    """The DEV[/PORT] asked for, or None for every link."""
    rest = list(words)
    if rest and rest[0] in ("show", "list"):
        rest.pop(0)
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


# --- per-QP counters ------------------------------------------------------------------------

#: the filters of ``stat qp`` (rdma's)
QP_FILTERS = ("cntn", "lqpn", "pid", "qp-type")


def qp_rows(status: dict[str, Any], dev: str | None) -> list[dict[str, Any]]:
    """One row per QP, in rdma's fields and order: the link, cntn, qp-type, pid,
    comm, the counters, and lqpn (a list: the QPs bound to the counter)."""
    index = res.device_index(status)
    out = []
    for proc, obj in res.objects(status):
        if obj["kind"] != "qp" or "counters" not in obj or (dev and obj["device"] != dev):
            continue
        row = res.link_fields(index, obj)
        row.update({"cntn": obj["qpn"], "qp-type": res.qp_type(obj), "pid": proc["pid"]})
        name = res.comm(proc["pid"])
        if name is not None:
            row["comm"] = name
        row.update(obj["counters"])
        row["lqpn"] = [obj["qpn"]]
        out.append(row)
    out.sort(key=lambda r: (r["ifindex"], r["cntn"]))
    return out


def qp_filtered(rows: list[dict[str, Any]], filters: list[str]) -> list[dict[str, Any]]:
    for name, value in zip(filters[::2], filters[1::2], strict=True):
        if name not in QP_FILTERS:
            raise UserError(f"{name}: not a filter of 'stat qp' (filters: {', '.join(QP_FILTERS)})")
        if name == "qp-type":
            rows = [r for r in rows if r["qp-type"] == value]
            continue
        try:
            number = int(value, 0)
        except ValueError:
            raise UserError(f"{name} {value}: {name} takes a number") from None
        if name == "lqpn":
            rows = [r for r in rows if number in r["lqpn"]]
        else:
            rows = [r for r in rows if r.get(name) == number]
    return rows


def qp_text(row: dict[str, Any]) -> str:
    """rdma's lines: the counter's line, a counter per indented line, the QPs."""
    first = " ".join([res.head(row), *(f"{k} {row[k]}" for k in ("cntn", "qp-type", "pid", "comm")
                                       if k in row)])  # fmt: skip
    skip = {"ifindex", "ifname", "port", "cntn", "qp-type", "pid", "comm", "lqpn"}
    lines = [first, *(f"    {k} {v}" for k, v in row.items() if k not in skip)]
    lines.append("    LQPN: <" + ",".join(str(q) for q in row["lqpn"]) + ">")
    return "\n".join(lines)


def run_qp(args: argparse.Namespace, words: list[str]) -> int:
    if words and words[0] in ("mode", "set", "bind", "unbind"):
        raise UserError(f"stat qp {words[0]}: counters are not bound in softverbs: every QP "
                        "has its own (cntn is its lqpn); see 'softverbs stat qp show'")  # fmt: skip
    if words and words[0] in ("show", "list"):
        words = words[1:]
    status = res.fetch(args.socket)
    if status is None:
        if args.json:
            print("[]")
        return 0
    dev, filters = res.parse_target(words, "stat qp", list(res.device_index(status)))
    selected = qp_filtered(qp_rows(status, dev), filters)
    if args.json:
        print(res.json_rows(selected, args.pretty))
    else:
        for row in selected:
            print(qp_text(row))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.words and args.words[0] == "qp":
        return run_qp(args, args.words[1:])
    selected = rows(_target(args.words))
    if args.json:
        print(json.dumps(selected, indent=4 if args.pretty else None))
    else:
        for row in selected:
            print(text(row))
    return 0
