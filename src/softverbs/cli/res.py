"""``softverbs res``: the host device's resources, in the form of ``rdma resource``.

::

    softverbs res [show] [DEV]
    softverbs res [show] {qp|cq|mr|pd|ctx|srq} [link DEV[/PORT] | dev DEV]
                  [FILTER-NAME FILTER-VALUE ...] [-j] [-p] [-d] [--socket PATH]

What iproute2's ``rdma res`` shows of a kernel device, for the host device
that softverbsd serves: every process's QPs, CQs, MRs, PDs, contexts and
SRQs.  ``rdma res show`` is one summary line per device, ``0: sv0: pd 1 cq 2
qp 2 cm_id 0 mr 1 ctx 1 srq 0``; ``rdma res show qp`` one line per QP,
``link sv0/1 lqpn 17 rqpn 18 type RC state RTS rq-psn 0 sq-psn 0
path-mig-state MIGRATED pdn 3 pid 4242 comm python3``; the other objects'
lines start with ``dev sv0``.  The fields are rdma's, in its order, printed
when the kernel would print them (``rqpn`` and ``rq-psn`` for RC and UC QPs
only, ``link sv0/-`` for a QP still in RESET).  ``-j`` prints rdma's JSON (a
list of objects; ``-p`` indents it), ``-d`` adds what the service knows
beyond rdma's fields (an object's handle; a CQ's waiting completions).
A filter ``NAME VALUE`` keeps the objects whose field NAME is VALUE, as
rdma's do (``lqpn 17``, ``pid 4242``, ``state RTS``).

Numbers.  ``pdn``, ``cqn``, ``mrn``, ``ctxn`` and ``srqn`` are the service's
handles of the objects, unique on the host, so a QP's ``pdn`` is its PD's.
``sq-psn`` and ``rq-psn`` are the PSNs the QP is at (the next it sends, the
next it expects), as mlx5 reports them.  ``comm`` is read from
``/proc/PID/comm``, as rdma does.

Only the service's objects exist for other processes to see: a program on
an in-process device (``SOFTVERBS_SERVICE=0``) keeps its objects to itself.
When softverbsd is not running, no process holds anything on the host
device: ``res`` says so on stderr, shows nothing and exits 0; it never
starts the service.  The service's own objects (its CM agent's) are not shown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

from softverbs.cli.main import UserError
from softverbs.config import SOCKET_HELP

#: the objects rdma's summary counts, in its order
SUMMARY = ("pd", "cq", "qp", "cm_id", "mr", "ctx", "srq")
#: what ``res show WHAT`` accepts: the objects with a line of their own
OBJECTS = ("qp", "cq", "mr", "pd", "ctx", "srq")
#: softverbs' QP type names (ibv_qp_type without IBV_QPT_) -> rdma's
QP_TYPES = {"XRC_SEND": "XRC_INI", "XRC_RECV": "XRC_TGT"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Show the resources every process holds on the host device (served by softverbsd), "
        "like 'rdma resource show': a summary per device, or one line per QP, CQ, MR, PD, "
        "context or SRQ, with their state, numbers, pid and comm. Never starts the service."
    )
    parser.add_argument("words", nargs="*",
                        metavar="[show] [DEV | OBJECT [link DEV[/PORT] | dev DEV] [NAME VALUE]...]",
                        help="what to show, in rdma resource's words; OBJECT is one of "
                             f"{', '.join(OBJECTS)} (default: a summary per device)")  # fmt: skip
    add_common(parser)
    parser.add_argument("-d", "--details", action="store_true",
                        help="add the service's own fields (handles, waiting CQEs)")


def add_common(parser: argparse.ArgumentParser) -> None:
    """The options ``res`` and ``stat qp`` share."""
    parser.add_argument("-j", "--json", action="store_true", help="JSON output, as rdma -j")
    parser.add_argument("-p", "--pretty", action="store_true", help="indent the JSON output")
    parser.add_argument("--socket", metavar="PATH", help=SOCKET_HELP)


# --- the service's state --------------------------------------------------------------------


def fetch(socket: str | None) -> dict[str, Any] | None:
    """The service's STATUS, or None (said on stderr) if it is not running;
    UserError (the real reason) if it runs but did not answer."""
    from softverbs.cli.service import ServiceError, fetch_status
    from softverbs.device import protocol

    path = os.path.abspath(socket or protocol.default_socket_path())
    try:
        status = fetch_status(path)
    except ServiceError as exc:
        raise UserError(str(exc)) from None
    if status is None:
        print(f"softverbs: softverbsd is not running on {path}, so no process holds resources "
              "on the host device (in-process devices are their process's own)",
              file=sys.stderr)  # fmt: skip
    return status


def comm(pid: int) -> str | None:
    """The process's name, as rdma reads it; None if it cannot be read."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.readline().rstrip("\n")
    except OSError:
        return None


def objects(status: dict[str, Any]) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (process, object) of the service's clients."""
    for proc in status.get("processes", []):
        for obj in proc.get("handles", []):
            yield proc, obj


def device_index(status: dict[str, Any]) -> dict[str, int]:
    return {link["ifname"]: link["ifindex"] for link in status.get("links", [])}


# --- rows, in rdma's fields and order -------------------------------------------------------


def _owner_fields(row: dict[str, Any], proc: dict[str, Any]) -> None:
    row["pid"] = proc["pid"]
    name = comm(proc["pid"])
    if name is not None:
        row["comm"] = name


def qp_type(obj: dict[str, Any]) -> str:
    name = str(obj["type"])
    return QP_TYPES.get(name, name)


def link_fields(index: dict[str, int], obj: dict[str, Any]) -> dict[str, Any]:
    """ifindex, ifname and (once the QP has a port, past RESET) port."""
    row: dict[str, Any] = {"ifindex": index.get(obj["device"], 0), "ifname": obj["device"]}
    if obj.get("state") != "RESET":
        row["port"] = obj.get("port", 1)
    return row


def qp_row(index: dict[str, int], proc: dict[str, Any], obj: dict[str, Any],
           details: bool) -> dict[str, Any]:  # fmt: skip
    row = link_fields(index, obj)
    kind = qp_type(obj)
    connected = kind in ("RC", "UC")
    row["lqpn"] = obj["qpn"]
    if connected:
        row["rqpn"] = obj["rqpn"]
    row["type"] = kind
    row["state"] = obj["state"]
    if connected:
        row["rq-psn"] = obj["rq_psn"]
    row["sq-psn"] = obj["sq_psn"]
    if kind in ("RC", "UC", "XRC_INI", "XRC_TGT"):
        row["path-mig-state"] = "MIGRATED"  # no alternate paths: always migrated
    if "pdn" in obj:
        row["pdn"] = obj["pdn"]
    _owner_fields(row, proc)
    if details:
        row["handle"] = obj["handle"]
    return row


def _dev_row(index: dict[str, int], obj: dict[str, Any]) -> dict[str, Any]:
    return {"ifindex": index.get(obj["device"], 0), "ifname": obj["device"]}


def cq_row(index: dict[str, int], proc: dict[str, Any], obj: dict[str, Any],
           details: bool) -> dict[str, Any]:  # fmt: skip
    row = _dev_row(index, obj)
    row.update(cqn=obj["handle"], cqe=obj["cqe"], users=obj["users"])
    if "ctxn" in obj:
        row["ctxn"] = obj["ctxn"]
    _owner_fields(row, proc)
    if details:
        row["waiting"] = obj.get("waiting", 0)
    return row


def mr_row(index: dict[str, int], proc: dict[str, Any], obj: dict[str, Any],
           details: bool) -> dict[str, Any]:  # fmt: skip
    row = _dev_row(index, obj)
    row.update(mrn=obj["handle"], rkey=obj["rkey"], lkey=obj["lkey"], iova=obj["iova"],
               mrlen=obj["length"])  # fmt: skip
    if "pdn" in obj:
        row["pdn"] = obj["pdn"]
    _owner_fields(row, proc)
    return row


def pd_row(index: dict[str, int], proc: dict[str, Any], obj: dict[str, Any],
           details: bool) -> dict[str, Any]:  # fmt: skip
    row = _dev_row(index, obj)
    row.update(pdn=obj["handle"], users=obj["users"])
    if "ctxn" in obj:
        row["ctxn"] = obj["ctxn"]
    _owner_fields(row, proc)
    return row


def ctx_row(index: dict[str, int], proc: dict[str, Any], obj: dict[str, Any],
            details: bool) -> dict[str, Any]:  # fmt: skip
    row = _dev_row(index, obj)
    row["ctxn"] = obj["handle"]
    _owner_fields(row, proc)
    return row


def srq_row(index: dict[str, int], proc: dict[str, Any], obj: dict[str, Any],
            details: bool) -> dict[str, Any]:  # fmt: skip
    row = _dev_row(index, obj)
    row["srqn"] = obj["srqn"]
    row["type"] = "XRC" if obj.get("xrc") else "BASIC"
    for key in ("pdn", "cqn"):
        if key in obj:
            row[key] = obj[key]
    _owner_fields(row, proc)
    if details:
        row["handle"] = obj["handle"]
        row["max_wr"] = obj.get("max_wr", 0)
    return row


ROWS = {"qp": qp_row, "cq": cq_row, "mr": mr_row, "pd": pd_row, "ctx": ctx_row, "srq": srq_row}


def summary(status: dict[str, Any], dev: str | None) -> list[dict[str, Any]]:
    """One row per device: ifindex, ifname, then how many of each object."""
    counts: dict[str, dict[str, int]] = {}
    for _, obj in objects(status):
        if obj["kind"] in SUMMARY:
            per = counts.setdefault(obj["device"], {})
            per[obj["kind"]] = per.get(obj["kind"], 0) + 1
    for name, n in status.get("cm_ids", {}).items():
        counts.setdefault(name, {})["cm_id"] = n
    out = []
    for link in status.get("links", []):
        if dev is not None and link["ifname"] != dev:
            continue
        per = counts.get(link["ifname"], {})
        out.append({"ifindex": link["ifindex"], "ifname": link["ifname"],
                    **{k: per.get(k, 0) for k in SUMMARY}})  # fmt: skip
    return out


# --- text, as rdma prints it ----------------------------------------------------------------

#: fields rdma prints in hexadecimal (``print_key``)
HEX = ("rkey", "lkey", "iova", "local_dma_lkey")
#: fields only the JSON output has (the text has them in "link DEV/PORT" or "dev DEV")
JSON_ONLY = ("ifindex", "ifname", "port")


def head(row: dict[str, Any]) -> str:
    """``link DEV/PORT`` (or ``DEV/-``) for a row with a port or a QP's, else ``dev DEV``."""
    if "lqpn" in row or "cntn" in row:
        return f"link {row['ifname']}/{row.get('port', '-')}"
    return f"dev {row['ifname']}"


def pairs(row: dict[str, Any], skip: Iterable[str] = ()) -> list[str]:
    out = []
    for key, value in row.items():
        if key in JSON_ONLY or key in skip:
            continue
        out.append(f"{key} {value:#x}" if key in HEX else f"{key} {value}")
    return out


def text(row: dict[str, Any]) -> str:
    return " ".join([head(row), *pairs(row)])


def summary_text(row: dict[str, Any]) -> str:
    counts = " ".join(f"{k} {row[k]}" for k in SUMMARY)
    return f"{row['ifindex']}: {row['ifname']}: {counts}"


def json_rows(rows: list[dict[str, Any]], pretty: bool) -> str:
    """rdma's JSON: keys printed with print_key are hex strings without 0x."""
    out = [{k: (f"{v:x}" if k in HEX else v) for k, v in row.items()} for row in rows]
    if pretty:
        return json.dumps(out, indent=4)
    return json.dumps(out, separators=(",", ":"))


# --- the command line -----------------------------------------------------------------------


def parse_target(words: list[str], what: str, devices: list[str]) -> tuple[str | None, list[str]]:
    """``[link DEV[/PORT] | dev DEV]`` at the head of ``words``: the device (or
    None for all) and the words left (the filters)."""
    rest = list(words)
    dev: str | None = None
    if rest and rest[0] in ("link", "dev"):
        keyword = rest.pop(0)
        if not rest:
            raise UserError(f"'{keyword}' needs a device name")
        dev, _, port = rest.pop(0).partition("/")
        if keyword == "dev" and port:
            raise UserError(f"{dev}/{port}: 'dev' takes a device name, 'link' a DEV/PORT")
        if port and port != "1":
            raise UserError(f"{dev}/{port}: softverbs devices have one port, 1")
        check_device(dev, devices)
    if len(rest) % 2:
        raise UserError(f"{' '.join(rest)}: the filters of '{what}' are NAME VALUE pairs")
    return dev, rest


def check_device(dev: str, devices: list[str]) -> None:
    if dev not in devices:
        raise UserError(f"{dev}: no such device (the service's devices: "
                        f"{', '.join(devices) or 'none'})")  # fmt: skip


def filtered(rows: list[dict[str, Any]], filters: list[str]) -> list[dict[str, Any]]:
    """The rows whose fields match every ``NAME VALUE`` pair (as text; a hex
    field matches its hex or decimal value)."""
    want = list(zip(filters[::2], filters[1::2], strict=True))
    if not rows:
        return rows
    known = set().union(*(r.keys() for r in rows)) - {"ifindex", "ifname"}
    for name, _ in want:
        if name not in known:
            raise UserError(f"{name}: not a field to filter on (fields: "
                            f"{', '.join(sorted(known))})")  # fmt: skip

    def matches(row: dict[str, Any], name: str, value: str) -> bool:
        have = row.get(name)
        if have is None:
            return False
        if isinstance(have, int) and not isinstance(have, bool):
            try:
                return have == int(value, 0)
            except ValueError:
                return False
        return str(have) == value

    return [r for r in rows if all(matches(r, n, v) for n, v in want)]


def run(args: argparse.Namespace) -> int:
    words = list(args.words)
    if words and words[0] in ("show", "list"):
        words.pop(0)
    what = words.pop(0) if words else None
    status = fetch(args.socket)
    if status is None:
        if args.json:
            print("[]")
        return 0
    index = device_index(status)
    devices = list(index)
    if what is None or what not in OBJECTS:
        if what == "cm_id":
            raise UserError("cm_id: RDMA CM IDs are counted in the summary ('softverbs res'), "
                            "not listed one by one")  # fmt: skip
        if what is not None:
            if words:
                raise UserError(f"{what}: expected one of {', '.join(OBJECTS)} or a device")
            check_device(what, devices)
        rows = summary(status, what)
        if args.json:
            print(json_rows(rows, args.pretty))
        else:
            for row in rows:
                print(summary_text(row))
        return 0
    dev, filters = parse_target(words, what, devices)
    make = ROWS[what]
    rows = [make(index, proc, obj, args.details) for proc, obj in objects(status)
            if obj["kind"] == what and (dev is None or obj["device"] == dev)]  # fmt: skip
    rows.sort(key=lambda r: (r["ifindex"], r.get("lqpn", 0), r.get("pid", 0)))
    rows = filtered(rows, filters)
    if args.json:
        print(json_rows(rows, args.pretty))
    else:
        for row in rows:
            print(text(row))
    return 0
