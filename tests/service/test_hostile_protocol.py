"""softverbsd against a client written from the documents alone (``rawclient``).

Each test drives the service through :mod:`rawclient` -- which imports no
softverbs protocol code -- with one kind of bad or extreme input that
docs/service-protocol.md and docs/rings.md say how the service answers,
and checks that answer, and that the service goes on serving (the
``service`` fixture fails a test whose service died or logged an internal
error).
"""

from __future__ import annotations

import errno

import pytest
import rawclient as rc
from svkit import ServiceProc

from softverbs.enums import IBV_QP_STATE, IBV_QPS_ERR, IBV_QPT_RC, IBV_WC_WR_FLUSH_ERR


def _client(service: ServiceProc, **hello: object) -> rc.RawClient:
    c = rc.RawClient(service.path)
    c.hello(**hello)  # type: ignore[arg-type]
    return c


def _expect_eproto(c: rc.RawClient, op: int, body: bytes, **header: object) -> str:
    """Send one bad message: the reply is EPROTO (naming it) and the connection closes."""
    with pytest.raises(rc.Refused) as refused:
        c.call(op, body, **header)  # type: ignore[arg-type]
    assert refused.value.errno == errno.EPROTO, refused.value
    assert c.closed(), "the service kept a connection that sent a malformed message"
    return refused.value.message


# --- a doorbell in ERR flushes at most one ring's worth -------------------------------------


def test_doorbell_in_err_flushes_one_ring(service: ServiceProc) -> None:
    """rings.md: the device takes min(db, pi, seen + size) per doorbell, so a
    driver lying about ``pi``/``db`` on a 16-slot receive queue of a QP in ERR
    gets at most 16 flushed CQEs per doorbell -- never 32."""
    with _client(service) as c:
        ctx = c.open_device()
        pd = c.alloc_pd(ctx)
        cq, cring = c.create_cq(ctx, 256)
        rep, _sq, rq = c.create_qp(ctx, pd, cq, IBV_QPT_RC, max_send_wr=1, max_recv_wr=16)
        assert rq is not None and rq.size == 16
        assert c.modify_qp(rep["qp"], IBV_QP_STATE, qp_state=IBV_QPS_ERR) == IBV_QPS_ERR
        rq.set(rc.RQ_PI, 100)  # a lie: at most 16 can be outstanding
        rq.set(rc.RQ_DB, 100)
        counts, wr_ids = [], []
        for rnd in range(3):
            for i in range(16 * rnd, 16 * rnd + 16):  # what the device reads next
                rq.write(i, rc.RecvWQEHeader.pack(wr_id=i, num_sge=0))
            c.doorbell(rep["qp"], rc.DB_RQ)
            c.status()  # a round trip: the doorbell before it was served
            cqes = rc.poll_cq(cring)
            assert all(e["status"] == IBV_WC_WR_FLUSH_ERR for e in cqes), cqes
            counts.append(len(cqes))
            wr_ids += [e["wr_id"] for e in cqes]
        assert counts == [16, 16, 16], f"flushed per doorbell: {counts}"
        assert wr_ids == list(range(48)), "flushed out of order or twice"
