"""``softverbs devinfo`` prints what ``ibv_devinfo`` prints, in its format.

The reference is ``data/ibv_devinfo_v44_fields.txt``: every line start of
``ibv_devinfo -v`` in order, derived from the format strings of rdma-core
v44's devinfo.c.  The output of ``softverbs devinfo -v`` must walk that
list in order (lines marked optional may be absent; no other line may
appear), and the values must have the C tool's formats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from clikit import assert_user_error, softverbs_cli

from softverbs import Context
from softverbs.cli import devinfo, rdma
from softverbs.verbs import registry

REFERENCE = Path(__file__).with_name("data") / "ibv_devinfo_v44_fields.txt"


@dataclass
class RefLine:
    head: str
    optional: bool
    verbose: bool  #: printed only with -v (the file's "(-v)" sections)


def reference(verbose: bool = True) -> list[RefLine]:
    out = []
    section_verbose = False
    for raw in REFERENCE.read_text().splitlines():
        if raw.startswith("# --"):
            section_verbose = "(-v)" in raw
        if not raw or raw.startswith("#"):
            continue
        optional = raw.endswith(" ?")
        text = raw.removesuffix(" ?").replace("\\t", "\t")
        out.append(RefLine(text, optional, section_verbose))
    return [r for r in out if verbose or not r.verbose]


def head(line: str) -> str:
    """A line up to its value: the label, its colon and the tabs after it."""
    m = re.match(r"^(\t*[^\t:]+:\t+)", line)
    return m.group(1) if m else line


def field_heads(output: str) -> list[str]:
    lines = output.splitlines()
    return [
        head(line)
        for line in lines
        if line and not line.startswith("\t" * 5) and not line.startswith("\t\t\tGID[")
    ]


def walk(heads: list[str], ref: list[RefLine]) -> None:
    """``heads`` follow ``ref`` in order; only optional reference lines may be missing."""
    i = 0
    for r in ref:
        if i < len(heads) and heads[i] == r.head:
            i += 1
        elif not r.optional:
            raise AssertionError(f"missing {r.head!r} before {heads[i : i + 1]}")
    assert i == len(heads), f"lines not in ibv_devinfo's format, or out of order: {heads[i:]}"


def _run(tmp_path: Path, *args: str) -> str:
    r = softverbs_cli(tmp_path, "devinfo", *args)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout


def test_verbose_output_walks_the_ibv_devinfo_field_list(tmp_path: Path) -> None:
    out = _run(tmp_path, "-v")
    walk(field_heads(out), reference())
    assert out.endswith("\n\n")  # each port ends with an empty line


def test_plain_output_is_the_verbose_one_without_the_verbose_lines(tmp_path: Path) -> None:
    plain, verbose = _run(tmp_path), _run(tmp_path, "-v")
    walk(field_heads(plain), reference(verbose=False))
    assert set(plain.splitlines()) <= set(verbose.splitlines())
    assert "max_qp:" not in plain and "GID[" not in plain


def test_a_check_that_can_fail() -> None:
    ref = reference()
    with pytest.raises(AssertionError):
        walk(["hca_id:\t", "\tnode_guid:\t\t\t"], ref)  # transport is missing
    with pytest.raises(AssertionError):
        walk(["hca_id:\t", "\ttransport:\t\t", "\tnode_guid:\t\t\t"], ref)  # wrong tabs


def test_values_have_ibv_devinfo_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run(tmp_path, "-v")
    value = {head(line).strip(): line[len(head(line)) :] for line in out.splitlines() if line}
    assert value["hca_id:"] == "sv0"
    assert value["transport:"] == "InfiniBand (0)"
    assert re.fullmatch(r"[0-9a-f]{4}(:[0-9a-f]{4}){3}", value["node_guid:"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", value["fw_ver:"])
    assert re.fullmatch(r"0x[0-9a-f]{4,}", value["vendor_id:"])
    assert value["state:"] == "PORT_ACTIVE (4)"
    assert re.fullmatch(r"(256|512|1024|2048|4096) \([1-5]\)", value["active_mtu:"])
    assert value["link_layer:"] == "Ethernet"
    assert value["phys_state:"] == "LINK_UP (5)"
    assert re.fullmatch(r"0x[0-9a-f]{8}", value["device_cap_flags:"])
    assert re.fullmatch(r"ATOMIC_(NONE|HCA|GLOB) \(\d\)", value["atomic_cap:"])
    # the node GUID is the one 'rdma dev' shows
    monkeypatch.setenv("SOFTVERBS_CONFIG", str(tmp_path / "links.json"))
    assert value["node_guid:"] == rdma.dev_rows(registry.Registry().specs())[0]["node_guid"]


def test_gid_lines_are_the_device_gids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run(tmp_path, "-v")
    gids = re.findall(r"^\t\t\tGID\[ *(\d+)\]:\t\t(\S+), RoCE v2$", out, re.M)
    monkeypatch.setenv("SOFTVERBS_CONFIG", str(tmp_path / "links.json"))
    with Context(name="sv0") as ctx:
        import socket

        expected = [
            (str(i), socket.inet_ntop(socket.AF_INET6, ctx.query_gid(1, i).raw)) for i in range(2)
        ]
    assert gids == expected  # fe80::... (from the MAC) and ::ffff:127.0.0.1


def test_devices_ports_and_list(tmp_path: Path) -> None:
    env = {"SOFTVERBS_INPROC_DEVICES": "sv0,sv1"}
    r = softverbs_cli(tmp_path, "devinfo", **env)
    assert r.stdout.count("hca_id:") == 2
    r = softverbs_cli(tmp_path, "devinfo", "-d", "sv1", "-i", "1", **env)
    assert r.stdout.startswith("hca_id:\tsv1\n") and r.stdout.count("hca_id") == 1
    r = softverbs_cli(tmp_path, "devinfo", "-l", **env)
    assert r.stdout == "2 HCAs found:\n\tsv0\n\tsv1\n\n"


def test_mistakes(tmp_path: Path) -> None:
    assert_user_error(softverbs_cli(tmp_path, "devinfo", "-d", "nodev"), "-d nodev")
    assert_user_error(softverbs_cli(tmp_path, "devinfo", "-i", "7"), "-i 7", "invalid port")
    assert_user_error(softverbs_cli(tmp_path, "devinfo", "-i", "x"), "-i/--ib-port", rc=2)


def test_flag_words_follow_their_field() -> None:
    lines = list(devinfo.flag_lines(0b11 | 1 << 40, devinfo.ODP_GENERAL))
    assert lines == [
        "\t" * 5 + "ODP_SUPPORT",
        "\t" * 5 + "ODP_SUPPORT_IMPLICIT",
        "\t" * 5 + "Unknown flags: 0x10000000000",
    ]
