"""docs/wire.md stays true: its example runs and prints what the page shows, its tshark
commands give what it shows, and every counter the code can produce is documented."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "wire.md"
SRC = ROOT / "src" / "softverbs"


def block(marker: str) -> str:
    """The fenced block that follows ``<!-- marker -->`` in the page."""
    text = DOC.read_text()
    m = re.search(rf"<!-- {re.escape(marker)} -->\n(?:[^\n]*\n)*?```[a-z]*\n(.*?)```", text, re.S)
    assert m, f"no block after <!-- {marker} --> in {DOC}"
    return m.group(1)


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    cwd = tmp_path_factory.mktemp("wire_example")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env["SOFTVERBS_SERVICE"] = "0"  # a device of its own, not the host's
    proc = subprocess.run([sys.executable, "-c", block("example: simulation")], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return cwd, proc.stdout


def test_simulation_example_prints_what_the_page_shows(example_run: tuple[Path, str]) -> None:
    _, out = example_run
    assert out == block("output: simulation")


def test_tshark_commands_give_what_the_page_shows(example_run: tuple[Path, str]) -> None:
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("tshark is not installed (apt: tshark)")
    cwd, _ = example_run
    text = DOC.read_text()

    def run(*args: str) -> list[str]:
        proc = subprocess.run([tshark, "-r", "rc.pcap", *args], cwd=cwd, capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        return proc.stdout.splitlines()

    naks = run("-Y", "infiniband.aeth.syndrome.opcode != 0", "-T", "fields",
               "-e", "frame.time_relative", "-e", "ip.src", "-e", "infiniband.bth.psn",
               "-e", "infiniband.aeth.syndrome.opcode",
               "-e", "infiniband.aeth.syndrome.error_code")  # fmt: skip
    for line in naks[:2]:
        assert line in text, line
    psn3 = run("-Y", "infiniband.bth.psn == 3", "-T", "fields", "-e", "frame.number",
               "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn",
               "-e", "infiniband.bth.a")  # fmt: skip
    assert "\n".join(psn3) in text
    summary = run("-c", "4")
    for line in summary:  # column spacing may differ between tshark versions
        assert " ".join(line.split()) in " ".join(text.split()), line


def _counter_names() -> set[str]:
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        code = path.read_text()
        for expr in re.findall(r"counters\[([^\]]+)\]", code):
            if 'f"' not in expr:
                names.update(re.findall(r'"([a-z0-9_]+)"', expr))
    code = (SRC / "engine" / "responder.py").read_text()
    names.update(re.findall(r'"(resp_[a-z_]+)"', code))
    code = (SRC / "device" / "core.py").read_text()
    block_ = code.split("STANDARD_COUNTERS = (", 1)[1].split(")", 1)[0]
    names.update(re.findall(r'"([a-z0-9_]+)"', block_))
    return names


def test_every_counter_is_documented() -> None:
    """By name, or by a family the page names with a placeholder (`cm_tx_<msg>`)."""
    text = DOC.read_text()
    families = [re.compile(re.sub(r"<[^>]+>", "[a-z0-9_]+", pat) + "$")
                for pat in re.findall(r"`([a-z0-9_]*<[a-z_]+>[a-z0-9_]*)`", text)]  # fmt: skip
    names = _counter_names()
    assert len(names) > 50
    missing = sorted(n for n in names
                     if f"`{n}`" not in text and not any(f.match(n) for f in families))  # fmt: skip
    assert not missing, f"counters missing from {DOC.name}: {missing}"


def test_every_decode_drop_reason_is_documented() -> None:
    text = DOC.read_text()
    reasons = set(re.findall(r'WireError\(\s*"([a-z_]+)"', (SRC / "wire" / "codec.py").read_text()))
    assert {"truncated", "icrc_error"} <= reasons
    for reason in reasons:
        assert f"`drop_{reason}`" in text or f"`{reason}`" in text, reason
