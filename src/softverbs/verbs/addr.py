"""Addressing: GIDs, global routes, address handles (pyverbs ``addr``).

On RoCE every path is global: the GRH (in RoCEv2, the IP header) carries
the source and destination GIDs, and a GID is an IP address.  An AH or a
connected QP's ``ah_attr`` names the destination GID and the local GID index
in a ``GlobalRoute`` (``is_global=1``); the device resolves it when the AH is
created or the QP is modified (:func:`softverbs.device.core.resolve_route`).
Without a GRH (``is_global=0``) an address names a QP of the same device, as
an InfiniBand port addressing its own LID does.
"""

from __future__ import annotations

from typing import Any

from softverbs.device import ops, records
from softverbs.errors import PyverbsError, PyverbsUserError, einval
from softverbs.verbs.base import CStruct, PyverbsCM, PyverbsObject, require
from softverbs.verbs.gid import GID as GID
from softverbs.verbs.pd import PD
from softverbs.verbs.provider import destroy


def default_gid_index(ctx: Any, port: int = 1) -> int:
    """The GID index to use when none was asked for: RoCE needs a GID, so the
    first IPv4-mapped one (RoCEv2 over IPv4, what rxe's ``-g 1`` usually is),
    else the first one at all, else -1 (none).  ``ctx`` is an open Context."""
    first = -1
    for index in range(16):
        try:
            raw: bytes = ctx.query_gid(port, index).raw
        except PyverbsError:
            continue
        if not any(raw):
            continue
        if raw[:12] == b"\x00" * 10 + b"\xff\xff":
            return index
        if first < 0:
            first = index
    return first


class GlobalRoute(CStruct, PyverbsObject):
    """``ibv_global_route``."""

    _c_fields = {"flow_label": 32, "sgid_index": 8, "hop_limit": 8, "traffic_class": 8}

    def __init__(
        self,
        dgid: GID | None = None,
        flow_label: int = 0,
        sgid_index: int = 0,
        hop_limit: int = 1,
        traffic_class: int = 0,
    ) -> None:
        super().__init__()
        require(dgid, GID, "dgid", optional=True)
        self.dgid: GID = dgid if dgid is not None else GID()
        self.flow_label = flow_label
        self.sgid_index = sgid_index
        self.hop_limit = hop_limit
        self.traffic_class = traffic_class

    def __str__(self) -> str:
        return (
            f"{'DGID':<22}: {self.dgid}\n{'flow label':<22}: {self.flow_label}\n"
            f"{'sgid index':<22}: {self.sgid_index}\n{'hop limit':<22}: {self.hop_limit}\n"
            f"{'traffic class':<22}: {self.traffic_class}\n"
        )


class GRH(CStruct, PyverbsObject):
    """``ibv_grh``: the 40 bytes a UD receive gets before its payload."""

    _c_fields = {"version_tclass_flow": 32, "paylen": 16, "next_hdr": 8, "hop_limit": 8}

    def __init__(
        self,
        sgid: GID | None = None,
        dgid: GID | None = None,
        version_tclass_flow: int = 0,
        paylen: int = 0,
        next_hdr: int = 0,
        hop_limit: int = 1,
    ) -> None:
        super().__init__()
        for gid, what in ((sgid, "sgid"), (dgid, "dgid")):
            require(gid, GID, what, optional=True)
        self.sgid = sgid or GID()
        self.dgid = dgid or GID()
        self.version_tclass_flow = version_tclass_flow
        self.paylen = paylen
        self.next_hdr = next_hdr
        self.hop_limit = hop_limit


class AHAttr(CStruct, PyverbsObject):
    """``ibv_ah_attr``."""

    _c_fields = {"dlid": 16, "sl": 8, "src_path_bits": 8, "static_rate": 8, "is_global": 8,
                 "port_num": 8}  # fmt: skip

    def __init__(
        self,
        dlid: int = 0,
        sl: int = 0,
        src_path_bits: int = 0,
        static_rate: int = 0,
        is_global: int = 0,
        port_num: int = 1,
        gr: GlobalRoute | None = None,
    ) -> None:
        super().__init__()
        self.dlid = dlid
        self.sl = sl
        self.src_path_bits = src_path_bits
        self.static_rate = static_rate
        self.is_global = is_global
        self.port_num = port_num
        if is_global and gr is None:
            raise PyverbsUserError("Global AH Attr is created but gr parameter is None")
        self.gr: GlobalRoute = gr if gr is not None else GlobalRoute()

    # The GRH fields, flattened as pyverbs exposes them.
    @property
    def dgid(self) -> str | None:
        return str(self.gr.dgid) if self.is_global else None

    @dgid.setter
    def dgid(self, val: str) -> None:
        if self.is_global:
            self.gr.dgid = GID(val)

    @property
    def flow_label(self) -> int | None:
        return self.gr.flow_label if self.is_global else None

    @flow_label.setter
    def flow_label(self, val: int) -> None:
        self.gr.flow_label = val

    @property
    def sgid_index(self) -> int | None:
        return self.gr.sgid_index if self.is_global else None

    @sgid_index.setter
    def sgid_index(self, val: int) -> None:
        self.gr.sgid_index = val

    @property
    def hop_limit(self) -> int | None:
        return self.gr.hop_limit if self.is_global else None

    @hop_limit.setter
    def hop_limit(self, val: int) -> None:
        self.gr.hop_limit = val

    @property
    def traffic_class(self) -> int | None:
        return self.gr.traffic_class if self.is_global else None

    @traffic_class.setter
    def traffic_class(self, val: int) -> None:
        self.gr.traffic_class = val

    def __str__(self) -> str:
        s = (
            f"{'DLID':<22}: {self.dlid}\n{'SL':<22}: {self.sl}\n"
            f"{'Is global':<22}: {self.is_global}\n{'Port num':<22}: {self.port_num}\n"
        )
        return s + (str(self.gr) if self.is_global else "")


def av_of(attr: AHAttr) -> records.AddressVector:
    """``attr`` as the device's address vector record."""
    gr = attr.gr
    return records.AddressVector(gr.dgid.raw, attr.dlid, attr.sl, attr.src_path_bits,
                             attr.static_rate, attr.is_global, attr.port_num, gr.flow_label,
                             gr.sgid_index, gr.hop_limit, gr.traffic_class)  # fmt: skip


def ah_attr_of(av: records.AddressVector) -> AHAttr:
    """The inverse of :func:`av_of`."""
    gr = GlobalRoute(dgid=GID.from_raw(av.dgid), flow_label=av.flow_label,
                     sgid_index=av.sgid_index, hop_limit=av.hop_limit,
                     traffic_class=av.traffic_class)  # fmt: skip
    return AHAttr(dlid=av.dlid, sl=av.sl, src_path_bits=av.src_path_bits,
                  static_rate=av.static_rate, is_global=av.is_global, port_num=av.port_num,
                  gr=gr)  # fmt: skip


class AH(PyverbsCM):
    """An address handle: ``AH(pd, attr=AHAttr(...))``."""

    close_rank = 20

    def __init__(self, pd: PD, **kwargs: Any) -> None:
        super().__init__()
        require(pd, PD, "pd")
        attr = kwargs.get("attr")
        if attr is None:
            wc = kwargs.get("wc")
            grh = kwargs.get("grh")
            if wc is None:
                raise PyverbsUserError("AH needs attr=AHAttr(...) or wc=, grh=, port_num=")
            attr = _attr_from_wc(wc, grh, kwargs.get("port_num", 1), pd.ctx.provider.gids)
        require(attr, AHAttr, "attr")
        self.pd = pd
        self._ctx = pd.ctx
        self.attr = attr
        body = records.CreateAH(av_of(attr), pd.device_pd, 0)
        self.dev_handle: int = pd.ctx.provider.call(ops.CREATE_AH, body).handle
        pd.add_ref(self)

    def _release(self) -> None:
        destroy(self._ctx.provider, records.KIND_AH, self.dev_handle)


def _attr_from_wc(wc: Any, grh: Any, port_num: int, gids: list[bytes] | None = None) -> AHAttr:
    """``ibv_create_ah_from_wc``: reply to the sender of a UD receive.

    ``grh`` is a GRH, its 40 bytes, or -- as pyverbs passes it -- the address
    of the receive buffer that holds them.  The local GID is the one the
    message was sent to (the GRH's destination), found in the GID table.
    """
    if isinstance(grh, int) and not isinstance(grh, bool):
        import ctypes

        from softverbs.device.memory import mapped

        if not grh or not mapped(grh, 40):
            raise einval(f"create_ah_from_wc: no GRH at address {grh:#x}")
        grh = ctypes.string_at(grh, 40)
    if isinstance(grh, GRH):
        sgid, dgid = grh.sgid, grh.dgid
    elif isinstance(grh, (bytes, bytearray, memoryview)) and len(grh) >= 40:
        raw = bytes(grh[:40])
        v6 = raw[0] >> 4 == 6
        sgid = GID.from_raw(raw[8:24] if v6 else b"\x00" * 10 + b"\xff\xff" + raw[32:36])
        dgid = GID.from_raw(raw[24:40] if v6 else b"\x00" * 10 + b"\xff\xff" + raw[36:40])
    else:
        raise einval("create_ah_from_wc needs the 40-byte GRH of the received message")
    index = gids.index(dgid.raw) if gids and dgid.raw in gids else 1
    return AHAttr(is_global=1, port_num=port_num, gr=GlobalRoute(dgid=sgid, sgid_index=index))
