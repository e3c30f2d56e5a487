"""The verbs sanitizer (docs/sanitizer.md): each check's report, on the
in-process device and on the host device, and no report for correct programs.

The programs are ``tests/data/sanitizer_misuse.py``: one per check, each
committing its misuse once (and with ``--correct``, the same program without
it).  A report's first line is ``softverbs-sanitizer: CHECK``; the tests read
the sequence of checks reported and the details of the first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from softverbs import sanitizer
from softverbs.engine.rings import RecvWQE, local_work_ring

PROGRAM = Path(__file__).resolve().parents[2] / "examples" / "sanitizer_misuse.py"
HEADER = "softverbs-sanitizer: "
#: SOFTVERBS_FAULTS for the SRQ program: the first SEND packet passes, the rest are lost
SRQ_FAULTS = "kinds=send;delay=0.000001;limit=1|kinds=send;drop=1"

#: check -> (the checks reported, in order; lines the first report must hold)
EXPECTED: dict[str, tuple[list[str], list[str]]] = {
    "send-buffer-changed": (["send-buffer-changed"],
                            ["wr: wr_id 0x1, IBV_WR_SEND, 64 bytes", "seen: CRC-32 "]),
    "mr-in-use": (["mr-in-use"], ["outstanding: 1 WR(s) use it", "wr_id 0x1"]),
    "ah-in-use": (["ah-in-use"], ["outstanding: 1 WR(s) use it", "wr_id 0x1"]),
    "mw-in-use": (["mw-in-use"], ["outstanding: 1 WR(s) use it", "wr_id 0x9"]),
    "unsignaled-send-queue": (["unsignaled-send-queue"],
                              ["send queue: 4 unsignaled WRs in a row fill all 4 slots"]),
    "send-queue-full": (["unsignaled-send-queue", "send-queue-full"], []),
    "cq-too-small": (["cq-too-small"],
                     ["cqe 8", "outstanding: 9 posted WRs will complete into it and 0",
                      "create it with cqe >= 16"]),
    "cq-overrun": (["cq-too-small", "cq-too-small", "cq-overrun", "cq-overrun"],
                   ["filled by: QP 0x", "create the CQ with cqe >= 16"]),
    "qp-destroyed-while-flushing": (["qp-destroyed-while-flushing"],
                                    ["destroyed in IBV_QPS_ERR",
                                     "4 flushed completion(s) of this QP were not yet polled"]),
    "srq-qp-destroyed-early": (["srq-qp-destroyed-early"], ["the receive WQE wr_id 0x64"]),
    "deferred-wr-never-rung": (["deferred-wr-never-rung"],
                               ["1 WR(s) written to the send queue and never handed",
                                "wr_ids: 0x1"]),
    "leak": (["leak"], ["objects: 7 never destroyed", "qp: handle"]),
    "mr-unmapped": (["mr-unmapped"], ["object: MR lkey", "was unmapped or replaced by its owner",
                                      "fix: deregister the region"]),
}
#: checks only the host device makes: the in-process device reaches a region's
#: memory directly, and does not check its mapping (docs/architecture.md)
HOST_ONLY = {"mr-unmapped"}


@pytest.fixture(params=["inproc", "host"])
def kind_env(request: pytest.FixtureRequest) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    if request.param == "host":
        env["SOFTVERBS_SERVICE"] = request.getfixturevalue("host_service")
    else:
        env["SOFTVERBS_SERVICE"] = "0"
    return env


#: a Python program's leaks are reported when asked for (docs/sanitizer.md)
SETTING = {"leak": "1:detect_leaks=1"}


def run(env: dict[str, str], check: str, *args: str,
        sanitize: str = "") -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = dict(env, SOFTVERBS_SANITIZE=sanitize or SETTING.get(check, "1"))
    if check == "srq-qp-destroyed-early":
        env["SOFTVERBS_FAULTS"] = SRQ_FAULTS
    return subprocess.run([sys.executable, str(PROGRAM), check, *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def reports(stderr: str) -> list[list[str]]:
    """The reports in ``stderr``: each its first line and its indented lines."""
    out: list[list[str]] = []
    for line in stderr.splitlines():
        if line.startswith(HEADER):
            out.append([line])
        elif out and line.startswith("    "):
            out[-1].append(line)
    return out


def test_every_check_has_a_program_and_a_rule() -> None:
    assert set(EXPECTED) == set(sanitizer.CHECKS)


@pytest.mark.parametrize("check", sorted(EXPECTED))
def test_misuse_is_reported(kind_env: dict[str, str], check: str) -> None:
    if check in HOST_ONLY and kind_env.get("SOFTVERBS_SERVICE") == "0":
        pytest.skip(f"{check} is the host device's check (the in-process device has none)")
    r = run(kind_env, check)
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr
    got = reports(r.stderr)
    names = [rep[0][len(HEADER):] for rep in got]
    sequence, lines = EXPECTED[check]
    assert sorted(names) == sorted(sequence), r.stderr
    first = next(rep for rep in got if rep[0] == HEADER + check)
    assert first[1] == f"    rule: {sanitizer.CHECKS[check]}"
    text = "\n".join(first)
    for want in lines:
        assert want in text, text
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("check", sorted(EXPECTED))
def test_correct_program_has_no_report(kind_env: dict[str, str], check: str) -> None:
    if check in HOST_ONLY and kind_env.get("SOFTVERBS_SERVICE") == "0":
        pytest.skip(f"{check} is the host device's check (the in-process device has none)")
    r = run(kind_env, check, "--correct")
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr
    assert HEADER not in r.stderr, r.stderr


def test_where_is_the_program_line_in_process() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    r = run(dict(env, SOFTVERBS_SERVICE="0"), "send-buffer-changed")
    first = reports(r.stderr)[0]
    where = first[first.index("    where:") + 1:]
    assert any("sanitizer_misuse.py" in w and "in send_buffer_changed" in w for w in where), first


def test_json_reports(kind_env: dict[str, str]) -> None:
    r = run(kind_env, "mr-in-use", sanitize="json")
    objs = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    assert [o["check"] for o in objs] == ["mr-in-use"], r.stderr
    assert objs[0]["rule"] == sanitizer.CHECKS["mr-in-use"]
    assert objs[0]["sanitizer"] == "softverbs" and "wr_id 0x1" in objs[0]["outstanding"]
    assert HEADER not in r.stderr


def test_halt_on_error_stops_at_the_first_report(kind_env: dict[str, str]) -> None:
    r = run(kind_env, "mr-in-use", sanitize="1:halt_on_error=1")
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stderr)
    assert "done" not in r.stdout
    assert [rep[0] for rep in reports(r.stderr)] == [HEADER + "mr-in-use"]


def test_deferred_wrs_reported_after_the_timeout(kind_env: dict[str, str]) -> None:
    """A program that goes on posting while a QP holds deferred WRs unrung is told
    once the timeout passes -- and not again at exit."""
    r = run(kind_env, "deferred-wr-never-rung", "--late", sanitize="1:deferred_timeout=1")
    got = reports(r.stderr)
    assert [rep[0] for rep in got] == [HEADER + "deferred-wr-never-rung"], r.stderr
    assert any("holds them unrung for 1." in line for line in got[0]), got[0]


#: SOFTVERBS_FAULTS for the remote window: a WRITE's first packet passes, the rest are lost
WRITE_FAULTS = "kinds=write;delay=0.000001;limit=1|kinds=write;drop=1"


@pytest.mark.parametrize("how", ["dealloc", "local-inv", "correct"])
def test_a_window_deallocated_under_a_peers_write(kind_env: dict[str, str], how: str) -> None:
    correct = how == "correct"
    args = ["--remote", *(["--correct"] if correct else []),
            *(["--invalidate"] if how == "local-inv" else [])]  # fmt: skip
    r = run(dict(kind_env, SOFTVERBS_FAULTS=WRITE_FAULTS), "mw-in-use", *args)
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr
    got = reports(r.stderr)
    if correct:
        assert got == [], r.stderr
    else:
        assert [rep[0] for rep in got] == [HEADER + "mw-in-use"], r.stderr
        assert any("is receiving an RDMA WRITE through it" in line for line in got[0])
        assert any(("by LOCAL_INV" in line) == (how == "local-inv") for line in got[0][2:3])


def test_python_leaks_only_when_asked(kind_env: dict[str, str]) -> None:
    """An object a Python program still holds at exit is not reported by
    default: the garbage collector and exit release it."""
    r = run(kind_env, "leak", sanitize="1")
    assert r.returncode == 0 and HEADER not in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["2", "json:halt_on_error=yes", "1:verbose=1",
                                   "1:deferred_timeout=soon"])
def test_a_malformed_setting_is_named(value: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    r = run(dict(env, SOFTVERBS_SERVICE="0"), "leak", "--correct", sanitize=value)
    assert r.returncode != 0
    assert f"SOFTVERBS_SANITIZE={value!r}" in r.stderr, r.stderr


def test_off_means_not_attached() -> None:
    """Without SOFTVERBS_SANITIZE nothing watches the engine."""
    from softverbs import CQ, PD, Context
    from softverbs.verbs import registry, world

    reg = registry.Registry()
    world.push(reg)
    try:
        ctx = Context(name="sv0")
        pd, cq = PD(ctx), CQ(ctx, 4)
        assert reg.host.sanitizer is None
        assert all(dev.hca.observer is None for dev in reg.host.devices.values())
        cq.close()
        pd.close()
        ctx.close()
    finally:
        world.pop(reg)


def test_exec_sanitize_sets_the_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    cmd = [sys.executable, "-m", "softverbs", "exec"]
    for flag, want in (("--sanitize", "1"), ("--sanitize=json:halt_on_error=1",
                                             "json:halt_on_error=1")):  # fmt: skip
        r = subprocess.run([*cmd, flag, "--", sys.executable, "-c",
                            "import os; print(os.environ['SOFTVERBS_SANITIZE'])"],
                           env=env, capture_output=True, text=True, timeout=60, check=False)
        assert r.stdout.strip() == want, r.stdout + r.stderr
    r = subprocess.run([*cmd, "--sanitize=2", "--", "true"], env=env, capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("softverbs exec: --sanitize: "), r.stderr
    assert "Traceback" not in r.stderr


def test_the_seed_004_example_has_no_report(kind_env: dict[str, str]) -> None:
    """examples/sig_pipelining.py (seed 004's storage target, with a corrupted
    sector) is a correct program: signature errors are not verbs misuse."""
    example = PROGRAM.parent / "sig_pipelining.py"
    env = dict(kind_env, SOFTVERBS_SANITIZE="1")
    r = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True,
                       timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert HEADER not in r.stderr, r.stderr


def test_receives_count_from_their_post_not_their_doorbell() -> None:
    """cq-too-small counts a receive from its post (the ring's ``pi``): on the host
    device the doorbell of a send posted after it can reach the service first, and
    the send's completion must not take the receives' place in the report."""
    rq = local_work_ring(8)
    for i in range(8):
        rq.push(RecvWQE(100 + i, [], 0))
    cq = object()
    qp = SimpleNamespace(send_cq=None, sq=None, recv_cq=cq, rq=rq,
                         resp=SimpleNamespace(rq_next=0))  # fmt: skip
    assert rq.db == 0  # posted, the doorbell not yet taken
    assert sanitizer._may_complete(qp, cq) == 8  # type: ignore[arg-type]
    rq.ring(8)
    rq.latch()
    assert sanitizer._may_complete(qp, cq) == 8  # type: ignore[arg-type]
    qp.resp.rq_next = 3  # three used
    assert sanitizer._may_complete(qp, cq) == 5  # type: ignore[arg-type]
