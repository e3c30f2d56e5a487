"""The opcode table: each record's derived facts agree with its position and
headers, and a few records are the spec's (IBA table 38, the RoCEv2 CNP)."""

from __future__ import annotations

from softverbs.wire.opcodes import (
    CNP_OPCODE,
    FIRST,
    LAST,
    ONLY,
    OPINFO,
    Hdr,
    Kind,
    Op,
    OpInfo,
    Transport,
    opcode,
)


def test_every_record_derives_its_flags_from_position_and_headers() -> None:
    infos = [(code, info) for code, info in enumerate(OPINFO) if info is not None]
    assert len(infos) == 23 + 23 + 12 + 2 + 1  # RC, XRC, UC (SEND, WRITE), UD, the CNP
    for code, info in infos:
        assert isinstance(info, OpInfo)
        assert info.opcode == code
        assert info.first == bool(info.position & FIRST)
        assert info.last == bool(info.position & LAST)
        assert info.imm == bool(info.hdrs & Hdr.IMMDT)
        assert info.inv == bool(info.hdrs & Hdr.IETH)
        assert isinstance(info.first, bool) and isinstance(info.request, bool)
        assert info.name in repr(info)


def test_records_the_spec_defines() -> None:
    send = OPINFO[opcode(Transport.RC, Op.SEND_ONLY)]
    assert send is not None and send.opcode == 0x04 and send.name == "RC_SEND_ONLY"
    assert send.kind is Kind.SEND and send.transport is Transport.RC and send.op is Op.SEND_ONLY
    assert send.position == ONLY and send.payload and send.request and send.hdrs == Hdr(0)
    ack = OPINFO[opcode(Transport.RC, Op.ACKNOWLEDGE)]
    assert ack is not None and ack.opcode == 0x11 and not ack.request and not ack.payload
    assert ack.hdrs == Hdr.AETH and ack.kind is Kind.ACK
    ud = OPINFO[opcode(Transport.UD, Op.SEND_ONLY_WITH_IMMEDIATE)]
    assert ud is not None and ud.hdrs == Hdr.DETH | Hdr.IMMDT and ud.imm and not ud.inv
    xrc = OPINFO[opcode(Transport.XRC, Op.RDMA_WRITE_FIRST)]
    assert xrc is not None and xrc.hdrs == Hdr.XRCETH | Hdr.RETH and xrc.first and not xrc.last
    cnp = OPINFO[CNP_OPCODE]
    assert cnp is not None and cnp.kind is Kind.CNP and cnp.name == "CNP" and not cnp.request
    assert OPINFO[opcode(Transport.UC, Op.SEND_MIDDLE)] is not None
    assert OPINFO[Transport.UD | Op.RDMA_WRITE_ONLY] is None
