"""tgt's iSER target (Debian tgt 1.0.85) with libiscsi's initiator tools
(Debian libiscsi-bin 1.19), over ``iser://``.

tgtd listens for iSER on ``::`` with RDMA_OPTION_ID_AFONLY and on
``0.0.0.0`` at the same port (softverbs once refused the option with ENOSYS).
Its iSER login checks the initiator-name ACL even with ``-I ALL``, so the
initiator's name is bound too (``-Q``), as tgt 1.0.85 needs on any device.
tgtd needs root (it is skipped, with the reason, otherwise).

Verdicts: iscsi-inq reads the LUN's INQUIRY (``Product:VIRTUAL-DISK``),
iscsi-readcapacity16 its size; iscsi-test-cu's ``SCSI.Verify10.Simple``
reads the LUN -- filled with random bytes -- over iSER (RDMA WRITEs into the
initiator) and sends every block back in VERIFY with BYTCHK (RDMA READs by
the target), which tgt compares with its store; ``SCSI.Verify10.Mismatch``
shows that compare catches one changed byte.  Data corrupted either way fails.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator

import pytest
from pair_kit import Server, free_port, need, on_softverbs, run, sv_env

TARGET = "iqn.2026-01.org.softverbs:tgt"
INITIATOR = "iqn.2026-01.org.softverbs:init"
LUN_BYTES = 16 << 20


@pytest.fixture(scope="module")
def iser_target(host_service: str,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], str]]:
    """One tgtd for the module: an iSER target with one 16 MiB LUN of random bytes."""
    if os.geteuid() != 0:
        pytest.skip("tgtd needs root (it is the only entry here that does)")
    tgtd = need("tgtd", "tgt")
    tgtadm = need("tgtadm", "tgt")
    env = sv_env(host_service)
    control = str(1000 + os.getpid() % 30000)  # tgtd's management channel: a private one
    # tgtd keeps its iSER port in a signed short: one below 32768 (the RDMA CM's
    # port space is the private service's own, so any such port is free there)
    port = random.randrange(20000, 32000)
    server = Server(on_softverbs(tgtd, "-f", "-C", control, "--iscsi",
                                 f"portal=127.0.0.1:{free_port()}", "--iser",
                                 f"port={port},pool_sz_mb=64"), env)  # fmt: skip
    lun = tmp_path_factory.mktemp("tgt") / "lun.img"
    lun.write_bytes(os.urandom(LUN_BYTES))
    admin = [tgtadm, "-C", control, "--lld", "iser"]
    try:
        server.wait_for(lambda: "bs_init" in server.output(), "tgtd ready")
        for args in (["--op", "new", "--mode", "target", "--tid", "1", "-T", TARGET],
                     ["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1",
                      "-b", str(lun)],
                     ["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"],
                     ["--op", "bind", "--mode", "target", "--tid", "1", "-Q", INITIATOR]):
            r = subprocess.run(admin + args, capture_output=True, text=True, check=False)
            assert r.returncode == 0, f"tgtadm {args}: {r.stdout}{r.stderr}\n{server.output()}"
        yield env, f"iser://127.0.0.1:{port}/{TARGET}/1"
    finally:
        print(server.stop(kill=True).out)  # tgtd ignores SIGTERM; its LUN is a temporary file


def test_iscsi_inq(iser_target: tuple[dict[str, str], str]) -> None:
    env, url = iser_target
    r = run(on_softverbs(need("iscsi-inq", "libiscsi-bin"), "-i", INITIATOR, url), env)
    assert r.code == 0 and "Product:VIRTUAL-DISK" in r.out, str(r)


def test_iscsi_readcapacity16(iser_target: tuple[dict[str, str], str]) -> None:
    env, url = iser_target
    r = run(on_softverbs(need("iscsi-readcapacity16", "libiscsi-bin"), "-i", INITIATOR, url),
            env)  # fmt: skip
    assert r.code == 0 and f"Total size:{LUN_BYTES}" in r.out, str(r)


@pytest.mark.parametrize("test", ["SCSI.Verify10.Simple", "SCSI.Verify10.Mismatch"])
def test_iscsi_data_verified_by_the_target(iser_target: tuple[dict[str, str], str],
                                           test: str) -> None:  # fmt: skip
    env, url = iser_target
    r = run(on_softverbs(need("iscsi-test-cu", "libiscsi-bin"), "-d", "-n", "-i", INITIATOR,
                         "-t", test, url), env, timeout=300)  # fmt: skip
    assert r.code == 0, str(r)
    # CUnit's summary: one test run and passed, none skipped as unsupported
    summary = [line.split() for line in r.out.splitlines() if line.strip().startswith("tests ")]
    assert summary and summary[0][1:5] == ["1", "1", "1", "0"], str(r)
    asserts = [line.split() for line in r.out.splitlines() if line.strip().startswith("asserts")]
    assert asserts and int(asserts[0][3]) > 0 and asserts[0][4] == "0", str(r)
    assert "SKIPPED" not in r.out, str(r)
