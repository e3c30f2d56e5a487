"""The verbs records on the post and poll path: ``SGE``, ``SendWR``, ``RecvWR``, ``WC``.

Their constructors fill the fields without going through
``CStruct.__setattr__`` and ``poll`` fills a ``WC`` straight from the engine's
CQE (an extension type when compiled); these tests hold both to what an
assignment and the pyverbs classes do.  The suite runs them compiled and
with ``SOFTVERBS_PURE=1``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from softverbs import compiled
from softverbs import enums as e
from softverbs.engine.rings import CQE
from softverbs.errors import PyverbsUserError
from softverbs.verbs.base import PyverbsObject
from softverbs.verbs.cq import WC, be32_field
from softverbs.verbs.wr import SGE, RecvWR, SendWR

_S = SGE(0x1000, 64, 7)

#: (record, member, bits): a constructor that sets that member to the value given
MEMBERS: list[tuple[str, Callable[[Any], object], str, int]] = [
    ("SGE", lambda v: SGE(v, 1, 1), "addr", 64),
    ("SGE", lambda v: SGE(1, v, 1), "length", 32),
    ("SGE", lambda v: SGE(1, 1, v), "lkey", 32),
    ("RecvWR", lambda v: RecvWR(v, 1, [_S]), "wr_id", 64),
    ("SendWR", lambda v: SendWR(v, e.IBV_WR_SEND, 1, sg=[_S]), "wr_id", 64),
    ("SendWR", lambda v: SendWR(1, v, 1, sg=[_S]), "opcode", 32),
    ("SendWR", lambda v: SendWR(1, e.IBV_WR_SEND, 1, v, [_S]), "imm_data", 32),
    ("SendWR", lambda v: SendWR(1, e.IBV_WR_SEND, 1, sg=[_S], send_flags=v), "send_flags", 32),
]


@pytest.mark.parametrize(("cls", "make", "field", "bits"), MEMBERS,
                         ids=[f"{c}.{f}" for c, _, f, _ in MEMBERS])  # fmt: skip
def test_a_constructor_takes_what_an_assignment_takes(
    cls: str, make: Callable[[Any], object], field: str, bits: int
) -> None:
    """Any int the C member holds (a bool or an IntEnum stored as a plain int),
    and nothing else: PyverbsUserError naming the record and the member."""
    for good in (0, (1 << bits) - 1, True, e.IBV_WR_SEND):
        rec = make(good)
        assert getattr(rec, field) == int(good) and type(getattr(rec, field)) is int
    for bad in (-1, 1 << bits, 1.0, "1", None):
        with pytest.raises(PyverbsUserError, match=rf"{cls}\.{field}"):
            make(bad)
        rec = make(0)
        with pytest.raises(PyverbsUserError, match=rf"{cls}\.{field}"):
            setattr(rec, field, bad)  # the assignment says the same


def test_a_wr_keeps_a_copy_of_its_sge_list() -> None:
    a, b = SGE(1, 2, 3), SGE(4, 5, 6)
    sg = [a, b]
    w = RecvWR(1, 2, sg)
    assert w.sg == sg and w.sg is not sg and w.num_sge == 2
    sg.append(SGE(7, 8, 9))  # the caller's list is the caller's
    assert w.num_sge == 2
    assert RecvWR(1, 1, [a, b]).sg == [a]  # num_sge takes the first entries
    assert SendWR(1, e.IBV_WR_SEND, 1, sg=a).sg == [a]  # one SGE, not in a list
    with pytest.raises(PyverbsUserError, match="SGE list entries must be SGE objects"):
        RecvWR(1, 2, [a, (4, 5, 6)])
    with pytest.raises(PyverbsUserError, match="num_sge is 3 but the SGE list has 2"):
        RecvWR(1, 3, [a, b])


def _cqe(**fields: int) -> CQE:
    cqe = CQE(0x1234, e.IBV_WC_SUCCESS, e.IBV_WC_RECV, 0x11, 64)
    for name, value in fields.items():
        setattr(cqe, name, value)
    return cqe


def test_a_wc_is_the_pyverbs_record() -> None:
    wc = WC.from_cqe(_cqe(src_qp=5, sl=2, slid=9))
    assert isinstance(wc, PyverbsObject)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.qp_num) == (
        0x1234, e.IBV_WC_SUCCESS, e.IBV_WC_RECV, 64, 0x11)  # fmt: skip
    assert (wc.src_qp, wc.sl, wc.slid, wc.pkey_index, wc.dlid_path_bits) == (5, 2, 9, 0, 0)
    assert wc.reason == "" and wc.vendor_err == 0 and wc.wc_flags == 0
    assert repr(wc) == "WC(wr_id=4660, status='success', opcode=128, byte_len=64, qp_num=0x11)"
    wc.status = e.IBV_WC_WR_FLUSH_ERR  # an application may edit its WCs, as in pyverbs
    assert wc.status == e.IBV_WC_WR_FLUSH_ERR
    made = WC(wr_id=3, byte_len=8)
    assert (made.wr_id, made.byte_len, made.reason) == (3, 8, "")


def test_a_wc_imm_data_is_the_be32_member_and_inv_rkey_is_host_order() -> None:
    imm = WC.from_cqe(_cqe(imm=0x01020304, wc_flags=e.IBV_WC_WITH_IMM))
    assert imm.imm_data == be32_field(0x01020304)
    inv = WC.from_cqe(_cqe(imm=0x01020304, wc_flags=e.IBV_WC_WITH_INV))
    assert inv.imm_data == inv.invalidated_rkey == 0x01020304


def test_from_cqe_makes_the_class_it_is_called_on() -> None:
    class MyWC(WC):
        pass

    wc = MyWC.from_cqe(_cqe())
    assert type(wc) is MyWC and wc.wr_id == 0x1234


#: every record's logger after a real SEND on a simulated pair, ``poll``'s WCs included
LOGGER_PROBE = """
import json, logging, softverbs
from softverbs import testing
from softverbs.verbs.cq import WC
from softverbs.verbs.wr import SGE, RecvWR, SendWR

def named(obj):
    log = obj.logger
    return log.name if log is logging.getLogger(log.name) else repr(log)

with testing.world("sim") as w:
    p = testing.connected_pair(w)
    p.b.qp.post_recv(RecvWR(1, 1, [p.b.sge(0, 64)]))
    p.a.qp.post_send(SendWR(2, num_sge=1, sg=[p.a.sge(0, 64)]))
    wcs = testing.wait_completions(w, p.a.cq, 1) + testing.wait_completions(w, p.b.cq, 1)
    wcs[0].set_log_level(logging.DEBUG)  # pyverbs' set_log_level, on a polled WC
    out = {"mode": softverbs.compiled.mode(), "polled": [named(wc) for wc in wcs],
           "level": logging.getLogger("WC").level,
           "made": [named(o) for o in (WC(), SGE(1, 2, 3), RecvWR(), SendWR(opcode=7))]}
    p.close()
print(json.dumps(out))
"""


def _loggers(pure: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    r = subprocess.run([sys.executable, "-c", LOGGER_PROBE], env=env, capture_output=True,
                       text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_every_record_has_its_class_logger_in_both_modes() -> None:
    """As in pyverbs (whose ``poll`` builds each ``WC`` through ``PyverbsObject``'s
    constructor), a polled ``WC`` and the post-path records each have the logger
    named after their class, and ``set_log_level`` sets it: the same compiled (where
    the WC is an extension type) and interpreted."""
    runs = {pure: _loggers(pure) for pure in (False, True)}
    assert runs[True]["mode"].startswith("interpreted")
    for out in runs.values():
        assert out["polled"] == ["WC", "WC"]
        assert out["level"] == logging.DEBUG
        assert out["made"] == ["WC", "SGE", "RecvWR", "SendWR"]
    assert {k: v for k, v in runs[False].items() if k != "mode"} == {
        k: v for k, v in runs[True].items() if k != "mode"
    }


def test_a_logger_set_on_an_object_is_its_own() -> None:
    class MyWC(WC):
        pass

    mine = logging.getLogger("softverbs.test.mine")
    wc = MyWC.from_cqe(_cqe())
    assert wc.logger is logging.getLogger("MyWC")  # named after the class it is
    wc.logger = mine
    assert wc.logger is mine and WC.from_cqe(_cqe()).logger is logging.getLogger("WC")
