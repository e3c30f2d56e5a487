"""Docs that are generated from code, or that show code, stay true."""

from __future__ import annotations

import re
from pathlib import Path

from softverbs.engine.qpstate import transition_table_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_semantics_state_table_is_generated_from_the_code() -> None:
    text = (ROOT / "docs" / "semantics.md").read_text()
    m = re.search(
        r"<!-- BEGIN GENERATED: qp-state-table -->\n(.*?)\n<!-- END GENERATED: qp-state-table -->",
        text,
        re.S,
    )
    assert m, "docs/semantics.md lost its generated state table block"
    assert m.group(1) == transition_table_markdown(), (
        "docs/semantics.md is stale: regenerate the block with "
        "softverbs.engine.qpstate.transition_table_markdown()"
    )


def test_readme_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```python\n(.*?)```", text, re.S)
    assert m, "README.md has no python example"
    ns: dict[str, object] = {"print": lambda *a, **k: None}
    exec(compile(m.group(1), "README.md", "exec"), ns)
    assert ns["mr"].read(12, 32) == b"hello, verbs"  # type: ignore[attr-defined]
