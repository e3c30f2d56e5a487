"""Device contexts: opening a device, its queries, counters, and the tools on it.

The handlers of the operations on a device as a whole -- ``LIST_DEVICES``,
``OPEN_DEVICE`` (a context, whose event socket hears its objects' async
events), the queries of the device, its port, GIDs and P_Keys, its counters
and the host's status -- and of the observers a context attaches: a packet
capture (``CAPTURE``), seeded faults on its owner's packets (``FAULTS``) and
the verbs sanitizer (``SANITIZE``).  The ops table
(:mod:`softverbs.device.ops`) names them.
"""

from __future__ import annotations

import errno
import json
import os
from typing import TYPE_CHECKING, Any

from softverbs.device import records
from softverbs.device.core import (
    GID_TABLE_LEN,
    PKEY_TABLE,
    CtxObj,
    Device,
    Host,
    Obj,
    Owner,
    OwnerFaults,
    Resources,
    kind_class,
)
from softverbs.device.records import KIND_CAPTURE
from softverbs.engine import observe
from softverbs.engine.hca import HCA
from softverbs.enums import IBV_GID_TYPE_ROCE_V2
from softverbs.errors import PyverbsRDMAError, einval, eopnotsupp
from softverbs.sanitizer import SanitizeError, Sanitizer, Watch
from softverbs.sanitizer import parse as parse_sanitize

if TYPE_CHECKING:  # the fabric's capture writer, imported when a capture is made
    from softverbs.fabric.pcap import PcapWriter


@kind_class
class CaptureObj(Obj):
    """A packet capture of the device, until it is destroyed."""

    KIND = KIND_CAPTURE
    __slots__ = ()

    engine: PcapWriter

    def __init__(self, owner: Owner, ctx: CtxObj, writer: PcapWriter) -> None:
        super().__init__(owner, ctx.device, ctx)
        self.engine = writer

    def teardown(self, hca: HCA) -> None:
        """The tap goes with the capture's ``release`` (under the runtime's lock)."""


def list_devices(host: Host, owner: Owner, req: records.Empty,
                 res: Resources) -> records.Reply[records.ListDevicesReply]:  # fmt: skip
    entries = host.entries()
    tail = b"".join(e.pack() for e in entries)
    return records.Reply(records.ListDevicesReply(len(entries), 0), tail)


def open_device(host: Host, owner: Owner, req: records.OpenDevice,
                res: Resources) -> records.OpenDeviceReply:  # fmt: skip
    entries = host.entries()
    if not any(e.name == req.name for e in entries):
        names = ", ".join(e.name for e in entries) or "none"
        raise PyverbsRDMAError(f"Failed to find device {req.name}; softverbs devices are: "
                               f"{names}", errno.ENODEV)  # fmt: skip
    dev = host.device(req.name)
    rec = host.add(CtxObj(owner, dev, res.events))
    rec.release = res.release  # the event socket closes with the context
    gids = sum(1 for g in dev.hca.gids if any(g))
    return records.OpenDeviceReply(dev.info.guid, rec.handle, _index(host, dev), dev.info.mtu,
                                   gids)  # fmt: skip


def _index(host: Host, dev: Device) -> int:
    return next((e.index for e in host.entries() if e.name == dev.name), 0)


def query_device(host: Host, owner: Owner, req: records.Ctx,
                 res: Resources) -> records.DeviceAttrs:  # fmt: skip
    return host.ctx(owner, req.ctx).device.device_attrs()


def _port(port: int, verb: str) -> None:
    if port != 1:
        raise einval(f"{verb}: port {port} does not exist; softverbs devices have one port, 1")


def query_port(host: Host, owner: Owner, req: records.QueryPort,
               res: Resources) -> records.PortAttrs:  # fmt: skip
    dev = host.ctx(owner, req.ctx).device
    _port(req.port, f"Failed to query port {req.port}")
    with dev.runtime.lock:
        return dev.port_attrs()


def query_gid(host: Host, owner: Owner, req: records.QueryGid,
              res: Resources) -> records.QueryGidReply:  # fmt: skip
    dev = host.ctx(owner, req.ctx).device
    fail = f"Failed to query gid {req.index} of port {req.port}"
    _port(req.port, fail)
    if not 0 <= req.index < GID_TABLE_LEN:
        raise einval(f"{fail}: the GID table has {GID_TABLE_LEN} entries")
    gids = dev.hca.gids
    raw = gids[req.index] if req.index < len(gids) else bytes(16)
    if not any(raw):
        raise PyverbsRDMAError(f"{fail}: the entry is empty", errno.ENODATA)
    return records.QueryGidReply(raw, int(IBV_GID_TYPE_ROCE_V2), dev.info.ifindex)


def query_pkey(host: Host, owner: Owner, req: records.QueryGid,
               res: Resources) -> records.QueryPkeyReply:  # fmt: skip
    fail = f"Failed to query pkey {req.index} of port {req.port}"
    host.ctx(owner, req.ctx)
    _port(req.port, fail)
    if not 0 <= req.index < len(PKEY_TABLE):
        raise einval(fail)
    return records.QueryPkeyReply(PKEY_TABLE[req.index], 0)


def counters(host: Host, owner: Owner, req: records.Ctx,
             res: Resources) -> records.Reply[records.Empty]:  # fmt: skip
    dev = host.ctx(owner, req.ctx).device
    with dev.runtime.lock:
        return records.Reply(records.Empty(), json.dumps(dev.counters()).encode())


def status(host: Host, owner: Owner, req: records.Empty,
           res: Resources) -> records.Reply[records.Empty]:  # fmt: skip
    """The host's owners and objects (the device service answers STATUS with
    its own, larger document)."""
    return records.Reply(records.Empty(), json.dumps(host.describe()).encode())


def capture(host: Host, owner: Owner, req: records.CaptureReq,
            res: Resources) -> records.Handle:  # fmt: skip
    """Every packet to or from the device, written to ``res.file`` (pcap)."""
    from softverbs.fabric.pcap import PcapWriter

    ctx = host.ctx(owner, req.ctx)
    dev = ctx.device
    if res.file is None:
        raise einval("CAPTURE: no file was passed")
    runtime: Any = dev.runtime  # a fabric Runtime has taps; another driver may not
    if not hasattr(runtime, "add_tap"):
        raise eopnotsupp(f"CAPTURE: device {dev.name} cannot be tapped here")
    writer = PcapWriter(res.file, header=not req.flags & records.CAPTURE_APPEND)
    with runtime.lock:
        runtime.add_tap(writer, frozenset(bytes(g) for g in dev.hca.gids))
    rec = host.add(CaptureObj(owner, ctx, writer), (ctx,))

    def stop() -> None:
        with runtime.lock:
            runtime.remove_tap(writer)
        writer.close()

    rec.release = [stop, *res.release]
    return records.Handle(rec.handle, 0)


def faults(host: Host, owner: Owner, req: records.Ctx, res: Resources) -> records.Empty:
    """Seeded faults on the packets ``owner``'s QPs send on the device
    (``SOFTVERBS_FAULTS`` rules; empty: none).  On a device several
    processes share, each one's rules act on its own packets only."""
    from softverbs.fabric.faults import parse_faults

    dev = host.ctx(owner, req.ctx).device
    runtime: Any = dev.runtime  # a fabric Runtime has a fault layer; another driver may not
    if not hasattr(runtime, "faults"):
        raise eopnotsupp(f"FAULTS: device {dev.name} has no fault layer here")
    try:
        rules = parse_faults(res.text) if res.text.strip() else None
    except ValueError as exc:
        raise einval(f"FAULTS: {exc}") from None
    with runtime.lock:
        layer = runtime.faults
        if not isinstance(layer, OwnerFaults):
            layer = runtime.faults = OwnerFaults(host, layer)
        if rules is None:
            layer.rules.pop(owner, None)
        else:
            layer.rules[owner] = rules
    return records.Empty()


def sanitize(host: Host, owner: Owner, req: records.Empty, res: Resources) -> records.Empty:
    """Turn the verbs sanitizer on for ``owner``: reports go to ``res.file``."""
    try:
        options = parse_sanitize(res.text)
    except SanitizeError as exc:
        raise einval(str(exc)) from None
    if options is None or res.file is None:
        raise einval("SANITIZE: no options, or no file for the reports")
    if host.sanitizer is None:
        host.sanitizer = Sanitizer()
    for dev in host.devices.values():
        observe.attach_once(dev.hca, host.sanitizer)
        dev.hca.keys.on_unmapped = host.sanitizer.unmapped
    local = owner.pid == os.getpid()
    host.sanitizer.watches[owner] = Watch(res.file, options, owner.pid, local)
    owner.release.extend(res.release)  # the file stays open while the owner lives
    res.release = []
    return records.Empty()
