"""The docs' links lead somewhere, and every page can be found from the README.

* Each relative link ``[text](path#anchor)`` of README.md, docs/*.md and
  bench/README.md names a file or folder of this repository, and its anchor a
  heading of that page, made into an anchor the way GitHub makes one
  (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` ... for
  repeats).  Links inside code blocks are code, not links.
* Every page of docs/ is linked from README.md, the reader's way in.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def prose(path: Path) -> str:
    """The page without its code blocks."""
    return FENCE.sub("", path.read_text())


def anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(prose(path)):
        slug = anchor(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchor_is_githubs() -> None:
    assert anchor("C programs: `libmlx5.so.1`") == "c-programs-libmlx5so1"
    assert anchor("Debian's python3-pyverbs") == "debians-python3-pyverbs"
    assert anchor("One source, two speeds: the hot modules compiled with Cython") == (
        "one-source-two-speeds-the-hot-modules-compiled-with-cython")  # fmt: skip


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for m in LINK.finditer(prose(page)):
        url = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", url):  # http:, https:, mailto: ...
            continue
        path, _, frag = url.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{url}: no such file")
        elif frag and target.suffix == ".md" and frag not in anchors(target):
            broken.append(f"{url}: {target.name} has no heading #{frag}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = ROOT / "README.md"
    linked = {(ROOT / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(prose(readme))}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links no page of docs/ named {missing}"
