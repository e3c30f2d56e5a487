"""``softverbs trace FILE [-o OUT.html]``: a ``SOFTVERBS_TRACE`` file as a ladder diagram.

The page is one self-contained HTML file (inline CSS, SVG and script; no
external resource): one vertical lane per QP, one row per record in the
order they were written, an arrow from the sending lane to the receiving
lane for every packet (labelled with its opcode, PSN and length), and a dot
with a short label for every other record (WQE, doorbell, CQE, state
change, retransmission, event).  Clicking anything shows its JSON record.
See ``docs/trace.md``.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
from collections import deque
from typing import Any

from softverbs.cli.main import UserError

#: layout, in pixels
LANE_W = 260
LEFT = 110
TOP = 60
ROW_H = 22

#: colour of each kind of record
COLOURS = {
    "doorbell": "#888888", "wqe_start": "#1f6feb", "wqe_done": "#1f6feb", "packet_out": "#222222",
    "packet_in": "#222222", "step": "#57606a", "retransmit": "#d29922", "rate": "#bc4c00",
    "cqe": "#2da44e", "state": "#8250df", "event": "#cf222e",
}  # fmt: skip
NAK_COLOUR = "#cf222e"

Lane = tuple[str, int]  # (device, qpn); device "" for a QP outside the trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a trace written by SOFTVERBS_TRACE=FILE")
    parser.add_argument("-o", "--output", metavar="OUT.html",
                        help="where to write the page ('-': standard output; default: FILE "
                        "with its extension replaced by .html)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    records = load(args.file)
    page = render(records, title=os.path.basename(args.file))
    out = args.output or os.path.splitext(args.file)[0] + ".html"
    if out == "-":
        sys.stdout.write(page)
        return 0
    if os.path.abspath(out) == os.path.abspath(args.file):
        raise UserError(f"{out}: the page would overwrite the trace; give -o OUT.html")
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    lanes = {(r["dev"], r["qpn"]) for r in records if r.get("qpn") is not None}
    print(f"wrote {out}: {len(records)} records, {len(lanes)} QPs")
    return 0


def load(path: str) -> list[dict[str, Any]]:
    """The records of a trace file; a UserError naming the file and line if it is not one."""
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not a SOFTVERBS_TRACE record "
                                f"(not JSON: {exc.msg})") from None  # fmt: skip
            if not (isinstance(rec, dict) and isinstance(rec.get("kind"), str)
                    and isinstance(rec.get("t"), int | float) and "dev" in rec):  # fmt: skip
                raise UserError(f"{path}:{lineno}: not a SOFTVERBS_TRACE record "
                                "(a JSON object with t, dev and kind)")  # fmt: skip
            records.append(rec)
    if not records:
        raise UserError(f"{path}: holds no SOFTVERBS_TRACE records")
    return records


# --- labels ------------------------------------------------------------------------------------
def _short(opcode: Any) -> str:
    """``RC_SEND_ONLY`` -> ``SEND_ONLY``: the lane already says the transport."""
    name = str(opcode)
    head, _, rest = name.partition("_")
    return rest if rest and head in ("RC", "UC", "RD", "UD", "XRC", "CNP") else name


def packet_label(rec: dict[str, Any]) -> str:
    """``SEND_ONLY psn 0 len 16``; a burst ``SEND_FIRST..SEND_LAST psn 0..2 len 3000``;
    an ACK ``ACK psn 2``, a NAK ``NAK PSN_SEQUENCE_ERROR psn 5``."""
    name = _short(rec.get("opcode"))
    if name == "ACKNOWLEDGE" and rec.get("aeth"):
        name = str(rec["aeth"]) + (f" {rec['nak']}" if rec.get("nak") else "")
    psn = rec.get("psn")
    count = rec.get("count", 1)
    if isinstance(count, int) and count > 1 and isinstance(psn, int):
        name += f"..{_short(rec.get('last_opcode'))}"
        psns = f"{psn}..{(psn + count - 1) & 0xFFFFFF}"
    else:
        psns = str(psn)
    label = f"{name} psn {psns}"
    if rec.get("length"):
        label += f" len {rec['length']}"
    return label


def _strip(name: Any, prefix: str) -> str:
    text = str(name)
    return text[len(prefix):] if text.startswith(prefix) else text


def event_label(rec: dict[str, Any]) -> str:
    kind = str(rec["kind"])
    if kind == "doorbell":
        return f"doorbell {rec.get('queue')} {rec.get('index')}"
    if kind == "wqe_start":
        text = f"WQE {_strip(rec.get('opcode'), 'IBV_WR_')} wr_id {rec.get('wr_id')}"
        text += f" len {rec.get('length')}"
        if "psn" in rec:
            text += f" psn {rec['psn']}"
        if rec.get("status"):
            text += f" {_strip(rec['status'], 'IBV_WC_')}"
        return text
    if kind == "wqe_done":
        text = f"WQE done wr_id {rec.get('wr_id')}"
        if rec.get("status"):
            text += f" {_strip(rec['status'], 'IBV_WC_')}"
        return text
    if kind == "cqe":
        return (f"CQE {_strip(rec.get('opcode'), 'IBV_WC_')} wr_id {rec.get('wr_id')} "
                f"{_strip(rec.get('status'), 'IBV_WC_')} len {rec.get('byte_len')}")  # fmt: skip
    if kind == "state":
        return f"{_strip(rec.get('old'), 'IBV_QPS_')} -> {_strip(rec.get('new'), 'IBV_QPS_')}"
    if kind == "rate":
        return f"rate {float(rec.get('bps') or 0) / 1e9:.3f} Gb/s ({rec.get('why')})"
    if kind == "step":
        return f"{rec.get('part')}: {rec.get('state')}"
    if kind == "retransmit":
        return f"retransmit from psn {rec.get('psn')} ({rec.get('why')})"
    if kind == "event":
        return f"event {_strip(rec.get('event'), 'IBV_EVENT_')}"
    if kind == "packet_in":
        return f"in: {packet_label(rec)}"
    return kind


# --- layout ------------------------------------------------------------------------------------
def _lanes(records: list[dict[str, Any]]) -> tuple[list[Lane], dict[int, Lane], dict[Lane, str]]:
    """The lanes in order of first appearance, the destination lane of each
    packet_out (by record index) and each lane's QP type."""
    owner: dict[str, str] = {}  # gid (hex) -> device
    for r in records:
        if r["kind"] == "device":
            for gid in r.get("gids") or ():
                owner.setdefault(str(gid), str(r["dev"]))
    lanes: dict[Lane, None] = {}
    qp_types: dict[Lane, str] = {}
    for r in records:
        if isinstance(r.get("qpn"), int):
            lane = (str(r["dev"]), int(r["qpn"]))
            lanes.setdefault(lane)
            if r.get("qp_type"):
                qp_types[lane] = _strip(r["qp_type"], "IBV_QPT_")
    dest: dict[int, Lane] = {}
    for i, r in enumerate(records):
        if r["kind"] == "packet_out" and isinstance(r.get("dqpn"), int):
            d = (owner.get(str(r.get("dgid")), ""), int(r["dqpn"]))
            if d not in lanes:
                # not a traced device: one lane per remote QP number
                d = ("", int(r["dqpn"]))
                lanes.setdefault(d)
            dest[i] = d
    return list(lanes), dest, qp_types


def _match(records: list[dict[str, Any]], dest: dict[int, Lane]) -> dict[int, int]:
    """packet_out index -> the index of the packet_in that received it."""
    arrivals: dict[tuple[Any, ...], deque[int]] = {}
    for i, r in enumerate(records):
        if r["kind"] == "packet_in":
            key = (r["dev"], r.get("qpn"), r.get("opcode"), r.get("psn"))
            arrivals.setdefault(key, deque()).append(i)
    matched: dict[int, int] = {}
    for i, lane in dest.items():
        r = records[i]
        queue = arrivals.get((lane[0], lane[1], r.get("opcode"), r.get("psn")))
        while queue and queue[0] < i:
            queue.popleft()  # an arrival before this send belongs to an earlier one
        if queue:
            matched[i] = queue.popleft()
    return matched


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def render(records: list[dict[str, Any]], title: str = "trace") -> str:
    """The HTML page of ``records`` (see the module docstring)."""
    lanes, dest, qp_types = _lanes(records)
    matched = _match(records, dest)
    received = set(matched.values())
    x_of = {lane: LEFT + i * LANE_W + LANE_W // 2 for i, lane in enumerate(lanes)}
    t0 = min(float(r["t"]) for r in records)
    rows = [i for i, r in enumerate(records) if r["kind"] != "device"]
    y_of = {i: TOP + (n + 1) * ROW_H for n, i in enumerate(rows)}
    width = LEFT + len(lanes) * LANE_W + 20
    height = TOP + (len(rows) + 2) * ROW_H
    svg: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">',
        "<defs>",
        *(f'<marker id="arrow-{k}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
          f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
          f'fill="{c}"/></marker>'
          for k, c in (("ok", COLOURS["packet_out"]), ("nak", NAK_COLOUR))),
        "</defs>",
    ]  # fmt: skip
    for lane, x in x_of.items():
        dev, qpn = lane
        head = f"{dev} QP {qpn:#x}" if dev else f"remote QP {qpn:#x}"
        kind = qp_types.get(lane, "")
        svg.append(f'<line class="lane" x1="{x}" y1="{TOP}" x2="{x}" y2="{height - ROW_H}" '
                   f'stroke="#bbbbbb" stroke-dasharray="{"4 4" if not dev else "none"}"/>')
        svg.append(f'<text x="{x}" y="{TOP - 26}" text-anchor="middle" font-weight="bold" '
                   f'font-size="13">{_esc(head)}</text>')  # fmt: skip
        if kind:
            svg.append(f'<text x="{x}" y="{TOP - 10}" text-anchor="middle">{_esc(kind)}</text>')
    for i in rows:
        r = records[i]
        y = y_of[i]
        kind = r["kind"]
        svg.append(f'<text class="time" x="{LEFT - 10}" y="{y + 4}" text-anchor="end" '
                   f'fill="#888888">+{(float(r["t"]) - t0) * 1e3:.3f} ms</text>')  # fmt: skip
        if not isinstance(r.get("qpn"), int):  # an event of a CQ or SRQ: at the left margin
            svg.append(_mark(i, kind, LEFT - 4, y, event_label(r), anchor="start"))
            continue
        x = x_of[(str(r["dev"]), int(r["qpn"]))]
        if kind == "packet_out" and i in dest:
            j = matched.get(i)
            svg.append(_arrow(i, r, x, y, x_of[dest[i]], None if j is None else (j, y_of[j])))
        elif kind == "packet_in" and i in received:
            continue  # drawn as the head of its arrow
        else:
            svg.append(_mark(i, kind, x, y, event_label(r)))
    svg.append("</svg>")
    data = json.dumps(records, separators=(",", ":")).replace("</", "<\\/")
    return _PAGE.format(title=_esc(title), svg="\n".join(svg), data=data,
                        legend=_legend(), n=len(records), lanes=len(lanes))  # fmt: skip


def _arrow(i: int, r: dict[str, Any], x1: int, y1: int, x2: int,
           arrival: tuple[int, int] | None) -> str:  # fmt: skip
    nak = r.get("aeth") in ("NAK", "RNR_NAK")
    colour = NAK_COLOUR if nak else COLOURS["packet_out"]
    lost = arrival is None
    y2 = y1 + ROW_H // 2 if arrival is None else arrival[1]
    received = "" if arrival is None else f' data-in="{arrival[0]}"'
    if x1 == x2:  # a QP sending to itself: a small loop
        x2 = x1 + 30
    mid_x = (x1 + x2) // 2
    label = packet_label(r) + (" (no packet_in)" if lost else "")
    dash = ' stroke-dasharray="5 3"' if lost else ""
    return (f'<g class="ev k-packet_out" data-i="{i}"{received}><title>{_esc(label)}</title>'
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" stroke-width="1.5"'
            f'{dash} marker-end="url(#arrow-{"nak" if nak else "ok"})"/>'
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="transparent" '
            f'stroke-width="8"/>'
            f'<text x="{mid_x}" y="{min(y1, y2) - 3}" text-anchor="middle" fill="{colour}" '
            f'class="label">{_esc(label)}</text></g>')  # fmt: skip


def _mark(i: int, kind: str, x: int, y: int, label: str, anchor: str = "start") -> str:
    colour = COLOURS.get(kind, "#444444")
    return (f'<g class="ev k-{_esc(kind)}" data-i="{i}"><title>{_esc(label)}</title>'
            f'<circle cx="{x}" cy="{y}" r="4" fill="{colour}"/>'
            f'<text x="{x + 8}" y="{y + 4}" fill="{colour}" text-anchor="{anchor}" '
            f'class="label">{_esc(label)}</text></g>')  # fmt: skip


def _legend() -> str:
    parts = []
    for kind, colour in COLOURS.items():
        # packet_in: a packet whose sending is not in the trace (or a piece of a split burst)
        parts.append(f'<label style="color:{colour}"><input type="checkbox" checked '
                     f'data-kind="{kind}"> {kind}</label>')  # fmt: skip
    return " ".join(parts)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>softverbs trace: {title}</title>
<style>
body {{ margin: 0; font-family: sans-serif; font-size: 13px; }}
header {{ position: sticky; top: 0; background: #f6f8fa; border-bottom: 1px solid #d0d7de;
          padding: 6px 10px; z-index: 2; }}
#diagram {{ margin-right: 380px; overflow-x: auto; }}
#details {{ position: fixed; top: 40px; right: 0; width: 360px; bottom: 0; overflow: auto;
            background: #ffffff; border-left: 1px solid #d0d7de; padding: 8px; }}
#details pre {{ white-space: pre-wrap; word-break: break-all; font-size: 12px; }}
.ev {{ cursor: pointer; }}
.ev:hover text.label {{ font-weight: bold; }}
.ev.selected text.label {{ font-weight: bold; text-decoration: underline; }}
{hide_rules}
</style>
</head>
<body>
<header><b>softverbs trace</b> {title}: {n} records, {lanes} QP lanes.
Show: {legend}</header>
<div id="details"><b>Details</b><pre id="record">Click an arrow or a dot.</pre></div>
<div id="diagram">
{svg}
</div>
<script id="trace-data" type="application/json">{data}</script>
<script>
(function () {{
  var records = JSON.parse(document.getElementById("trace-data").textContent);
  var out = document.getElementById("record");
  var selected = null;
  function show(g) {{
    var i = parseInt(g.getAttribute("data-i"), 10);
    var text = JSON.stringify(records[i], null, 2);
    var j = g.getAttribute("data-in");
    if (j !== null) {{
      text += "\n\nreceived (record " + j + "):\n" + JSON.stringify(records[j], null, 2);
    }}
    out.textContent = "record " + i + ":\\n" + text;
    if (selected) selected.classList.remove("selected");
    selected = g;
    g.classList.add("selected");
  }}
  document.querySelectorAll(".ev").forEach(function (g) {{
    g.addEventListener("click", function () {{ show(g); }});
  }});
  document.querySelectorAll("header input[data-kind]").forEach(function (box) {{
    box.addEventListener("change", function () {{
      document.body.classList.toggle("hide-" + box.getAttribute("data-kind"), !box.checked);
    }});
  }});
}})();
</script>
</body>
</html>
""".replace(
    "{hide_rules}",
    "\n".join(f".hide-{k} .k-{k} {{{{ display: none; }}}}" for k in COLOURS),
)
