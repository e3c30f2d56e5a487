"""``softverbs link``: what ``add`` refuses, and ``show`` agreeing with ``rdma link show``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clikit import assert_user_error, softverbs_cli

from softverbs.cli.link import MAX_NAME, name_error
from softverbs.verbs.registry import DeviceSpec, Registry


def _registry_specs(tmp_path: Path) -> list[DeviceSpec]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOFTVERBS_CONFIG", str(tmp_path / "links.json"))
        return Registry().specs()


@pytest.mark.parametrize("name", ["a/b", "a b", "tab\tname", "x" * (MAX_NAME + 1), "", ".."])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    r = softverbs_cli(tmp_path, "link", "add", name, "--addr", "127.0.0.1")
    assert_user_error(r, "name")
    assert not (tmp_path / "links.json").exists()


def test_names_rdma_accepts() -> None:
    assert name_error("rxe_0.test-1", []) is None
    assert name_error("x" * MAX_NAME, []) is None
    assert "already exists" in (name_error("sv0", ["sv0"]) or "")


def test_taken_names_addresses_and_netdevs(tmp_path: Path) -> None:
    assert_user_error(
        softverbs_cli(tmp_path, "link", "add", "sv0", "--addr", "127.0.0.1"),
        "'sv0'",
        "already exists",
    )
    assert softverbs_cli(tmp_path, "link", "add", "a", "--addr", "127.0.0.9").returncode == 0
    assert_user_error(
        softverbs_cli(tmp_path, "link", "add", "b", "--addr", "127.0.0.9"),
        "--addr 127.0.0.9",
        "'a'",
    )
    assert_user_error(
        softverbs_cli(tmp_path, "link", "add", "c", "--netdev", "nosuchif0"), "--netdev nosuchif0"
    )
    assert_user_error(
        softverbs_cli(tmp_path, "link", "add", "d", "--addr", "not-an-ip"), "--addr", "not-an-ip"
    )


def test_an_address_this_host_does_not_have(tmp_path: Path) -> None:
    """192.0.2.0/24 is TEST-NET-1: no host has it.  The hint is errno 99's, not 98's."""
    r = softverbs_cli(tmp_path, "link", "add", "far", "--addr", "192.0.2.7")
    line = assert_user_error(r, "--addr 192.0.2.7", "no such address")
    assert "another process" not in line
    assert not (tmp_path / "links.json").exists()


def test_link_show_and_rdma_link_show_agree(tmp_path: Path) -> None:
    for args in (["byaddr", "--addr", "127.0.0.7"], ["bydev", "--netdev", "lo"]):
        assert softverbs_cli(tmp_path, "link", "add", *args).returncode == 0
    mine = json.loads(softverbs_cli(tmp_path, "link", "show", "-j").stdout)
    rdma = json.loads(softverbs_cli(tmp_path, "exec", "rdma", "link", "show", "-j").stdout)
    assert [{k: v for k, v in row.items() if k != "addrs"} for row in mine] == rdma
    by_name = {row["ifname"]: row for row in mine}
    assert by_name["byaddr"]["netdev"] == "lo"  # the interface that carries 127.0.0.7
    assert by_name["byaddr"]["addrs"] == ["127.0.0.7"]
    assert "netdev" not in by_name["sv0"]  # in-process: no netdev, as rdma shows it
    text = softverbs_cli(tmp_path, "link", "show").stdout.splitlines()
    rdma_text = softverbs_cli(tmp_path, "exec", "rdma", "link", "show").stdout.splitlines()
    assert [line.split(" addrs ")[0] for line in text] == rdma_text


def test_show_and_del_mistakes(tmp_path: Path) -> None:
    assert_user_error(softverbs_cli(tmp_path, "link", "show", "nodev"), "'nodev'")
    assert_user_error(softverbs_cli(tmp_path, "link", "del", "nodev"), "'nodev'")
    assert_user_error(softverbs_cli(tmp_path, "link", "del", "sv0"), "in-process")


def test_set_congestion_control(tmp_path: Path) -> None:
    assert softverbs_cli(tmp_path, "link", "add", "cc0", "--addr", "127.0.0.9").returncode == 0
    r = softverbs_cli(tmp_path, "link", "set", "cc0", "cc", "dcqcn", "rpg_ai_rate=10",
                      "min_time_between_cnps=0x32")  # fmt: skip
    assert r.returncode == 0, r.stderr
    row = next(x for x in json.loads(softverbs_cli(tmp_path, "link", "show", "-j").stdout)
               if x["ifname"] == "cc0")  # fmt: skip
    assert row["cc"] == "dcqcn"
    assert row["cc_params"] == {"min_time_between_cnps": 50, "rpg_ai_rate": 10}
    text = softverbs_cli(tmp_path, "link", "show", "cc0").stdout
    assert "cc dcqcn min_time_between_cnps=50 rpg_ai_rate=10" in text
    # the device is built with it
    spec = next(s for s in _registry_specs(tmp_path) if s.name == "cc0")
    assert spec.cc == "dcqcn" and dict(spec.cc_params)["rpg_ai_rate"] == 10
    # back to the default
    assert softverbs_cli(tmp_path, "link", "set", "cc0", "cc", "slow_restart").returncode == 0
    row = json.loads(softverbs_cli(tmp_path, "link", "show", "-j", "cc0").stdout)[0]
    assert row["cc"] == "slow_restart" and row["cc_params"] == {}


def test_set_congestion_control_mistakes(tmp_path: Path) -> None:
    assert softverbs_cli(tmp_path, "link", "add", "cc1", "--addr", "127.0.0.9").returncode == 0
    before = (tmp_path / "links.json").read_text()
    for args, named in [
        (["dcqcn", "rpg_min_dec_fac=101"], ("rpg_min_dec_fac=101", "0..100")),
        (["dcqcn", "cnp_dscp=64"], ("cnp_dscp=64", "0..63")),
        (["dcqcn", "rpg_nope=1"], ("'rpg_nope'", "not a DCQCN parameter")),
        (["dcqcn", "rpg_ai_rate"], ("KEY=VALUE",)),
        (["dcqcn", "rpg_ai_rate=fast"], ("rpg_ai_rate", "not an integer")),
        (["cubic"], ("'cubic'", "slow_restart, none, dcqcn")),
        (["none", "rpg_ai_rate=5"], ("takes no parameters",)),
    ]:
        assert_user_error(softverbs_cli(tmp_path, "link", "set", "cc1", "cc", *args), *named)
    assert (tmp_path / "links.json").read_text() == before  # nothing was written
    assert_user_error(softverbs_cli(tmp_path, "link", "set", "nodev", "cc", "dcqcn"), "'nodev'")
    assert_user_error(softverbs_cli(tmp_path, "link", "set", "sv0", "cc", "dcqcn"), "in-process")
