"""The service's one-unpack reading of a DOORBELL agrees with the general decode."""

from __future__ import annotations

import struct

import pytest

from softverbs.device import ops, protocol, records


def _doorbell(qp: int = 3, queue: int = records.DB_SQ, **header: int) -> bytes:
    data = bytearray(protocol.encode(ops.DOORBELL, 7, records.Doorbell(qp, queue)))
    fields = {"length": 0, "op": 4, "flags": 6, "seq": 8, "status": 12}
    for name, value in header.items():
        fmt = "<H" if name in ("op", "flags") else ("<i" if name == "status" else "<I")
        struct.pack_into(fmt, data, fields[name], value)
    return bytes(data)


def test_a_well_formed_doorbell_is_read_as_decode_reads_it() -> None:
    for qp, queue in ((3, records.DB_SQ), (0xFFFFFFFF, records.DB_RQ), (0, 9)):
        data = _doorbell(qp, queue)
        msg = protocol.decode(data)
        assert msg.op is ops.DOORBELL
        assert protocol.decode_doorbell(data) == (msg.body.qp, msg.body.queue) == (qp, queue)


@pytest.mark.parametrize("change", [
    {"op": ops.ALLOC_PD.code}, {"flags": protocol.FLAG_REPLY}, {"flags": 4},
    {"status": 5}, {"length": 23}, {"length": 25},
])  # fmt: skip
def test_anything_else_is_left_to_decode(change: dict[str, int]) -> None:
    data = _doorbell(**change)
    assert protocol.decode_doorbell(data) is None
    if "op" not in change:
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(data)


def test_a_doorbell_of_another_length_is_left_to_decode() -> None:
    data = _doorbell()
    for bad in (data[:-1], data + b"\0", b""):
        assert protocol.decode_doorbell(bad) is None
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(bad)
