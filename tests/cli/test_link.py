"""``softverbs link``: what ``add`` refuses, and ``show`` agreeing with ``rdma link show``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clikit import assert_user_error, softverbs_cli

from softverbs.cli.link import MAX_NAME, name_error


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
