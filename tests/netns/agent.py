#!/usr/bin/env python3
"""One end of a multi-host softverbs scenario, run inside a network namespace.

The tests in this directory start two or three agents, each with
``ip netns exec NS python3 agent.py --role server|client --scenario NAME ...``.
An agent

1. writes its own link table (``SOFTVERBS_CONFIG`` in ``--workdir``) with one
   UDP device, ``svnet``, bound to its namespace's interface (``--netdev``),
   exactly as ``softverbs link add svnet --netdev IF`` would, and opens it;
2. exchanges QP numbers, GIDs, PSNs and memory keys with its peer over a
   TCP connection inside the test subnet (the server listens on ``--ip``,
   clients connect to ``--peer``), one JSON object per line;
3. runs the scenario with the pyverbs-shaped softverbs API;
4. closes everything, checks that no softverbs progress thread is left, and
   prints ``RESULT {json}`` as its last stdout line: what it saw (WC
   statuses, counts, hashes, times), ``counters(ctx)``, and ``errors`` --
   the checks that failed inside the agent.  The test judges the rest.

Exit status: 0 when the scenario's own checks passed, 1 when some failed
(the RESULT line says which), 2 when setup failed, 3 when the ``--deadline``
passed: then a watchdog prints a RESULT line and every thread's stack, and
the process ends.  No agent outlives its deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import itertools
import json
import os
import random
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from softverbs import (
    AH,
    CQ,
    GID,
    MR,
    MW,
    PD,
    QP,
    SGE,
    WC,
    AHAttr,
    Context,
    GlobalRoute,
    MWBindInfo,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    counters,
    inc_rkey,
    wc_status_str,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MW_TYPE_2,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_SEND_FENCE,
    IBV_SEND_SIGNALED,
    IBV_WC_RECV_RDMA_WITH_IMM,
    IBV_WC_SUCCESS,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM,
    IBV_WR_SEND_WITH_INV,
)

DEVICE = "svnet"
ACCESS = (
    IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
)
MR_ACCESS = ACCESS | IBV_ACCESS_MW_BIND
QKEY = 0x11111111
SIG = IBV_SEND_SIGNALED
GRH_LEN = 40
NATIVE = sys.byteorder  # atomics act on host-endian words
MAGIC = 0x5356534D  # "SVSM": a stream message header starts with it
HEADER = struct.Struct("<IIII")  # magic, sequence number, stream id, crc32(body)
STREAMS = {"rc": 1, "uc": 2, "ud": 3}


class AgentError(Exception):
    """A scenario step failed or timed out: reported, never retried."""


# --- result and deadline ----------------------------------------------------------------------
_print_lock = threading.Lock()
_reported = False


def emit(tag: str, obj: dict[str, Any]) -> None:
    """Print one ``TAG {json}`` line (RESULT at most once)."""
    global _reported
    with _print_lock:
        if tag == "RESULT":
            if _reported:
                return
            _reported = True
        sys.stdout.write(f"{tag} {json.dumps(obj, sort_keys=True, default=str)}\n")
        sys.stdout.flush()


def start_watchdog(seconds: float, role: str, scenario: str) -> None:
    """After ``seconds``: report, dump every stack, and end the process (status 3)."""

    def expire() -> None:
        emit("RESULT", {"ok": False, "role": role, "scenario": scenario,
                        "errors": [f"agent deadline of {seconds:.0f}s passed"]})  # fmt: skip
        sys.stderr.write(f"agent {role}: deadline of {seconds:.0f}s passed; stacks:\n")
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    # Backstop for a process so stuck that the timer thread cannot run.
    faulthandler.dump_traceback_later(seconds + 5, exit=True)


# --- the control connection -------------------------------------------------------------------
class Ctl:
    """Newline-delimited JSON messages over TCP, each with a ``tag``."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    def connect(cls, host: str, port: int, deadline: float) -> Ctl:
        last: OSError | None = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((host, port), timeout=2)
                return cls(sock, deadline)
            except OSError as exc:  # the server may not listen yet
                last = exc
                time.sleep(0.05)
        raise AgentError(f"cannot connect to the server at {host}:{port}: {last}")

    def send(self, tag: str, **data: Any) -> None:
        msg = json.dumps({"tag": tag, **data}).encode() + b"\n"
        self.sock.settimeout(max(0.1, self.deadline - time.monotonic()))
        self.sock.sendall(msg)

    def _line(self) -> dict[str, Any] | None:
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    def _fill(self, timeout: float) -> bool:
        """Read what is there (waiting up to ``timeout``); False if nothing came."""
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        chunk = self.sock.recv(65536)
        if not chunk:
            raise AgentError("the peer closed the control connection")
        self.buf += chunk
        return True

    def recv(self, tag: str, timeout: float | None = None) -> dict[str, Any]:
        """The next message, which must carry ``tag``."""
        end = self.deadline if timeout is None else min(self.deadline, time.monotonic() + timeout)
        while True:
            msg = self._line()
            if msg is not None:
                if msg.get("tag") != tag:
                    raise AgentError(f"expected control message {tag!r}, got {msg!r}")
                return msg
            left = end - time.monotonic()
            if left <= 0:
                raise AgentError(f"timed out waiting for control message {tag!r}")
            self._fill(min(left, 0.5))

    def poll(self) -> dict[str, Any] | None:
        """A message if one is complete now, else None (never blocks)."""
        msg = self._line()
        if msg is None and self._fill(0):
            msg = self._line()
        return msg

    def barrier(self, tag: str) -> None:
        self.send(tag)
        self.recv(tag)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# --- verbs helpers ----------------------------------------------------------------------------
@dataclass
class Env:
    """What a scenario works with."""

    args: argparse.Namespace
    ctx: Context
    pd: PD
    gid_index: int
    gid: bytes
    path_mtu: int  #: IBV_MTU_* of the port
    mtu_bytes: int
    deadline: float
    result: dict[str, Any]
    errors: list[str]
    keep: list[Any] = field(default_factory=list)  #: objects to keep alive

    def check(self, cond: bool, msg: str) -> None:
        """Record a failed check (and go on: one run reports every problem)."""
        if not cond:
            self.errors.append(msg)

    def left(self) -> float:
        return self.deadline - time.monotonic()


def wc_dict(wc: WC) -> dict[str, Any]:
    d: dict[str, Any] = {
        "wr_id": wc.wr_id, "status": wc.status, "status_str": wc_status_str(wc.status),
        "opcode": wc.opcode, "byte_len": wc.byte_len, "qp_num": wc.qp_num,
        "wc_flags": wc.wc_flags, "imm_data": wc.imm_data, "src_qp": wc.src_qp,
    }  # fmt: skip
    if wc.reason:
        d["reason"] = wc.reason
    return d


def poll(env: Env, cq: CQ, n: int, what: str, timeout: float | None = None) -> list[WC]:
    """Exactly ``n`` completions, or AgentError naming what was awaited."""
    got: list[WC] = []
    end = env.deadline if timeout is None else min(env.deadline, time.monotonic() + timeout)
    while len(got) < n:
        k, wcs = cq.poll(min(64, n - len(got)))
        if k:
            got.extend(wcs)
            continue
        if time.monotonic() > end:
            raise AgentError(
                f"{what}: {len(got)} of {n} completions arrived: {[wc_dict(w) for w in got]}"
            )
        time.sleep(0.0002)
    return got


def poll_some(cq: CQ, n: int = 64) -> list[WC]:
    _, wcs = cq.poll(n)
    return wcs


def make_cq(env: Env, cqe: int = 1024) -> CQ:
    cq = CQ(env.ctx, cqe)
    env.keep.append(cq)
    return cq


def make_qp(env: Env, qp_type: int, scq: CQ, rcq: CQ | None = None, *, send_wr: int = 64,
            recv_wr: int = 64, sig_all: int = 1) -> QP:  # fmt: skip
    cap = QPCap(max_send_wr=send_wr, max_recv_wr=recv_wr, max_send_sge=2, max_recv_sge=2,
                max_inline_data=64)  # fmt: skip
    init = QPInitAttr(qp_type=qp_type, scq=scq, rcq=rcq if rcq is not None else scq, cap=cap,
                      sq_sig_all=sig_all)  # fmt: skip
    attr = QPAttr()
    attr.qp_access_flags = ACCESS
    attr.qkey = QKEY
    qp = QP(env.pd, init, attr)  # RC/UC: INIT; UD: RTS
    env.keep.append(qp)
    return qp


def make_mr(env: Env, size: int, access: int = MR_ACCESS) -> MR:
    mr = MR(env.pd, size, access)
    env.keep.append(mr)
    return mr


def route(env: Env, gid_hex: str) -> AHAttr:
    gr = GlobalRoute(dgid=GID.from_raw(bytes.fromhex(gid_hex)), sgid_index=env.gid_index,
                     hop_limit=64)  # fmt: skip
    return AHAttr(is_global=1, port_num=1, gr=gr)


def qp_info(qp: QP, psn: int) -> dict[str, int]:
    return {"qpn": qp.qp_num, "psn": psn}


def connect(env: Env, qp: QP, local_psn: int, remote: dict[str, Any], gid_hex: str, *,
            timeout: int | None = None, retry_cnt: int = 7, rnr_retry: int = 7,
            min_rnr_timer: int = 1) -> None:  # fmt: skip
    """Move an RC or UC QP to RTS towards ``remote`` (``qp_info`` of the peer)."""
    attr = QPAttr()
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num = remote["qpn"]
    attr.rq_psn = remote["psn"]
    attr.sq_psn = local_psn
    attr.path_mtu = env.path_mtu
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 8
    attr.timeout = env.args.qp_timeout if timeout is None else timeout
    attr.retry_cnt = retry_cnt
    attr.rnr_retry = rnr_retry
    attr.min_rnr_timer = min_rnr_timer
    attr.ah_attr = route(env, gid_hex)
    qp.to_rts(attr)


def sge(mr: MR, offset: int, length: int) -> SGE:
    return SGE(mr.buf + offset, length, mr.lkey)


def wr(wr_id: int, opcode: int, mr: MR, offset: int, length: int, flags: int = SIG) -> SendWR:
    return SendWR(wr_id, opcode, 1, sg=[sge(mr, offset, length)], send_flags=flags)


def recv(wr_id: int, mr: MR, offset: int, length: int) -> RecvWR:
    return RecvWR(wr_id, 1, [sge(mr, offset, length)])


def chain(wrs: list[SendWR]) -> SendWR:
    for a, b in itertools.pairwise(wrs):
        a.next_wr = b
    return wrs[0]


def pattern(seed: str, n: int) -> bytes:
    """``n`` deterministic pseudo-random bytes named by ``seed``."""
    return random.Random(seed).randbytes(n)


def sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def bind_mw2(env: Env, qp: QP, cq: CQ, mw: MW, mr: MR, offset: int, length: int,
             wr_id: int) -> tuple[int, WC]:  # fmt: skip
    """BIND_MW a type 2 window through ``qp``: (the rkey it was to get, its WC)."""
    w = SendWR(wr_id, IBV_WR_BIND_MW, send_flags=SIG)
    w.set_bind_wr(mw, MWBindInfo(mr, mr.buf + offset, length,
                                 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ))  # fmt: skip
    rkey = w.rkey
    qp.post_send(w)
    return rkey, poll(env, cq, 1, "BIND_MW")[0]


# --- scenario: every RC opcode ----------------------------------------------------------------
# server MR layout (1 MiB)
O_SEND = 0x00000  # receive buffers, 16 KiB each
O_WRITE = 0x20000
O_WIMM = 0x30000
O_READ = 0x40000
O_ATOMIC = 0x50000
O_MW = 0x60000
O_FLUSH = 0x70000
V0, V1, V2 = 0x1122334455667788, 0x0102030405060708, 0x0F0E0D0C0B0A0908
IMM_SEND, IMM_WRITE = 0xC0FFEE01, 0xC0FFEE02
L_SEND, L_SIMM, L_WRITE, L_WIMM, L_READ, L_MWW, L_INV = 5000, 100, 10000, 2000, 10000, 500, 64


def server_rc_opcodes(env: Env, ctl: Ctl) -> None:
    scq, rcq = make_cq(env), make_cq(env)
    qp = make_qp(env, IBV_QPT_RC, scq, rcq)
    mr = make_mr(env, 1 << 20)
    mr.write(pattern("read", L_READ), L_READ, O_READ)
    mr.write(V0.to_bytes(8, NATIVE), 8, O_ATOMIC)
    mw = MW(env.pd, IBV_MW_TYPE_2)
    env.keep.append(mw)
    # the type 2 window is bound to this QP, so it must reach RTS first
    psn = 0x10
    for i in range(4):
        qp.post_recv(recv(i, mr, O_SEND + i * 0x4000, 0x4000))
    qp.post_recv(recv(99, mr, O_FLUSH, 64))  # must be flushed at the end
    ctl.send("info", gid=env.gid.hex(), qp=qp_info(qp, psn), addr=mr.buf, rkey=mr.rkey)
    peer = ctl.recv("info")
    connect(env, qp, psn, peer["qp"], peer["gid"])
    mw_rkey, wc = bind_mw2(env, qp, scq, mw, mr, O_MW, 4096, 50)
    env.check(wc.status == IBV_WC_SUCCESS, f"server BIND_MW: {wc_dict(wc)}")
    env.result["mw_rkey"] = mw_rkey
    ctl.send("mw", rkey=mw_rkey, addr=mr.buf + O_MW)
    ctl.barrier("ready")

    wcs = poll(env, rcq, 4, "receives of SEND, SEND_WITH_IMM, WRITE_WITH_IMM, SEND_WITH_INV")
    env.result["recv_wcs"] = [wc_dict(w) | {"invalidated_rkey": w.invalidated_rkey}
                              for w in wcs]  # fmt: skip
    env.result["recv_sha"] = [sha(mr.read(w.byte_len, O_SEND + w.wr_id * 0x4000))
                              if w.wr_id < 4 and w.status == 0 else "" for w in wcs]  # fmt: skip
    env.result["write_sha"] = sha(mr.read(L_WRITE, O_WRITE))
    env.result["wimm_sha"] = sha(mr.read(L_WIMM, O_WIMM))
    env.result["mw_write_sha"] = sha(mr.read(L_MWW, O_MW + 100))
    env.result["atomic_final"] = int.from_bytes(mr.read(8, O_ATOMIC), NATIVE)
    # SEND_WITH_INV invalidated the window: a type 2 window binds again only when invalid
    new_rkey, wc = bind_mw2(env, qp, scq, mw, mr, O_MW, 4096, 51)
    env.result["rebind_after_send_inv"] = wc_dict(wc)
    env.check(wc.status == IBV_WC_SUCCESS and mw.rkey == new_rkey,
              f"rebinding the window after SEND_WITH_INV failed: {wc_dict(wc)}")  # fmt: skip

    # WRITE and READ back through the client's type 2 window
    m = ctl.recv("mw_c")
    data = pattern("mw_c", 3000)
    mr.write(data, len(data), O_WRITE)
    w1 = wr(60, IBV_WR_RDMA_WRITE, mr, O_WRITE, 3000)
    w1.set_wr_rdma(m["rkey"], m["addr"])
    w2 = wr(61, IBV_WR_RDMA_READ, mr, O_READ + 0x8000, 3000)
    w2.set_wr_rdma(m["rkey"], m["addr"])
    qp.post_send(chain([w1, w2]))
    wcs = poll(env, scq, 2, "WRITE and READ through the client's window")
    env.result["mw_c_wcs"] = [wc_dict(w) for w in wcs]
    env.check(mr.read(3000, O_READ + 0x8000) == data, "READ through the client's window: data")
    ctl.send("mw_c_done", sha=sha(data))

    # The client now writes through the window's old rkey: a remote access error
    ctl.recv("neg_done")
    ev = env.ctx.get_async_event(timeout=max(0.1, env.left()))
    env.result["async_event"] = {"type": ev.event_type, "reason": ev.reason}
    ev.ack()
    wcs = poll(env, rcq, 1, "the flushed receive")
    env.result["flush_wc"] = wc_dict(wcs[0])
    env.result["qp_state"] = qp.qp_state
    ctl.barrier("bye")


def client_rc_opcodes(env: Env, ctl: Ctl) -> None:
    scq, rcq = make_cq(env), make_cq(env)
    qp = make_qp(env, IBV_QPT_RC, scq, rcq)
    mr = make_mr(env, 1 << 20)
    mw = MW(env.pd, IBV_MW_TYPE_2)
    env.keep.append(mw)
    psn = 0xFFFFF0  # wraps during the run
    peer = ctl.recv("info")
    ctl.send("info", gid=env.gid.hex(), qp=qp_info(qp, psn), addr=mr.buf, rkey=mr.rkey)
    connect(env, qp, psn, peer["qp"], peer["gid"])
    smw = ctl.recv("mw")
    ctl.barrier("ready")
    raddr, rkey = peer["addr"], peer["rkey"]

    data = {name: pattern(name, n) for name, n in
            (("send", L_SEND), ("simm", L_SIMM), ("write", L_WRITE), ("wimm", L_WIMM),
             ("mww", L_MWW), ("inv", L_INV))}  # fmt: skip
    off = {"send": 0, "simm": 0x2000, "write": 0x4000, "wimm": 0x8000, "mww": 0x9000,
           "inv": 0xA000}  # fmt: skip
    for name, d in data.items():
        mr.write(d, len(d), off[name])
    env.result["sent_sha"] = {name: sha(d) for name, d in data.items()}
    wrs = [wr(1, IBV_WR_SEND, mr, off["send"], L_SEND)]
    w = wr(2, IBV_WR_SEND_WITH_IMM, mr, off["simm"], L_SIMM)
    w.imm_data = IMM_SEND
    wrs.append(w)
    w = wr(3, IBV_WR_RDMA_WRITE, mr, off["write"], L_WRITE)
    w.set_wr_rdma(rkey, raddr + O_WRITE)
    wrs.append(w)
    w = wr(4, IBV_WR_RDMA_WRITE_WITH_IMM, mr, off["wimm"], L_WIMM)
    w.set_wr_rdma(rkey, raddr + O_WIMM)
    w.imm_data = IMM_WRITE
    wrs.append(w)
    w = wr(5, IBV_WR_RDMA_READ, mr, 0x10000, L_READ)
    w.set_wr_rdma(rkey, raddr + O_READ)
    wrs.append(w)
    for i, (opcode, compare_add, swap) in enumerate(
        ((IBV_WR_ATOMIC_CMP_AND_SWP, V0, V1),  # hit: V0 -> V1
         (IBV_WR_ATOMIC_CMP_AND_SWP, V0, V2),  # miss: stays V1
         (IBV_WR_ATOMIC_FETCH_AND_ADD, 5, 0))  # V1 -> V1 + 5
    ):  # fmt: skip
        w = wr(6 + i, opcode, mr, 0x20000 + 8 * i, 8)
        w.set_wr_atomic(rkey, raddr + O_ATOMIC, compare_add, swap)
        wrs.append(w)
    w = wr(9, IBV_WR_RDMA_WRITE, mr, off["mww"], L_MWW)
    w.set_wr_rdma(smw["rkey"], smw["addr"] + 100)
    wrs.append(w)
    w = wr(10, IBV_WR_SEND_WITH_INV, mr, off["inv"], L_INV)
    w.invalidate_rkey = smw["rkey"]
    wrs.append(w)
    qp.post_send(chain(wrs))
    wcs = poll(env, scq, len(wrs), "the send WCs of every opcode")
    env.result["send_wcs"] = [wc_dict(w) for w in wcs]
    env.result["read_sha"] = sha(mr.read(L_READ, 0x10000))
    env.result["atomic_orig"] = [int.from_bytes(mr.read(8, 0x20000 + 8 * i), NATIVE)
                                 for i in range(3)]  # fmt: skip

    # BIND_MW on this side; the server writes and reads through it
    mw_rkey, wc = bind_mw2(env, qp, scq, mw, mr, 0x40000, 8192, 20)
    env.result["bind_wc"] = wc_dict(wc)
    ctl.send("mw_c", rkey=mw_rkey, addr=mr.buf + 0x40000)
    done = ctl.recv("mw_c_done")
    env.result["mw_c_match"] = sha(mr.read(3000, 0x40000)) == done["sha"]
    # LOCAL_INV; rebinding succeeds only because the window is now invalid
    w = SendWR(21, IBV_WR_LOCAL_INV, send_flags=SIG)
    w.invalidate_rkey = mw_rkey
    qp.post_send(w)
    env.result["local_inv_wc"] = wc_dict(poll(env, scq, 1, "LOCAL_INV")[0])
    new_rkey, wc = bind_mw2(env, qp, scq, mw, mr, 0x40000, 8192, 22)
    env.result["rebind_after_local_inv"] = wc_dict(wc)
    env.check(new_rkey == inc_rkey(mw_rkey), "rebinding must advance the key byte")

    # Last: a WRITE through the server window's invalidated rkey
    w = wr(30, IBV_WR_RDMA_WRITE, mr, off["mww"], 16)
    w.set_wr_rdma(smw["rkey"], smw["addr"])
    qp.post_send(w)
    env.result["neg_wc"] = wc_dict(poll(env, scq, 1, "WRITE with an invalidated rkey")[0])
    env.result["qp_state"] = qp.qp_state
    ctl.send("neg_done")
    ctl.barrier("bye")


# --- scenario: UC and UD traffic --------------------------------------------------------------
def server_uc_ud(env: Env, ctl: Ctl) -> None:
    cq = make_cq(env)
    uc = make_qp(env, IBV_QPT_UC, cq)
    ud = make_qp(env, IBV_QPT_UD, cq)
    mr = make_mr(env, 1 << 20)
    for i in range(3):
        uc.post_recv(recv(i, mr, i * 0x4000, 0x4000))
    for i in range(2):
        ud.post_recv(recv(10 + i, mr, 0x10000 + i * 0x2000, 0x2000))
    ctl.send("info", gid=env.gid.hex(), uc=qp_info(uc, 0x100), ud=ud.qp_num, addr=mr.buf,
             rkey=mr.rkey)  # fmt: skip
    peer = ctl.recv("info")
    connect(env, uc, 0x100, peer["uc"], peer["gid"])
    ctl.barrier("ready")
    wcs = poll(env, cq, 5, "UC and UD receives")
    env.result["recv_wcs"] = [wc_dict(w) for w in wcs]
    shas: dict[str, str] = {}
    grh_src: dict[str, str] = {}
    for w in wcs:
        if w.status != IBV_WC_SUCCESS:
            continue
        if w.wr_id < 10:
            shas[str(w.wr_id)] = sha(mr.read(w.byte_len, w.wr_id * 0x4000))
        else:
            base = 0x10000 + (w.wr_id - 10) * 0x2000
            shas[str(w.wr_id)] = sha(mr.read(w.byte_len - GRH_LEN, base + GRH_LEN))
            grh = mr.read(GRH_LEN, base)
            grh_src[str(w.wr_id)] = (
                socket.inet_ntop(socket.AF_INET, grh[32:36]) if not any(grh[:20])
                else socket.inet_ntop(socket.AF_INET6, grh[8:24])
            )  # fmt: skip
    env.result["recv_sha"] = shas
    env.result["grh_src"] = grh_src
    env.result["write_sha"] = sha(mr.read(5000, 0x20000))
    ctl.barrier("bye")


def client_uc_ud(env: Env, ctl: Ctl) -> None:
    cq = make_cq(env)
    uc = make_qp(env, IBV_QPT_UC, cq)
    ud = make_qp(env, IBV_QPT_UD, cq)
    mr = make_mr(env, 1 << 20)
    peer = ctl.recv("info")
    ctl.send("info", gid=env.gid.hex(), uc=qp_info(uc, 0x200), ud=ud.qp_num)
    connect(env, uc, 0x200, peer["uc"], peer["gid"])
    ah = AH(env.pd, attr=route(env, peer["gid"]))
    env.keep.append(ah)
    ctl.barrier("ready")
    sizes = {"uc_send": 3000, "uc_simm": 200, "uc_write": 5000, "uc_wimm": 100,
             "ud_send": min(512, env.mtu_bytes), "ud_simm": env.mtu_bytes}  # fmt: skip
    shas = {}
    off = 0
    offs = {}
    for name, n in sizes.items():
        d = pattern(name, n)
        mr.write(d, n, off)
        shas[name] = sha(d)
        offs[name] = off
        off += 0x4000
    env.result["sent_sha"] = shas
    ws = [wr(1, IBV_WR_SEND, mr, offs["uc_send"], sizes["uc_send"])]
    w = wr(2, IBV_WR_SEND_WITH_IMM, mr, offs["uc_simm"], sizes["uc_simm"])
    w.imm_data = 0xAB
    ws.append(w)
    w = wr(3, IBV_WR_RDMA_WRITE, mr, offs["uc_write"], sizes["uc_write"])
    w.set_wr_rdma(peer["rkey"], peer["addr"] + 0x20000)
    ws.append(w)
    w = wr(4, IBV_WR_RDMA_WRITE_WITH_IMM, mr, offs["uc_wimm"], sizes["uc_wimm"])
    w.set_wr_rdma(peer["rkey"], peer["addr"] + 0x30000)
    w.imm_data = 0xCD
    ws.append(w)
    uc.post_send(chain(ws))
    env.result["uc_wcs"] = [wc_dict(w) for w in poll(env, cq, 4, "UC sends")]
    w = wr(5, IBV_WR_SEND, mr, offs["ud_send"], sizes["ud_send"])
    w.set_wr_ud(ah, peer["ud"], QKEY)
    w2 = wr(6, IBV_WR_SEND_WITH_IMM, mr, offs["ud_simm"], sizes["ud_simm"])
    w2.set_wr_ud(ah, peer["ud"], QKEY)
    w2.imm_data = 0xEF
    ud.post_send(chain([w, w2]))
    env.result["ud_wcs"] = [wc_dict(w) for w in poll(env, cq, 2, "UD sends")]
    env.result["ud_qpn"] = ud.qp_num
    env.result["uc_qpn"] = uc.qp_num
    ctl.barrier("bye")


# --- scenario: 64 MiB WRITE, READ and SEND ----------------------------------------------------
def server_large(env: Env, ctl: Ctl) -> None:
    size = env.args.size
    scq, rcq = make_cq(env), make_cq(env)
    qp = make_qp(env, IBV_QPT_RC, scq, rcq)
    target = make_mr(env, size)
    source = make_mr(env, size)
    source.write(pattern("large-read", size), size, 0)
    ctl.send("info", gid=env.gid.hex(), qp=qp_info(qp, 0), addr=target.buf, rkey=target.rkey,
             src_addr=source.buf, src_rkey=source.rkey, src_sha=sha(source.view))  # fmt: skip
    peer = ctl.recv("info")
    connect(env, qp, 0, peer["qp"], peer["gid"])
    ctl.barrier("ready")
    msg = ctl.recv("written")
    env.result["write_sha"] = sha(target.view)
    env.check(env.result["write_sha"] == msg["sha"], "large WRITE: hash mismatch")
    target.write(bytes(size), size, 0)
    qp.post_recv(recv(1, target, 0, size))
    ctl.send("recv_posted")
    wc = poll(env, rcq, 1, "the large SEND's receive")[0]
    env.result["recv_wc"] = wc_dict(wc)
    env.result["send_sha"] = sha(target.view)
    ctl.recv("read_done")
    ctl.barrier("bye")


def client_large(env: Env, ctl: Ctl) -> None:
    size = env.args.size
    scq = make_cq(env)
    qp = make_qp(env, IBV_QPT_RC, scq)
    src = make_mr(env, size)
    dst = make_mr(env, size)
    t = time.monotonic()
    src.write(pattern("large-write", size), size, 0)
    src_sha = sha(src.view)
    env.result["prepare_s"] = time.monotonic() - t
    psn = 0xFFF000  # a 64 MiB message crosses the PSN wrap
    peer = ctl.recv("info")
    ctl.send("info", gid=env.gid.hex(), qp=qp_info(qp, psn))
    connect(env, qp, psn, peer["qp"], peer["gid"])
    ctl.barrier("ready")
    times: dict[str, float] = {}
    wcs: dict[str, Any] = {}

    def run(name: str, w: SendWR) -> None:
        t0 = time.monotonic()
        qp.post_send(w)
        wc = poll(env, scq, 1, f"{size >> 20} MiB {name}")[0]
        times[name] = round(time.monotonic() - t0, 3)
        wcs[name] = wc_dict(wc)
        if wc.status != IBV_WC_SUCCESS:
            raise AgentError(f"{name} failed: {wc_dict(wc)}")

    w = wr(1, IBV_WR_RDMA_WRITE, src, 0, size)
    w.set_wr_rdma(peer["rkey"], peer["addr"])
    run("write", w)
    ctl.send("written", sha=src_sha)
    ctl.recv("recv_posted")
    run("send", wr(2, IBV_WR_SEND, src, 0, size))
    w = wr(3, IBV_WR_RDMA_READ, dst, 0, size)
    w.set_wr_rdma(peer["src_rkey"], peer["src_addr"])
    run("read", w)
    env.result["read_sha"] = sha(dst.view)
    env.check(env.result["read_sha"] == peer["src_sha"], "large READ: hash mismatch")
    env.result["src_sha"] = src_sha
    env.result["times"] = times
    env.result["wcs"] = wcs
    env.result["mb_per_s"] = {k: round(size / v / 1e6, 1) for k, v in times.items() if v}
    ctl.send("read_done")
    ctl.barrier("bye")


# --- scenario: sequenced streams on RC, UC and UD (under loss) --------------------------------
def stream_message(stream: int, seq: int, maxlen: int) -> bytes:
    n = 16 + (seq * 7919 + stream * 104729) % max(1, maxlen - HEADER.size - 16)
    body = hashlib.shake_128(f"{stream}:{seq}".encode()).digest(n)
    return HEADER.pack(MAGIC, seq, stream, zlib.crc32(body)) + body


def parse_message(data: bytes) -> tuple[int, int] | None:
    """(stream, seq) of an intact message, None if it is damaged."""
    if len(data) < HEADER.size:
        return None
    magic, seq, stream, crc = HEADER.unpack_from(data)
    if magic != MAGIC or zlib.crc32(data[HEADER.size :]) != crc:
        return None
    return stream, seq


READ_SRC = 1 << 16  #: the server's READ source region


def rc_op(i: int) -> str:
    """What RC operation ``i`` of a stream is: a message, a READ or an atomic."""
    return {4: "read", 7: "faa", 9: "cas"}.get(i % 10, "wimm" if i % 4 == 3 else "send")


def rc_messages(n: int) -> list[int]:
    return [i for i in range(n) if rc_op(i) in ("send", "wimm")]


def read_span(i: int) -> tuple[int, int]:
    """(offset, length) in the server's READ source that RC READ ``i`` reads."""
    length = 1 + (i * 7919) % READ_SRC
    return (i * 104729) % (READ_SRC - length + 1), length


class StreamCheck:
    """What arrived on one stream: order, duplicates, damage."""

    def __init__(self, name: str, ordered: bool) -> None:
        self.name = name
        self.ordered = ordered
        self.seqs: list[int] = []
        self.seen: set[int] = set()
        self.corrupt = 0
        self.dups = 0
        self.out_of_order = 0
        self.bad_status: Counter[str] = Counter()

    def add(self, data: bytes, expect_stream: int, imm_seq: int | None = None) -> None:
        parsed = parse_message(data)
        if (
            parsed is None
            or parsed[0] != expect_stream
            or (imm_seq is not None and parsed[1] != imm_seq)
        ):
            self.corrupt += 1
            return
        seq = parsed[1]
        if seq in self.seen:
            self.dups += 1
            return
        if self.seqs and seq < self.seqs[-1]:
            self.out_of_order += 1
        self.seen.add(seq)
        self.seqs.append(seq)

    def summary(self) -> dict[str, Any]:
        gaps = sum(1 for a, b in zip(self.seqs, self.seqs[1:], strict=False) if b != a + 1)
        return {"received": len(self.seqs), "corrupt": self.corrupt, "dups": self.dups,
                "out_of_order": self.out_of_order, "gaps": gaps,
                "first": self.seqs[:3], "last": self.seqs[-3:],
                "bad_status": dict(self.bad_status)}  # fmt: skip


def server_stream(env: Env, ctl: Ctl) -> None:
    n, depth = env.args.count, 128
    slot = env.args.msg_size
    cqs = {k: make_cq(env, 4096) for k in STREAMS}
    rc = make_qp(env, IBV_QPT_RC, cqs["rc"], recv_wr=depth)
    uc = make_qp(env, IBV_QPT_UC, cqs["uc"], recv_wr=depth)
    ud = make_qp(env, IBV_QPT_UD, cqs["ud"], recv_wr=depth)
    qps = {"rc": rc, "uc": uc, "ud": ud}
    ud_slot = GRH_LEN + env.mtu_bytes
    rbuf = {k: make_mr(env, depth * (ud_slot if k == "ud" else slot)) for k in STREAMS}
    wimm = {k: make_mr(env, n * slot) for k in ("rc", "uc")}  # WRITE_WITH_IMM slot per seq
    rsrc = make_mr(env, READ_SRC)
    rsrc.write(pattern("readsrc", READ_SRC), READ_SRC, 0)
    atom = make_mr(env, 16)  # a FETCH_ADD counter and a CMP_SWAP chain
    size = {k: ud_slot if k == "ud" else slot for k in STREAMS}
    for k, qp in qps.items():
        for i in range(depth):
            qp.post_recv(recv(i, rbuf[k], i * size[k], size[k]))
    ctl.send("info", gid=env.gid.hex(), rc=qp_info(rc, 0xFFFF00), uc=qp_info(uc, 0),
             ud=ud.qp_num, wimm={k: [m.buf, m.rkey] for k, m in wimm.items()},
             rsrc=[rsrc.buf, rsrc.rkey], atom=[atom.buf, atom.rkey])  # fmt: skip
    peer = ctl.recv("info")
    connect(env, rc, 0xFFFF00, peer["rc"], peer["gid"], timeout=env.args.qp_timeout)
    connect(env, uc, 0, peer["uc"], peer["gid"])
    ctl.barrier("ready")
    checks = {"rc": StreamCheck("rc", True), "uc": StreamCheck("uc", True),
              "ud": StreamCheck("ud", False)}  # fmt: skip
    sent: dict[str, int] | None = None
    quiet_since = time.monotonic()
    t0 = time.monotonic()
    while True:
        moved = False
        for k, cq in cqs.items():
            for w in poll_some(cq):
                moved = True
                chk = checks[k]
                if w.status != IBV_WC_SUCCESS:
                    chk.bad_status[wc_status_str(w.status)] += 1
                    continue
                if w.opcode == IBV_WC_RECV_RDMA_WITH_IMM:
                    # the data is in the WRITE slot the immediate names
                    if k == "ud" or w.imm_data >= n:
                        chk.corrupt += 1
                    else:
                        data = wimm[k].read(w.byte_len, w.imm_data * slot)
                        chk.add(data, STREAMS[k], imm_seq=w.imm_data)
                else:
                    base = w.wr_id * size[k]
                    if k == "ud":
                        data = rbuf[k].read(w.byte_len - GRH_LEN, base + GRH_LEN)
                    else:
                        data = rbuf[k].read(w.byte_len, base)
                    chk.add(data, STREAMS[k])
                qps[k].post_recv(recv(w.wr_id, rbuf[k], w.wr_id * size[k], size[k]))
        if sent is None:
            msg = ctl.poll()
            if msg is not None:
                if msg.get("tag") != "sent":
                    raise AgentError(f"unexpected control message {msg!r}")
                sent = msg["counts"]
        now = time.monotonic()
        if moved:
            quiet_since = now
        rc_done = len(checks["rc"].seqs) >= len(rc_messages(n))
        if sent is not None and rc_done and now - quiet_since > env.args.grace:
            break
        if now > env.deadline - 2:
            env.errors.append("stream: the server stopped waiting (deadline close)")
            break
        if not moved:
            time.sleep(0.0005)
    env.result["elapsed_s"] = round(time.monotonic() - t0, 3)
    env.result["streams"] = {k: c.summary() for k, c in checks.items()}
    env.result["sent"] = sent
    env.result["atomic_final"] = [int.from_bytes(atom.read(8, o), NATIVE) for o in (0, 8)]
    c = checks["rc"]
    env.check(c.seqs == rc_messages(n),
              f"RC stream: not every message exactly once in order: {c.summary()}")  # fmt: skip
    ctl.barrier("bye")


def client_stream(env: Env, ctl: Ctl) -> None:
    n, slot = env.args.count, env.args.msg_size
    cqs = {k: make_cq(env, 4096) for k in STREAMS}
    rc = make_qp(env, IBV_QPT_RC, cqs["rc"], send_wr=64)
    uc = make_qp(env, IBV_QPT_UC, cqs["uc"], send_wr=64)
    ud = make_qp(env, IBV_QPT_UD, cqs["ud"], send_wr=64)
    qps = {"rc": rc, "uc": uc, "ud": ud}
    maxlen = {"rc": slot, "uc": slot, "ud": env.mtu_bytes}
    src = {k: make_mr(env, 64 * maxlen[k]) for k in STREAMS}
    rdst = make_mr(env, 64 * READ_SRC)  # READ and atomic results, a slot per WR in flight
    read_src = pattern("readsrc", READ_SRC)
    ops: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    peer = ctl.recv("info")
    ctl.send("info", gid=env.gid.hex(), rc=qp_info(rc, 0x7FFF00), uc=qp_info(uc, 0x10))
    connect(env, rc, 0x7FFF00, peer["rc"], peer["gid"], timeout=env.args.qp_timeout)
    connect(env, uc, 0x10, peer["uc"], peer["gid"])
    ah = AH(env.pd, attr=route(env, peer["gid"]))
    env.keep.append(ah)
    ctl.barrier("ready")
    posted = dict.fromkeys(STREAMS, 0)
    done = dict.fromkeys(STREAMS, 0)
    statuses: dict[str, Counter[str]] = {k: Counter() for k in STREAMS}
    done_ops: Counter[str] = Counter()
    t0 = time.monotonic()
    while any(done[k] < n for k in STREAMS):
        if time.monotonic() > env.deadline - 2:
            raise AgentError(f"stream: sends did not complete: posted {posted}, done {done}")
        moved = False
        for k, qp in qps.items():
            # UC and UD go no faster than RC, so the receiver is not simply overrun
            limit = n if k == "rc" else done["rc"] + 32
            while posted[k] < n and posted[k] - done[k] < (64 if k == "rc" else 16) \
                    and posted[k] < limit:  # fmt: skip
                seq = posted[k]
                if k == "rc" and rc_op(seq) in ("read", "faa", "cas"):
                    qp.post_send(rc_rd_atomic(seq, ops, rdst, peer))
                    posted[k] += 1
                    moved = True
                    continue
                msg = stream_message(STREAMS[k], seq, maxlen[k])
                off = (seq % 64) * maxlen[k]
                src[k].write(msg, len(msg), off)
                use_imm = k != "ud" and seq % 4 == 3
                w = wr(seq, IBV_WR_RDMA_WRITE_WITH_IMM if use_imm else IBV_WR_SEND,
                       src[k], off, len(msg))  # fmt: skip
                if use_imm:
                    buf, rkey = peer["wimm"][k]
                    w.set_wr_rdma(rkey, buf + seq * slot)
                    w.imm_data = seq
                if k == "ud":
                    w.set_wr_ud(ah, peer["ud"], QKEY)
                qp.post_send(w)
                posted[k] += 1
                moved = True
            for wc in poll_some(cqs[k]):
                moved = True
                if k == "rc" and wc.wr_id != done[k]:
                    bad["wc_order"] += 1
                done[k] += 1
                statuses[k][wc_status_str(wc.status)] += 1
                if k == "rc" and wc.status == IBV_WC_SUCCESS:
                    check_rd_atomic(wc.wr_id, rdst, read_src, done_ops, bad)
        if not moved:
            time.sleep(0.0002)
    env.result["elapsed_s"] = round(time.monotonic() - t0, 3)
    env.result["send_status"] = {k: dict(v) for k, v in statuses.items()}
    env.result["rc_ops"] = dict(ops)
    env.result["rc_bad"] = dict(bad)
    ctl.send("sent", counts=posted)
    ctl.barrier("bye")


def rc_rd_atomic(i: int, ops: Counter[str], rdst: MR, peer: dict[str, Any]) -> SendWR:
    """The WR of RC operation ``i``: a READ, a FETCH_ADD(1) or the next CMP_SWAP."""
    op = rc_op(i)
    slot = (i % 64) * READ_SRC
    if op == "read":
        off, length = read_span(i)
        w = wr(i, IBV_WR_RDMA_READ, rdst, slot, length)
        w.set_wr_rdma(peer["rsrc"][1], peer["rsrc"][0] + off)
    elif op == "faa":
        w = wr(i, IBV_WR_ATOMIC_FETCH_AND_ADD, rdst, slot, 8)
        w.set_wr_atomic(peer["atom"][1], peer["atom"][0], 1)
    else:  # CMP_SWAP k -> k + 1: each succeeds if and only if each runs exactly once
        w = wr(i, IBV_WR_ATOMIC_CMP_AND_SWP, rdst, slot, 8)
        w.set_wr_atomic(peer["atom"][1], peer["atom"][0] + 8, ops["cas"], ops["cas"] + 1)
    ops[op] += 1
    return w


def check_rd_atomic(i: int, rdst: MR, read_src: bytes, done_ops: Counter[str],
                    bad: Counter[str]) -> None:  # fmt: skip
    """Check a completed READ or atomic (they complete in order)."""
    op = rc_op(i)
    if op not in ("read", "faa", "cas"):
        return
    slot = (i % 64) * READ_SRC
    if op == "read":
        off, length = read_span(i)
        if rdst.read(length, slot) != read_src[off : off + length]:
            bad["read_data"] += 1
    elif int.from_bytes(rdst.read(8, slot), NATIVE) != done_ops[op]:
        bad[f"{op}_original"] += 1  # executed twice, skipped, or out of order
    done_ops[op] += 1


# --- scenario: a peer killed in the middle of a transfer --------------------------------------
def server_kill(env: Env, ctl: Ctl) -> None:
    scq, rcq = make_cq(env), make_cq(env, 4096)
    qp = make_qp(env, IBV_QPT_RC, scq, rcq, recv_wr=256)
    mr = make_mr(env, 256 * 16384 + (4 << 20))
    for i in range(256):
        qp.post_recv(recv(i, mr, i * 16384, 16384))
    ctl.send("info", gid=env.gid.hex(), qp=qp_info(qp, 0), addr=mr.buf + 256 * 16384,
             rkey=mr.rkey)  # fmt: skip
    peer = ctl.recv("info")
    connect(env, qp, 0, peer["qp"], peer["gid"])
    ctl.barrier("ready")
    received = 0
    while env.left() > 1:  # the test kills this process long before
        for w in poll_some(rcq):
            received += 1
            qp.post_recv(recv(w.wr_id, mr, w.wr_id * 16384, 16384))
        time.sleep(0.0005)
    env.result["received"] = received
    env.errors.append("the server was not killed")


def client_kill(env: Env, ctl: Ctl) -> None:
    depth = 4 if env.args.kill_ops == "long_write" else 64  # WRs in flight
    cq = make_cq(env, 4096)
    qp = make_qp(env, IBV_QPT_RC, cq, send_wr=depth * 2)
    mr = make_mr(env, 4 << 20)
    mr.write(pattern("kill", 1 << 16), 1 << 16, 0)
    peer = ctl.recv("info")
    ctl.send("info", gid=env.gid.hex(), qp=qp_info(qp, 0))
    connect(env, qp, 0, peer["qp"], peer["gid"], timeout=env.args.qp_timeout,
            retry_cnt=env.args.retry_cnt)  # fmt: skip
    ctl.barrier("ready")
    posted = 0
    wcs: list[WC] = []
    reported = False
    error_at: float | None = None
    last_ok_at = time.monotonic()
    while True:
        now = time.monotonic()
        if now > env.deadline - 2:
            raise AgentError(f"kill: no error completion after {posted} posts, {len(wcs)} WCs")
        while error_at is None and posted - len(wcs) < depth:
            if env.args.kill_ops == "read":
                w = wr(posted, IBV_WR_RDMA_READ, mr, 1 << 16, 1 << 16)
                w.set_wr_rdma(peer["rkey"], peer["addr"])
            elif env.args.kill_ops == "long_write":  # longer than the requester's window
                w = wr(posted, IBV_WR_RDMA_WRITE, mr, 0, 4 << 20)
                w.set_wr_rdma(peer["rkey"], peer["addr"])
            elif posted % 2:
                w = wr(posted, IBV_WR_SEND, mr, 0, 16384)
            else:
                w = wr(posted, IBV_WR_RDMA_WRITE, mr, 0, 65536)
                w.set_wr_rdma(peer["rkey"], peer["addr"])
            qp.post_send(w)
            posted += 1
        got = poll_some(cq)
        for wc in got:
            if wc.status == IBV_WC_SUCCESS:
                last_ok_at = time.monotonic()
            elif error_at is None:
                error_at = time.monotonic()
        wcs.extend(got)
        if not reported and (error_at is not None or len(wcs) >= env.args.progress_after):
            reported = True  # the test kills the server now (or sees the early error)
            emit("PROGRESS", {"completed": len(wcs), "early_error": error_at is not None})
        if error_at is not None and len(wcs) == posted:
            break
        if error_at is not None and time.monotonic() - error_at > 5:
            raise AgentError(f"kill: only {len(wcs)} of {posted} WRs completed after the error")
        if not got:
            time.sleep(0.0002)
    ok = [w for w in wcs if w.status == IBV_WC_SUCCESS]
    bad = wcs[len(ok) :]
    env.result["posted"] = posted
    env.result["completed_ok"] = len(ok)
    env.result["wr_ids_in_order"] = [w.wr_id for w in wcs] == list(range(posted))
    env.result["ok_prefix"] = all(w.status == IBV_WC_SUCCESS for w in wcs[: len(ok)])
    env.result["first_error"] = wc_dict(bad[0]) if bad else None
    env.result["rest_status"] = dict(Counter(wc_status_str(w.status) for w in bad[1:]))
    env.result["qp_state"] = qp.qp_state
    env.result["stall_to_error_s"] = round((error_at or 0) - last_ok_at, 3)
    # posting on a QP in ERR completes at once with a flush
    w = wr(posted, IBV_WR_SEND, mr, 0, 64)
    qp.post_send(w)
    env.result["post_after_err"] = wc_dict(poll(env, cq, 1, "a post on the ERR QP")[0])


# --- scenario: many QPs at once ---------------------------------------------------------------
def server_many(env: Env, ctl: Ctl) -> None:
    nqp, rounds = env.args.qps, env.args.rounds
    rcq, scq = make_cq(env, 8192), make_cq(env, 256)
    qps = [make_qp(env, IBV_QPT_RC, scq, rcq, recv_wr=rounds) for _ in range(nqp)]
    slot = 4096
    rbuf = make_mr(env, nqp * rounds * 1024)
    region = make_mr(env, nqp * slot)
    for q, qp in enumerate(qps):
        for r in range(rounds):
            i = q * rounds + r
            qp.post_recv(recv(i, rbuf, i * 1024, 1024))
    ctl.send("info", gid=env.gid.hex(), qps=[qp_info(qp, 100 * q) for q, qp in enumerate(qps)],
             addr=region.buf, rkey=region.rkey)  # fmt: skip
    peer = ctl.recv("info")
    for q, qp in enumerate(qps):
        connect(env, qp, 100 * q, peer["qps"][q], peer["gid"])
    ctl.barrier("ready")
    t0 = time.monotonic()
    wcs = poll(env, rcq, nqp * rounds, "the SENDs on every QP")
    env.result["elapsed_s"] = round(time.monotonic() - t0, 3)
    index = {qp.qp_num: q for q, qp in enumerate(qps)}
    order: dict[int, list[int]] = {q: [] for q in range(nqp)}
    bad = 0
    for w in wcs:
        q = index.get(w.qp_num, -1)
        data = rbuf.read(w.byte_len, w.wr_id * 1024) if w.status == 0 else b""
        want = many_message(peer["name"], q, len(order.get(q, [])))
        if w.status != IBV_WC_SUCCESS or q < 0 or data != want:
            bad += 1
        if q >= 0:
            order[q].append(w.wr_id - q * rounds)
    env.result["received"] = len(wcs)
    env.result["bad"] = bad
    env.result["in_order"] = all(v == list(range(rounds)) for v in order.values())
    env.result["region_sha"] = sha(region.view)
    ctl.barrier("bye")


def many_message(tag: str, q: int, r: int) -> bytes:
    return f"{tag}:{q}:{r}:".encode() * 20


def client_many(env: Env, ctl: Ctl) -> None:
    nqp, rounds = env.args.qps, env.args.rounds
    cq = make_cq(env, 16384)
    qps = [make_qp(env, IBV_QPT_RC, cq, send_wr=rounds * 3) for _ in range(nqp)]
    slot = 4096
    src = make_mr(env, nqp * rounds * slot)
    back = make_mr(env, nqp * rounds * slot)
    tag = env.args.tag
    peer = ctl.recv("info")
    ctl.send("info", gid=env.gid.hex(), qps=[qp_info(qp, 7 * q) for q, qp in enumerate(qps)],
             name=tag)  # fmt: skip
    for q, qp in enumerate(qps):
        connect(env, qp, 7 * q, peer["qps"][q], peer["gid"])
    ctl.barrier("ready")
    t0 = time.monotonic()
    for r in range(rounds):  # round-robin over the QPs: their packets interleave
        for q, qp in enumerate(qps):
            i = q * rounds + r
            data = pattern(f"{tag}:{q}:{r}", slot)
            src.write(data, slot, i * slot)
            msg = many_message(tag, q, r)
            src.write(msg, len(msg), i * slot + slot - len(msg))
            # FENCE: the previous round's READ of this slot must not see this WRITE
            w1 = wr(3 * i, IBV_WR_RDMA_WRITE, src, i * slot, slot,
                    SIG | (IBV_SEND_FENCE if r else 0))  # fmt: skip
            w1.set_wr_rdma(peer["rkey"], peer["addr"] + q * slot)
            w2 = wr(3 * i + 1, IBV_WR_RDMA_READ, back, i * slot, slot)
            w2.set_wr_rdma(peer["rkey"], peer["addr"] + q * slot)
            w3 = wr(3 * i + 2, IBV_WR_SEND, src, i * slot + slot - len(msg), len(msg))
            qp.post_send(chain([w1, w2, w3]))
    wcs = poll(env, cq, nqp * rounds * 3, "the WRITE/READ/SEND WCs of every QP")
    env.result["elapsed_s"] = round(time.monotonic() - t0, 3)
    env.result["wcs"] = len(wcs)
    env.result["bad_status"] = dict(Counter(wc_status_str(w.status) for w in wcs
                                            if w.status != IBV_WC_SUCCESS))  # fmt: skip
    mismatches = 0
    for q in range(nqp):
        for r in range(rounds):
            i = q * rounds + r
            if back.read(slot, i * slot) != src.read(slot, i * slot):
                mismatches += 1
    env.result["read_mismatches"] = mismatches
    expect = b"".join(src.read(slot, (q * rounds + rounds - 1) * slot) for q in range(nqp))
    env.result["region_sha"] = sha(expect)
    ctl.barrier("bye")


# --- scenario: UD multicast across the link -------------------------------------------------
MCAST_GROUP = "239.7.7.7"
MCAST_QPN = 0xFFFFFF
MCAST_SIZES = (64, 300, 1000)


def _mcast_member(env: Env, n: int) -> tuple[CQ, QP, MR]:
    """A UD QP attached to MCAST_GROUP with ``n`` receives posted."""
    cq = make_cq(env)
    qp = make_qp(env, IBV_QPT_UD, cq)
    mr = make_mr(env, 1 << 16)
    qp.attach_mcast(GID(f"::ffff:{MCAST_GROUP}"))
    for i in range(n):
        qp.post_recv(recv(i, mr, i * 0x2000, 0x2000))
    return cq, qp, mr


def _mcast_check(env: Env, cq: CQ, mr: MR, sender_qpn: int, what: str) -> list[str]:
    """The received messages' SHA-256, after checking their GRH and source QP."""
    shas = []
    for w in poll(env, cq, len(MCAST_SIZES), what):
        env.check(w.status == IBV_WC_SUCCESS and w.src_qp == sender_qpn, f"{what}: {wc_dict(w)}")
        grh = mr.read(GRH_LEN, w.wr_id * 0x2000)
        env.check(socket.inet_ntoa(grh[36:40]) == MCAST_GROUP, f"{what}: GRH {grh.hex()}")
        shas.append(sha(mr.read(w.byte_len - GRH_LEN, w.wr_id * 0x2000 + GRH_LEN)))
    return shas


def server_mcast(env: Env, ctl: Ctl) -> None:
    """A member on the other host: the group's datagrams cross the link."""
    cq, _qp, mr = _mcast_member(env, len(MCAST_SIZES))
    ctl.send("ready")
    peer = ctl.recv("sender")
    env.result["recv_sha"] = _mcast_check(env, cq, mr, peer["qpn"], "multicast receives")
    ctl.barrier("bye")


def client_mcast(env: Env, ctl: Ctl) -> None:
    """The sender, with a member of its own on its device (the kernel loops the
    group's datagrams back to it)."""
    mcq, _member, mmr = _mcast_member(env, len(MCAST_SIZES))
    cq = make_cq(env)
    sender = make_qp(env, IBV_QPT_UD, cq)
    mr = make_mr(env, 1 << 16)
    ctl.recv("ready")
    ctl.send("sender", qpn=sender.qp_num)
    gr = GlobalRoute(dgid=GID(f"::ffff:{MCAST_GROUP}"), sgid_index=env.gid_index, hop_limit=1)
    ah = AH(env.pd, attr=AHAttr(is_global=1, port_num=1, gr=gr))
    env.keep.append(ah)
    shas = []
    for i, n in enumerate(MCAST_SIZES):
        d = pattern(f"mcast{i}", n)
        mr.write(d, n, i * 0x2000)
        shas.append(sha(d))
        w = wr(i, IBV_WR_SEND, mr, i * 0x2000, n)
        w.set_wr_ud(ah, MCAST_QPN, QKEY)
        sender.post_send(w)
    env.result["send_wcs"] = [wc_dict(w) for w in poll(env, cq, len(MCAST_SIZES), "sends")]
    env.result["sent_sha"] = shas
    env.result["loop_sha"] = _mcast_check(env, mcq, mmr, sender.qp_num, "looped-back receives")
    env.result["counters"] = {k: v for k, v in env.ctx.hca.counters.items() if "mcast" in k}
    ctl.barrier("bye")


SCENARIOS: dict[str, tuple[Callable[[Env, Ctl], None], Callable[[Env, Ctl], None]]] = {
    "rc_opcodes": (server_rc_opcodes, client_rc_opcodes),
    "uc_ud": (server_uc_ud, client_uc_ud),
    "mcast": (server_mcast, client_mcast),
    "large": (server_large, client_large),
    "stream": (server_stream, client_stream),
    "kill": (server_kill, client_kill),
    "many": (server_many, client_many),
}


# --- setup and main ---------------------------------------------------------------------------
def open_device(args: argparse.Namespace) -> tuple[Context, int, bytes]:
    """Configure and open ``svnet``; the GID index of the address family asked for."""
    from softverbs.cli.main import main as softverbs_main

    os.environ["SOFTVERBS_CONFIG"] = os.path.join(
        args.workdir, f"links-{args.role}-{os.getpid()}.json"
    )
    if softverbs_main(["link", "add", DEVICE, "--netdev", args.netdev]) != 0:
        raise AgentError(f"softverbs link add {DEVICE} --netdev {args.netdev} failed")
    if args.cc and softverbs_main(["link", "set", DEVICE, "cc", *args.cc.split()]) != 0:
        raise AgentError(f"softverbs link set {DEVICE} cc {args.cc} failed")
    ctx = Context(name=DEVICE)
    for index in range(16):
        raw = ctx.query_gid(1, index).raw
        if not any(raw):
            break
        v4 = raw[:12] == b"\0" * 10 + b"\xff\xff"
        if args.gid == "ipv4" and v4 and socket.inet_ntoa(raw[12:]) == args.ip:
            return ctx, index, raw
        if args.gid == "ipv6-ll" and raw[:8] == b"\xfe\x80" + bytes(6):
            return ctx, index, raw
    ctx.close()
    raise AgentError(f"no {args.gid} GID for {args.ip} on {args.netdev}")


def serve(args: argparse.Namespace, ctx: Context, gid_index: int, gid: bytes,
          deadline: float, result: dict[str, Any]) -> list[str]:  # fmt: skip
    """Run the scenario; a server runs one session per client, each in a thread."""
    server_fn, client_fn = SCENARIOS[args.scenario]
    port = ctx.query_port(1)
    errors: list[str] = []

    def session(ctl: Ctl, out: dict[str, Any]) -> None:
        pd = PD(ctx)
        env = Env(args, ctx, pd, gid_index, gid, port.active_mtu, mtu_bytes(port.active_mtu),
                  deadline, out, errors)  # fmt: skip
        try:
            (server_fn if args.role == "server" else client_fn)(env, ctl)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            out["traceback"] = traceback.format_exc()
        finally:
            ctl.close()

    if args.role == "client":
        session(Ctl.connect(args.peer, args.port, deadline), result)
        return errors
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((args.ip, args.port))
    lsock.listen(args.clients)
    lsock.settimeout(max(0.1, deadline - time.monotonic()))
    emit("LISTENING", {"port": args.port})
    threads = []
    sessions: list[dict[str, Any]] = []
    for _ in range(args.clients):
        conn, peer = lsock.accept()
        out: dict[str, Any] = {"peer": peer[0]}
        sessions.append(out)
        t = threading.Thread(target=session, args=(Ctl(conn, deadline), out), daemon=True)
        t.start()
        threads.append(t)
    lsock.close()
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    if args.clients == 1:
        result.update(sessions[0])
    else:
        result["sessions"] = sessions
    return errors


def engine_state(ctx: Context) -> list[dict[str, Any]]:
    """Transport state of every QP, for the report of a failed run."""
    out = []
    now = ctx.runtime.clock.now()
    hca = getattr(ctx, "hca", None)
    for qp in list(getattr(hca, "qps", {}).values())[:8]:
        d: dict[str, Any] = {}
        for name in ("qpn", "state", "una", "npsn", "epsn", "rd_out", "retry_left",
                     "retry_episode", "blocked", "nak_sent", "resp_op"):  # fmt: skip
            d[name] = getattr(qp, name, None)
        for name in ("deadline", "rnr_until", "timer_at"):
            v = getattr(qp, name, None)
            d[name] = None if v is None else round(v - now, 4)
        d["inflight"] = [(w.wr_id, w.psn, w.npkts, w.tx, w.rxd, w.ackd)
                         for w in list(getattr(qp, "inflight", []))[:4]]  # fmt: skip
        out.append(d)
    return out


def rate_state(ctx: Context) -> list[dict[str, Any]]:
    """Each QP's rate limiter, where its congestion control has one (DCQCN): the rate
    cuts it made and its current and line rates, bit/s."""
    out = []
    for qp in list(getattr(getattr(ctx, "hca", None), "qps", {}).values()):
        cc = getattr(getattr(qp, "req", None), "cc", None)
        if hasattr(cc, "cuts"):
            out.append({"qpn": qp.qpn, "kind": type(cc).__name__, "cuts": cc.cuts,
                        "rc": cc.rc, "line_rate": cc.line_rate})  # fmt: skip
    return out


def udp_stats(prefix: str = "Udp:", path: str = "/proc/net/snmp") -> dict[str, int]:
    """This namespace's UDP counters (/proc/net/snmp): were datagrams lost in buffers?"""
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.startswith(prefix)]
        return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:], strict=True) if int(v)}
    except (OSError, IndexError, ValueError):
        return {}


def net_stats(netdev: str) -> dict[str, Any]:
    """Where else a datagram can vanish: IP counters, the link's drops, the neighbours."""
    out: dict[str, Any] = {"ip": udp_stats("Ip:")}
    out["ipext"] = udp_stats("IpExt:", "/proc/net/netstat")
    for key, cmd in (("link", ["ip", "-s", "-j", "link", "show", "dev", netdev]),
                     ("neigh", ["ip", "-j", "neigh", "show", "dev", netdev])):  # fmt: skip
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
            out[key] = json.loads(r.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            out[key] = repr(exc)
    if isinstance(out["link"], list) and out["link"]:
        out["link"] = out["link"][0].get("stats64", out["link"][0])
    return out


def mtu_bytes(mtu_enum: int) -> int:
    return 128 << mtu_enum


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--role", choices=("server", "client"), required=True)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    p.add_argument("--netdev", required=True, help="this namespace's interface")
    p.add_argument("--ip", required=True, help="this agent's IPv4 address")
    p.add_argument("--peer", default="", help="the server's IPv4 address (clients)")
    p.add_argument("--port", type=int, default=18515, help="TCP control port")
    p.add_argument("--workdir", required=True)
    p.add_argument("--deadline", type=float, default=60, help="seconds until the agent gives up")
    p.add_argument("--gid", choices=("ipv4", "ipv6-ll"), default="ipv4")
    p.add_argument("--clients", type=int, default=1, help="server: clients to serve at once")
    p.add_argument("--size", type=int, default=64 << 20, help="large: message size")
    p.add_argument("--count", type=int, default=300, help="stream: messages per QP type")
    p.add_argument("--msg-size", type=int, default=4096, help="stream: largest RC/UC message")
    p.add_argument("--grace", type=float, default=0.3, help="stream: quiet time before done")
    # 17 is 0.54 s: a Python device on a busy CI host can take longer than the usual
    # 14 (67 ms) to answer, and go-back-N resends a whole window at every timeout
    p.add_argument("--qp-timeout", type=int, default=17, help="RC local ACK timeout code")
    p.add_argument("--retry-cnt", type=int, default=7)
    p.add_argument("--progress-after", type=int, default=200, help="kill: WCs before PROGRESS")
    p.add_argument("--kill-ops", choices=("write_send", "read", "long_write"), default="write_send",
                   help="kill: what the client streams")  # fmt: skip
    p.add_argument("--qps", type=int, default=64, help="many: QP pairs")
    p.add_argument("--rounds", type=int, default=4, help="many: rounds of WRITE/READ/SEND")
    p.add_argument("--tag", default="c0", help="many: this client's name")
    p.add_argument("--cc", default="", help="the device's congestion control: softverbs link "
                   "set svnet cc KIND [KEY=VALUE ...], e.g. 'dcqcn'")  # fmt: skip
    args = p.parse_args()
    start = time.monotonic()
    deadline = start + args.deadline
    start_watchdog(args.deadline + 1, args.role, args.scenario)
    result: dict[str, Any] = {"role": args.role, "scenario": args.scenario, "pid": os.getpid()}
    try:
        ctx, gid_index, gid = open_device(args)
    except Exception as exc:
        emit("RESULT", result | {"ok": False, "errors": [f"setup: {type(exc).__name__}: {exc}"],
                                 "traceback": traceback.format_exc()})  # fmt: skip
        return 2
    result["gid_index"] = gid_index
    result["gid"] = gid.hex()
    result["faults_env"] = os.environ.get("SOFTVERBS_FAULTS", "")
    try:
        errors = serve(args, ctx, gid_index, gid, deadline, result)
    except Exception as exc:
        errors = [f"{type(exc).__name__}: {exc}"]
        result["traceback"] = traceback.format_exc()
    result["counters"] = {k: v for k, v in counters(ctx).items() if v}
    result["rate"] = rate_state(ctx)
    result["udp"] = udp_stats()
    if errors:
        result["net"] = net_stats(args.netdev)
        try:
            result["engine_state"] = engine_state(ctx)
        except Exception as exc:  # diagnostics only
            result["engine_state"] = repr(exc)
    faults = getattr(ctx.runtime, "faults", None)
    if faults is not None:
        result["fault_stats"] = dict(getattr(faults, "stats", {}))
    t = time.monotonic()
    ctx.close()
    result["close_s"] = round(time.monotonic() - t, 3)
    result["threads_left"] = sorted(t.name for t in threading.enumerate()
                                    if t is not threading.current_thread()
                                    and not isinstance(t, threading.Timer))  # fmt: skip
    result["runtime_s"] = round(time.monotonic() - start, 3)
    if any(name.startswith("softverbs") for name in result["threads_left"]):
        errors.append(f"softverbs threads left after close: {result['threads_left']}")
    result["errors"] = errors
    result["ok"] = not errors
    emit("RESULT", result)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
