"""Every code block of the docs runs, and the generated references stay true.

* Each ```python and ```sh block of README.md and docs/*.md runs in a fresh
  process, in a scratch directory, with a private link table and service
  directory, and must exit 0.  A block that cannot run here (it installs
  packages, needs two terminals or a network peer, or is a fragment of a larger
  program) carries ``<!-- norun: REASON -->`` on the line before it; each mark
  must give its reason, and they stay few.
* docs/cli.md is exactly what the argparse parsers generate.
* docs/environment.md names every environment variable the code reads.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from softverbs.cli.main import reference_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?:<!--\s*norun:(?P<reason>[^>]*)-->\s*\n)?^```(?P<lang>python|sh)\n(?P<code>.*?)^```",
    re.S | re.M,
)
#: at most this many blocks may be marked norun: the docs show what runs
MAX_NORUN = 20
TIMEOUT = 180


@dataclass
class Block:
    file: Path
    line: int
    lang: str
    code: str
    norun: str | None

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("lang")) + 1
            reason = m.group("reason")
            out.append(Block(path, line, m.group("lang"), m.group("code"),
                             None if reason is None else reason.strip()))  # fmt: skip
    return out


RUNNABLE = [b for b in blocks() if b.norun is None]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # the docs say softverbs and python: both mean this checkout and this interpreter
    for name, body in (("softverbs", f'exec "{sys.executable}" -m softverbs "$@"'),
                       ("python", f'exec "{sys.executable}" "$@"'),
                       ("python3", f'exec "{sys.executable}" "$@"')):  # fmt: skip
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT / "src")
    env["SOFTVERBS_CONFIG"] = str(tmp_path / "links.json")
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")  # never the user's service
    env["SOFTVERBS_CACHE"] = os.environ.get(
        "SOFTVERBS_CACHE", str(Path.home() / ".cache" / "softverbs" / "conformance")
    )
    return env


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_doc_block_runs(block: Block, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for top in ("bench", "examples"):  # blocks run as from a checkout
        (work / top).symlink_to(ROOT / top)
    if block.lang == "python":
        (work / "block.py").write_text(block.code)
        cmd = [sys.executable, "block.py"]
    else:
        (work / "block.sh").write_text(block.code)
        cmd = ["bash", "-euo", "pipefail", "block.sh"]
    r = subprocess.run(cmd, cwd=work, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=TIMEOUT, check=False, stdin=subprocess.DEVNULL)  # fmt: skip
    env = _env_services_stop(tmp_path)
    assert r.returncode == 0, (
        f"{block.id} ({block.lang}) exited {r.returncode}; mark it <!-- norun: REASON --> "
        f"only if it cannot run here\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n"
        f"{r.stderr[-3000:]}{env}"
    )


def _env_services_stop(tmp_path: Path) -> str:
    """A block may have started the service on its private socket: stop it."""
    run = tmp_path / "run"
    for sock in run.glob("*.sock") if run.exists() else []:
        subprocess.run([sys.executable, "-m", "softverbs", "service", "stop", "--socket",
                        str(sock)], capture_output=True, timeout=60, check=False,
                       env=_env_plain())  # fmt: skip
    return ""


def _env_plain() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


def test_every_norun_mark_gives_its_reason_and_they_stay_few() -> None:
    marked = [b for b in blocks() if b.norun is not None]
    for b in marked:
        assert len(b.norun.split()) >= 3, f"{b.id}: a norun mark needs its reason"
    assert len(marked) <= MAX_NORUN, [b.id for b in marked]
    assert len(RUNNABLE) >= len(marked) // 2  # the docs show mostly code that runs


def test_the_block_finder_sees_marks() -> None:
    text = "x\n<!-- norun: needs two terminals -->\n```sh\nfalse\n```\n```python\npass\n```\n"
    found = list(BLOCK.finditer(text))
    assert [(m.group("lang"), m.group("reason")) for m in found] == [
        ("sh", " needs two terminals "),
        ("python", None),
    ]


def test_cli_reference_is_generated_from_the_parsers() -> None:
    assert (ROOT / "docs" / "cli.md").read_text() == reference_markdown(), (
        "docs/cli.md is stale: regenerate it with python3 -c 'from softverbs.cli.main import "
        'reference_markdown; print(reference_markdown(), end="")\' > docs/cli.md'
    )


#: a SOFTVERBS_ name in quotes or backticks, or before "=": how code reads or sets one
_ENV_NAME = re.compile(r"[\"'`](SOFTVERBS_[A-Z0-9_]+)[\"'`=]")


def test_every_environment_variable_is_documented() -> None:
    names: set[str] = set()
    for path in [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py"),
                 *ROOT.joinpath("bench").glob("*.py")]:  # fmt: skip
        names |= set(_ENV_NAME.findall(path.read_text()))
    names |= {"XDG_CONFIG_HOME", "XDG_RUNTIME_DIR"}
    doc = (ROOT / "docs" / "environment.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/environment.md does not describe {missing}"
