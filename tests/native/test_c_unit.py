"""The C library's own unit tests, under AddressSanitizer and UBSan.

``unit.c`` includes the library's ring and verbs sources and drives their
data path -- encoding WQEs, polling CQEs, arming a CQ -- on rings whose
shared memory this side creates.  What C writes is decoded with the
Python codec of ``engine/rings.py``, and CQEs the Python side pushes are
polled by C: the byte layout of docs/rings.md has two implementations and
this is where they are held to each other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from softverbs import enums as e
from softverbs.engine import rings
from softverbs.engine.rings import CQE, SharedRegion
from softverbs.native import CSRC, INCLUDE

HERE = Path(__file__).parent
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]  # fmt: skip


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which(os.environ.get("CC", "gcc"))
    if cc is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler: CI must build the C library")
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("unit") / "unit"
    cmd = [cc, "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *SANITIZE,
           f"-I{CSRC}", f"-I{INCLUDE}", str(HERE / "unit.c"), "-o", str(out), "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out


def run(unit: Path, *args: object, fds: tuple[int, ...] = ()) -> list[str]:
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1")  # fmt: skip
    done = subprocess.run([str(unit), *map(str, args)], capture_output=True, text=True,
                          pass_fds=fds, env=env, check=False, timeout=60)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_slot_sizes_agree(unit: Path) -> None:
    for line in run(unit, "sizes"):
        kind, *numbers = line.split()
        if kind == "send":
            sge, inline, size = map(int, numbers)
            assert size == rings.send_slot_size(sge, inline), line
        else:
            sge, size = map(int, numbers)
            assert size == rings.recv_slot_size(sge), line


SEND_OPS = frozenset(range(rings.WR_DRIVER1 + 1))


@pytest.mark.parametrize("nslots", [8, 4])
def test_rc_send_wqes_decode(unit: Path, nslots: int) -> None:
    slot = rings.send_slot_size(2, 64)
    region = SharedRegion(rings.PackedSlots.region_size(nslots, slot))
    try:
        out = run(unit, "send", region.fd, nslots, slot, 2, 64, e.IBV_QPT_RC, fds=(region.fd,))
        ring = rings.shared_work_ring(region, nslots, slot, send=True, opcodes=SEND_OPS)
        posted = min(nslots, 5)
        bad = 0 if posted == 5 else posted + 1
        assert out[0] == f"post {0 if bad == 0 else 12} bad {bad} doorbells 1 " \
                         f"pi {posted} db {posted}"  # fmt: skip
        # a full ring refuses with ENOMEM before it looks at the WR; with
        # room, the WR with too many SGEs is EINVAL and nothing moves
        assert out[1] == ("extra 12" if nslots == 4 else "extra 0")
        assert out[2] == ("toomany 12" if nslots == 4 else "toomany 22")
        assert out[3] == "init 22"
        w = [ring.slots.read(i) for i in range(posted)]
        assert (w[0].wr_id, w[0].opcode, w[0].signaled, w[0].se, w[0].sges) == (
            1, e.IBV_WR_SEND, True, True, [(0x1000, 100, 0x11), (0x2000, 200, 0x22)])
        assert w[0].length == 300
        assert (w[1].opcode, w[1].inline, w[1].length, w[1].imm, w[1].signaled) == (
            e.IBV_WR_SEND_WITH_IMM, b"inline bytes", 12, 0x01020304, False)
        assert (w[2].opcode, w[2].fence, w[2].remote_addr, w[2].rkey) == (
            e.IBV_WR_RDMA_WRITE, True, 0xABCDEF00, 0x99)
        assert w[2].caller != 0  # the program's return address, for sanitizer reports
        assert (w[3].opcode, w[3].remote_addr, w[3].rkey, w[3].compare_add, w[3].swap) == (
            e.IBV_WR_ATOMIC_CMP_AND_SWP, 0x5008, 0x77, 5, 6)
        if posted == 5:
            assert (w[4].opcode, w[4].inv_rkey) == (e.IBV_WR_SEND_WITH_INV, 0x1234)
            assert ring.slots.read(5).wr_id == 99
    finally:
        region.close()


def test_ud_send_carries_the_address_handle(unit: Path) -> None:
    slot = rings.send_slot_size(2, 0)
    region = SharedRegion(rings.PackedSlots.region_size(8, slot))
    try:
        out = run(unit, "send", region.fd, 8, slot, 2, 0, e.IBV_QPT_UD, fds=(region.fd,))
        assert out[0] == "post 0 bad 0 doorbells 1 pi 1 db 1"
        ring = rings.shared_work_ring(region, 8, slot, send=True, opcodes=SEND_OPS)
        w = ring.slots.read(0)
        assert (w.wr_id, w.ah, w.remote_qpn, w.remote_qkey) == (6, 42, 0x123456, 0x11111111)
    finally:
        region.close()


def test_inline_beyond_the_cap_is_refused(unit: Path) -> None:
    slot = rings.send_slot_size(2, 0)
    region = SharedRegion(rings.PackedSlots.region_size(8, slot))
    try:
        out = run(unit, "send", region.fd, 8, slot, 2, 0, e.IBV_QPT_RC, fds=(region.fd,))
        # WR 2 asks for 12 inline bytes of a QP with max_inline_data 0: EINVAL,
        # and WR 1, already posted, still gets its doorbell
        assert out[0] == "post 22 bad 2 doorbells 1 pi 1 db 1"
    finally:
        region.close()


def test_recv_wqes_decode(unit: Path) -> None:
    slot = rings.recv_slot_size(2)
    region = SharedRegion(rings.PackedSlots.region_size(4, slot))
    try:
        out = run(unit, "recv", region.fd, 4, slot, 2, fds=(region.fd,))
        # the doorbell record is stored; the message is sent only to a QP in ERR
        assert out[0] == "post 0 bad 0 doorbells 0 pi 3"
        assert out[1] == "in-err 0 doorbells 1 db 4"
        ring = rings.shared_work_ring(region, 4, slot, send=False)
        got = [ring.slots.read(i) for i in range(3)]
        assert [(w.wr_id, w.sges, w.length) for w in got] == [
            (10, [(0x3000, 64, 0x33), (0x4000, 32, 0x44)], 96),
            (11, [(0x3000, 64, 0x33)], 64),
            (12, [], 0),
        ]
    finally:
        region.close()


def _cqe(wr_id: int, **kw: int) -> CQE:
    c = CQE(wr_id, kw.pop("status", e.IBV_WC_SUCCESS), kw.pop("opcode", e.IBV_WC_RECV),
            kw.pop("qp_num", 0x11), kw.pop("byte_len", 0), kw.pop("wc_flags", 0),
            kw.pop("imm", 0))  # fmt: skip
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def test_poll_reads_what_the_device_wrote(unit: Path) -> None:
    cap = 8
    region = SharedRegion(rings.PackedSlots.region_size(cap, rings.CQE_SIZE))
    try:
        cq = rings.shared_cq(region, cap)
        cq.push(_cqe(1, opcode=e.IBV_WC_SEND, qp_num=0x22))
        cq.push(_cqe(2, byte_len=12, imm=0xA0B0C0D0, wc_flags=e.IBV_WC_WITH_IMM))
        cq.push(_cqe(3, qp_num=0x33))  # purged below: never polled
        cq.push(_cqe(4, byte_len=5, imm=0x1234, wc_flags=e.IBV_WC_WITH_INV))
        cq.push(_cqe(5, status=e.IBV_WC_WR_FLUSH_ERR, src_qp=0x99))
        cq.purge(0x33)
        out = run(unit, "poll", region.fd, cap, 4, fds=(region.fd,))
        rows = [line.split() for line in out if line.startswith("wc ")]
        assert [r[1] for r in rows] == ["1", "2", "4", "5"]
        assert rows[0][3] == str(e.IBV_WC_SEND) and rows[0][6] == str(0x22)
        # immediate data is in network order in ibv_wc (be32toh gives it back);
        # an invalidated rkey is in host order
        assert rows[1][4:6] == ["12", "a0b0c0d0"]
        assert rows[2][5] == f"{0x34120000:08x}"
        assert rows[3][2] == str(e.IBV_WC_WR_FLUSH_ERR) and rows[3][7] == str(0x99)
        assert out[-1] == "ci 5 again 0"
        assert int(cq.hdr[cq.CI]) == 5
    finally:
        region.close()


def test_arm_words(unit: Path) -> None:
    region = SharedRegion(rings.PackedSlots.region_size(4, rings.CQE_SIZE))
    try:
        out = run(unit, "arm", region.fd, 4, 1, fds=(region.fd,))
        # sequence 1, solicited only; then sequence 2, any completion
        assert out == [f"arm {1 << 1 | 1}", f"arm {2 << 1}"]
    finally:
        region.close()
