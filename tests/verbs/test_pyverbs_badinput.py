"""Bad input to the pyverbs surface raises pyverbs' errors, never a bare exception.

Every constructor and method of the compat tree (``pyverbs.device``, ``.pd``,
``.mr``, ``.cq``, ``.qp``, ``.wr``, ``.addr``, ``.srq``, ``.xrcd``, ``.wq``,
``.flow``, ``.spec``, ``.mem_alloc`` ...) is called with each argument in turn
replaced by a wrong type or an out-of-range value.  Whatever happens must be
either success (pyverbs passes Python numbers to C, so a float count is
truncated, and many setters accept any int) or a ``PyverbsUserError`` /
``PyverbsRDMAError`` -- never a ``TypeError``, ``AttributeError``,
``OverflowError``, ``ValueError`` ... from deep inside softverbs.  Objects
built from bad values are then *used* (a QP is created from a bad ``QPCap``,
a bad ``SGE`` is posted), so a bad value cannot slip through construction and
blow up later either.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from softverbs.compat.pyverbs import (
    addr,
    cq,
    device,
    dmabuf,
    flow,
    mem_alloc,
    mr,
    pd,
    qp,
    spec,
    srq,
    wq,
    wr,
    xrcd,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_FLOW_SPEC_UDP,
    IBV_QP_STATE,
    IBV_QPS_INIT,
    IBV_QPT_RC,
    IBV_QPT_UD,
    IBV_REREG_MR_CHANGE_ACCESS,
    IBV_SRQ_LIMIT,
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
)
from softverbs.errors import PyverbsError, PyverbsRDMAError, PyverbsUserError

#: Wrong types and out-of-range values, each tried in every argument position.
BAD: list[Any] = [None, "x", -1, 1 << 70, 1.5, float("nan"), object(), b"\x00", [], True]


@dataclass
class Res:
    ctx: Any
    pd: Any
    cq: Any
    mr: Any
    qp: Any
    ud: Any
    srq: Any


@pytest.fixture
def r() -> Iterator[Res]:
    ctx = device.Context(name="sv0")
    p = pd.PD(ctx)
    c = cq.CQ(ctx, 16)
    m = mr.MR(p, 4096, IBV_ACCESS_LOCAL_WRITE)
    q = qp.QP(p, qp.QPInitAttr(qp_type=IBV_QPT_RC, scq=c, rcq=c, cap=qp.QPCap(4, 4)),
              qp.QPAttr())  # fmt: skip
    u = qp.QP(p, qp.QPInitAttr(qp_type=IBV_QPT_UD, scq=c, rcq=c, cap=qp.QPCap(4, 4)),
              qp.QPAttr())  # fmt: skip
    s = srq.SRQ(p, srq.SrqInitAttr(srq.SrqAttr(8, 1)))
    yield Res(ctx, p, c, m, q, u, s)
    ctx.close()


def _sge(r: Res) -> Any:
    return wr.SGE(r.mr.buf, 64, r.mr.lkey)


# Each case: the call with its arguments, as a list the test corrupts one at a time.
# ``Call(fn, args, then)``: ``fn(*args)``; ``then(result)`` uses what was built.
@dataclass
class Call:
    fn: Callable[..., Any]
    args: list[Any]
    then: Callable[[Any], Any] | None = None


def _use_cap(r: Res) -> Callable[[Any], Any]:
    return lambda cap: qp.QP(r.pd, qp.QPInitAttr(qp_type=IBV_QPT_RC, scq=r.cq, rcq=r.cq, cap=cap))


def _use_init(r: Res) -> Callable[[Any], Any]:
    return lambda init: qp.QP(r.pd, init)


def _use_qp_attr(r: Res) -> Callable[[Any], Any]:
    def then(attr: Any) -> Any:
        r.qp.modify(attr, IBV_QP_STATE)
        return r.qp.to_rts(attr)

    return then


def _use_send(r: Res) -> Callable[[Any], Any]:
    def then(send: Any) -> Any:
        r.qp.modify(qp.QPAttr(qp_state=0), IBV_QP_STATE)  # RESET: posting is EINVAL, not a crash
        return r.qp.post_send(send)

    return then


def _use_recv(r: Res) -> Callable[[Any], Any]:
    return lambda recv: r.qp.post_recv(recv)


def _use_ah_attr(r: Res) -> Callable[[Any], Any]:
    return lambda attr: addr.AH(r.pd, attr=attr)


def _use_srq_attr(r: Res) -> Callable[[Any], Any]:
    return lambda attr: srq.SRQ(r.pd, srq.SrqInitAttr(attr))


#: a descriptor the cases may pass where a verb takes one (opened once: each test
#: builds the cases dozens of times, and a descriptor per build ran the test
#: process past select()'s limit of 1024)
_DEVNULL = os.open(os.devnull, os.O_RDONLY)


# fmt: off
def cases(r: Res) -> dict[str, Call]:
    gid = r.ctx.query_gid(1, 0)
    fd = _DEVNULL
    return {
        # pyverbs.device
        "Context.query_port": Call(r.ctx.query_port, [1]),
        "Context.query_gid": Call(r.ctx.query_gid, [1, 0]),
        "Context.query_gid_type": Call(r.ctx.query_gid_type, [1, 0]),
        "Context.query_pkey": Call(r.ctx.query_pkey, [1, 0]),
        "Context.get_pkey_index": Call(r.ctx.get_pkey_index, [1, 0xFFFF]),
        "Context.query_gid_table": Call(r.ctx.query_gid_table, [16, 0]),
        "Context.query_gid_ex": Call(r.ctx.query_gid_ex, [1, 0, 0]),
        "Context.query_device_ex": Call(r.ctx.query_device_ex, [None]),
        "Context(name)": Call(lambda n: device.Context(name=n), ["sv0"], lambda c: c.close()),
        "Context(cmd_fd)": Call(lambda f: device.Context(cmd_fd=f), [-1]),
        "AllocDmAttr+DM": Call(device.AllocDmAttr, [64, 0, 0], lambda a: device.DM(r.ctx, a)),
        "DM": Call(device.DM, [r.ctx, device.AllocDmAttr(64)]),
        "DM.copy_to_dm": Call(lambda o, d, n: device.DM(r.ctx, device.AllocDmAttr(64))
                              .copy_to_dm(o, d, n), [0, b"abcd", 4]),
        "DM.copy_from_dm": Call(lambda o, n: device.DM(r.ctx, device.AllocDmAttr(64))
                                .copy_from_dm(o, n), [0, 4]),
        "QueryDeviceExInput": Call(device.QueryDeviceExInput, [0],
                                   lambda i: r.ctx.query_device_ex(i)),
        "FdArr": Call(device.FdArr, [[fd], 1]),
        # pyverbs.pd
        "PD": Call(pd.PD, [r.ctx]),
        "PD(handle)": Call(lambda h: pd.PD(r.ctx, handle=h), [1]),
        "PD.advise_mr": Call(r.pd.advise_mr, [0, 0, [_sge(r)]]),
        "ParentDomainInitAttr": Call(pd.ParentDomainInitAttr, [r.pd, None],
                                     lambda a: pd.ParentDomain(r.ctx, a)),
        "ParentDomain": Call(pd.ParentDomain, [r.ctx, pd.ParentDomainInitAttr(r.pd)]),
        "ParentDomainContext": Call(pd.ParentDomainContext, [r.pd, len, len, None]),
        # pyverbs.mr
        "MR": Call(mr.MR, [r.pd, 64, IBV_ACCESS_LOCAL_WRITE, None, False]),
        "MR(address)": Call(lambda a: mr.MR(r.pd, 64, IBV_ACCESS_LOCAL_WRITE, address=a),
                            [r.mr.buf]),
        "MR.write": Call(r.mr.write, [b"abcd", 4, 0]),
        "MR.read": Call(r.mr.read, [4, 0]),
        "MR.rereg": Call(r.mr.rereg, [IBV_REREG_MR_CHANGE_ACCESS, None, 0, 0,
                                      IBV_ACCESS_LOCAL_WRITE]),
        "MW": Call(mr.MW, [r.pd, 2]),
        "MWBindInfo": Call(mr.MWBindInfo, [r.mr, r.mr.buf, 64, 0],
                           lambda i: r.qp.bind_mw(mr.MW(r.pd, 1), mr.MWBind(i, 0))),
        "MWBind": Call(mr.MWBind, [mr.MWBindInfo(r.mr, r.mr.buf, 64, 0), 0, 0]),
        "DMMR": Call(lambda p, n, a, o: mr.DMMR(p, n, a, device.DM(r.ctx, device.AllocDmAttr(64)),
                                                o),
                     [r.pd, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED, 0]),
        "DmaBufMR": Call(mr.DmaBufMR, [r.pd, 64, 0]),
        "DmaBuf": Call(dmabuf.DmaBuf, [64]),
        # pyverbs.cq
        "CompChannel": Call(cq.CompChannel, [r.ctx]),
        "CQ": Call(cq.CQ, [r.ctx, 8, None, None, 0]),
        "CQ.poll": Call(r.cq.poll, [1]),
        "CQ.resize": Call(r.cq.resize, [16]),
        "CQ.req_notify": Call(r.cq.req_notify, [False]),
        "CqInitAttrEx": Call(cq.CqInitAttrEx, [8, None, 0, 0, 0, 0, None],
                             lambda a: cq.CQEX(r.ctx, a)),
        "CQEX": Call(cq.CQEX, [r.ctx, cq.CqInitAttrEx(8)]),
        "CQEX.start_poll": Call(cq.CQEX(r.ctx, cq.CqInitAttrEx(8)).start_poll, [None]),
        # pyverbs.qp
        "QPCap": Call(qp.QPCap, [4, 4, 1, 1, 0], _use_cap(r)),
        "QPInitAttr": Call(qp.QPInitAttr, [IBV_QPT_RC, None, r.cq, r.cq, None, qp.QPCap(4, 4), 1],
                           _use_init(r)),
        "QPInitAttrEx": Call(lambda t, c, p, m: qp.QPInitAttrEx(qp_type=t, scq=r.cq, rcq=r.cq,
                                                                cap=c, pd=p, comp_mask=m),
                             [IBV_QPT_RC, qp.QPCap(4, 4), r.pd, 1],
                             lambda a: qp.QP(r.ctx, a)),
        "QPAttr": Call(qp.QPAttr, [IBV_QPS_INIT, 0, 1, 3], _use_qp_attr(r)),
        "QP": Call(qp.QP, [r.pd, qp.QPInitAttr(qp_type=IBV_QPT_RC, scq=r.cq, rcq=r.cq,
                                               cap=qp.QPCap(4, 4)), qp.QPAttr()]),
        "QP.modify": Call(r.qp.modify, [qp.QPAttr(), IBV_QP_STATE]),
        "QP.query": Call(r.qp.query, [0]),
        "QP.post_send": Call(r.qp.post_send, [wr.SendWR(num_sge=1, sg=[_sge(r)]), None]),
        "QP.post_recv": Call(r.qp.post_recv, [wr.RecvWR(num_sge=1, sg=[_sge(r)]), None]),
        "QP.bind_mw": Call(r.qp.bind_mw, [mr.MW(r.pd, 1), mr.MWBind(
            mr.MWBindInfo(r.mr, r.mr.buf, 64, 0), 0)]),
        "QP.set_ece": Call(r.qp.set_ece, [qp.ECE()]),
        "QP.query_data_in_order": Call(r.qp.query_data_in_order, [0, 0]),
        "ECE": Call(qp.ECE, [0, 0, 0], lambda e: r.qp.set_ece(e)),
        "DataBuffer": Call(qp.DataBuffer, [r.mr.buf, 8]),
        # pyverbs.wr
        "SGE": Call(wr.SGE, [r.mr.buf, 64, r.mr.lkey],
                    lambda s: r.qp.post_recv(wr.RecvWR(num_sge=1, sg=[s]))),
        "SGE.read": Call(_sge(r).read, [4, 0]),
        "RecvWR": Call(wr.RecvWR, [1, 1, [_sge(r)], None], _use_recv(r)),
        "SendWR": Call(wr.SendWR, [1, 0, 1, 0, [_sge(r)], 2, None], _use_send(r)),
        "SendWR.set_wr_ud": Call(wr.SendWR(num_sge=1, sg=[_sge(r)]).set_wr_ud,
                                 [addr.AH(r.pd, attr=addr.AHAttr(is_global=1, gr=addr.GlobalRoute(
                                     dgid=gid))), 1, 1]),
        "SendWR.set_wr_rdma": Call(wr.SendWR(num_sge=1, sg=[_sge(r)]).set_wr_rdma, [1, 0],
                                   lambda _: None),
        # pyverbs.addr
        "GID": Call(addr.GID, ["fe80::1"]),
        "GlobalRoute": Call(addr.GlobalRoute, [gid, 0, 0, 1, 0],
                            lambda g: addr.AH(r.pd, attr=addr.AHAttr(is_global=1, gr=g))),
        "AHAttr": Call(lambda d, s, b, rate, g, port: addr.AHAttr(d, s, b, rate, g, port,
                                                                   addr.GlobalRoute(dgid=gid)),
                       [0, 0, 0, 0, 1, 1], _use_ah_attr(r)),
        "AH": Call(lambda p, a: addr.AH(p, attr=a),
                   [r.pd, addr.AHAttr(is_global=1, gr=addr.GlobalRoute(dgid=gid))]),
        "GRH": Call(addr.GRH, [gid, gid, 0, 0, 0, 1]),
        # pyverbs.srq
        "SrqAttr": Call(srq.SrqAttr, [8, 1, 0], _use_srq_attr(r)),
        "SrqInitAttr": Call(srq.SrqInitAttr, [srq.SrqAttr(8, 1)],
                            lambda a: srq.SRQ(r.pd, a)),
        "SrqInitAttrEx": Call(srq.SrqInitAttrEx, [8, 1, 0], lambda a: srq.SRQ(r.ctx, a)),
        "SRQ": Call(srq.SRQ, [r.pd, srq.SrqInitAttr(srq.SrqAttr(8, 1))]),
        "SRQ.modify": Call(r.srq.modify, [srq.SrqAttr(8, 1, 1), IBV_SRQ_LIMIT]),
        "SRQ.post_recv": Call(r.srq.post_recv, [wr.RecvWR(num_sge=1, sg=[_sge(r)]), None]),
        "OpsWr": Call(srq.OpsWr, [0, 0, 1, None, 0, 0, None, 0, 0, None],
                      lambda w: r.srq.post_srq_ops(w)),
        # pyverbs.xrcd
        "XRCDInitAttr": Call(xrcd.XRCDInitAttr, [IBV_XRCD_INIT_ATTR_FD
                                                 | IBV_XRCD_INIT_ATTR_OFLAGS, os.O_CREAT, -1],
                             lambda a: xrcd.XRCD(r.ctx, a)),
        # pyverbs.wq / flow / spec
        "WQInitAttr": Call(wq.WQInitAttr, [None, r.pd, r.cq, 0, 8, 1, 0, 0],
                           lambda a: wq.WQ(r.ctx, a)),
        "WQAttr": Call(wq.WQAttr, [0, 0, 0, 0, 0]),
        "RwqIndTableInitAttr": Call(wq.RwqIndTableInitAttr, [5, [], 0]),
        "RxHashConf": Call(wq.RxHashConf, [0, 0, None, 0]),
        "FlowAttr": Call(flow.FlowAttr, [0, 0, 0, 1, 0], lambda a: flow.Flow(r.qp, a)),
        "EthSpec": Call(spec.EthSpec, ["01:02:03:04:05:06", None, None, None, 0x800]),
        "Ipv4ExtSpec": Call(spec.Ipv4ExtSpec, ["1.2.3.4", None, "5.6.7.8"]),
        "Ipv6Spec": Call(spec.Ipv6Spec, ["::1", None, "::2"]),
        "TcpUdpSpec": Call(spec.TcpUdpSpec, [IBV_FLOW_SPEC_UDP, 1, None, 2]),
        # pyverbs.mem_alloc
        "posix_memalign": Call(mem_alloc.posix_memalign, [64, 8], mem_alloc.free),
        "mem_alloc.read": Call(mem_alloc.read, [r.mr.buf, 4, 0]),
        "mem_alloc.write": Call(mem_alloc.write, [r.mr.buf, b"abcd", 4, 0]),
        "mem_alloc.writebe32": Call(mem_alloc.writebe32, [r.mr.buf, 1, 0]),
        "mem_alloc.read64": Call(mem_alloc.read64, [r.mr.buf, 0]),
    }


# fmt: on


#: Cases where pyverbs' own contract is another exception: its ``mem_alloc``
#: allocators raise ``MemoryError('Failed to allocate memory')`` when the C
#: allocator refuses, and softverbs' do the same.
ALLOWED: dict[str, tuple[type[BaseException], ...]] = {"posix_memalign": (MemoryError,)}


def _names() -> list[str]:
    ctx = device.Context(name="sv0")
    try:
        p = pd.PD(ctx)
        c = cq.CQ(ctx, 4)
        m = mr.MR(p, 64, IBV_ACCESS_LOCAL_WRITE)
        init = qp.QPInitAttr(qp_type=IBV_QPT_RC, scq=c, rcq=c, cap=qp.QPCap(1, 1))
        u = qp.QPInitAttr(qp_type=IBV_QPT_UD, scq=c, rcq=c, cap=qp.QPCap(1, 1))
        res = Res(ctx, p, c, m, qp.QP(p, init), qp.QP(p, u),
                  srq.SRQ(p, srq.SrqInitAttr(srq.SrqAttr(2, 1))))  # fmt: skip
        return sorted(cases(res))
    finally:
        ctx.close()


def _outcome(call: Call) -> BaseException | None:
    try:
        built = call.fn(*call.args)
        if call.then is not None:
            call.then(built)
    except PyverbsError as exc:
        return exc
    return None


@pytest.mark.parametrize("name", _names())
def test_every_bad_argument_raises_a_pyverbs_error(r: Res, name: str) -> None:
    good = cases(r)[name]
    assert _outcome(good) is None or isinstance(_outcome(good), PyverbsError)
    wrong: list[str] = []
    for index in range(len(good.args)):
        for bad in BAD:
            call = cases(r)[name]
            call.args[index] = bad
            try:
                _outcome(call)
            except Exception as exc:  # anything not a PyverbsError escaped
                if not isinstance(exc, ALLOWED.get(name, ())):
                    wrong.append(f"arg {index} = {bad!r}: {type(exc).__name__}: {exc}")
    assert not wrong, f"{name}:\n" + "\n".join(wrong)


def test_pyverbs_error_kinds() -> None:
    """Type errors are PyverbsUserError; value errors a verb would refuse are
    PyverbsRDMAError with the errno pyverbs reports."""
    ctx = device.Context(name="sv0")
    try:
        with pytest.raises(PyverbsUserError):
            cq.CQ(ctx, "many")  # type: ignore[arg-type]
        with pytest.raises(PyverbsRDMAError) as info:
            cq.CQ(ctx, 1 << 40)
        assert info.value.error_code == errno.EINVAL
        with pytest.raises(PyverbsUserError):
            pd.PD("not a context")
        with pytest.raises(PyverbsRDMAError) as info:
            ctx.query_port(7)
        assert info.value.error_code == errno.EINVAL
        assert "Failed to query port" in str(info.value)
    finally:
        ctx.close()


def _vendor_names() -> list[tuple[str, str]]:
    from softverbs.compat.vendor_dv import efa as efa_vendor
    from softverbs.compat.vendor_dv import mlx5 as mlx5_vendor

    out = [(f"mlx5.{m}", n) for m in mlx5_vendor.MODULES for n in mlx5_vendor.module_names(m)]
    return out + [("efa.efadv", n) for n in efa_vendor.module_names()]


@pytest.mark.parametrize(("module", "name"), _vendor_names())
def test_vendor_names_refuse_with_pyverbs_errors(module: str, name: str) -> None:
    """mlx5/EFA classes and helpers, fed anything: a pyverbs error or an attribute holder."""
    from softverbs.compat.vendor_dv import efa as efa_vendor
    from softverbs.compat.vendor_dv import mlx5 as mlx5_vendor

    table = (efa_vendor.module_names() if module == "efa.efadv"
             else mlx5_vendor.module_names(module.split(".", 1)[1]))  # fmt: skip
    obj: Any = table[name]
    for args in ([], *([b] for b in BAD)):
        try:
            made = obj(*args)
        except PyverbsError:
            continue
        if name == "EfaContext":
            pytest.fail("EfaContext opened a device named by a bad value")  # pragma: no cover
        if isinstance(made, PyverbsError):  # pragma: no cover
            continue
        assert isinstance(type(obj), type), f"{name} is a function that returned {made!r}"


@pytest.mark.parametrize(("field", "bits"), [("wr_id", 64), ("opcode", 32), ("remote_addr", 64)])
def test_a_c_member_takes_exactly_what_its_c_type_holds(field: str, bits: int) -> None:
    """The checked fast path of CStruct.__setattr__ keeps as_uint's rules: any
    int in range (a bool is one, stored as an int), nothing else."""
    w = wr.SendWR(opcode=0, num_sge=1, sg=[wr.SGE(0, 0, 0)])
    for good in (0, (1 << bits) - 1, True):
        setattr(w, field, good)
        assert getattr(w, field) == int(good) and type(getattr(w, field)) is int
    for bad in (-1, 1 << bits, 1.0, "1", None):
        with pytest.raises(PyverbsUserError, match=field):
            setattr(w, field, bad)
    attr = qp.QPInitAttr()
    for good in (-(1 << 31), (1 << 31) - 1):
        attr.sq_sig_all = good  # a signed int member
    for bad in (1 << 31, -(1 << 31) - 1, 0.5):
        with pytest.raises(PyverbsUserError, match="sq_sig_all"):
            attr.sq_sig_all = bad
