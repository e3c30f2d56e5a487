"""What is generated from the protocol and ring declarations is up to date.

docs/service-protocol.md, docs/rings.md and native/include/softverbs/protocol.h
are generated from src/softverbs/device/ops.py and records.py, device/protocol.py and
engine/rings.py.  To refresh them: ``python -m softverbs.device.protocol
--update .``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from softverbs.device import protocol

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("rel", "name", "make"), protocol.GENERATED,
                         ids=[f"{rel}:{name}" for rel, name, _ in protocol.GENERATED])  # fmt: skip
def test_docs_blocks_are_current(rel: str, name: str, make: Callable[[], str]) -> None:
    text = (ROOT / rel).read_text()
    assert protocol.refreshed(text, name, make()) == text, (
        f"{rel} ({name}) is stale: run python -m softverbs.device.protocol --update ."
    )


def test_constant_table_names_each_constant_once() -> None:
    names = [c.name for c in protocol.CONSTANTS]
    assert len(names) == len(set(names))
    assert {f"KIND_{n.upper()}" for n in protocol.KIND_NAMES.values()} <= set(names)


def test_every_ring_constant_is_documented() -> None:
    from softverbs.engine import rings

    assert set(rings.C_CONSTANT_DOCS) == set(rings.C_CONSTANTS)


def test_c_header_is_current() -> None:
    assert (ROOT / protocol.C_HEADER).read_text() == protocol.c_header(), (
        f"{protocol.C_HEADER} is stale: run python -m softverbs.device.protocol --update ."
    )


def test_c_header_compiles_and_its_sizes_are_pythons(tmp_path: Path) -> None:
    """Every struct's sizeof in C is the record's size in Python (static asserts)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "t.c"
    src.write_text(f'#include "{ROOT / protocol.C_HEADER}"\nint main(void) {{ return 0; }}\n')
    r = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-o",
                        str(tmp_path / "t"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_op_is_in_the_document() -> None:
    text = (ROOT / "docs/service-protocol.md").read_text()
    for op in protocol.OPS:
        assert f"`{op.name}`" in text, op.name
