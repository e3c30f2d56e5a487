"""One source, two speeds (softverbs.compiled): the compiled and the interpreted modes.

* ``SOFTVERBS_PURE=1`` imports every hot module from its ``.py``, whatever is installed;
* without it, a module with a compiled extension beside it runs compiled, unless the
  ``.py`` was edited after the build (then the source runs: a stale build never hides an edit);
* a package built where no C compiler works (``CC=false``) installs with no compiled
  module and runs: it imports, reports the interpreted mode and passes a device run.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import softverbs
from softverbs import compiled

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib, json, softverbs, softverbs.compiled as c
files = {m: importlib.import_module(m).__file__ for m in c.MODULES}
print(json.dumps({"compiled": softverbs.COMPILED, "mode": c.mode(), "files": files,
                  "home": softverbs.__file__}))
"""


def _probe(env: dict[str, str]) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                       timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    result: dict[str, object] = json.loads(r.stdout)
    return result


def test_pure_switch_runs_every_hot_module_from_source() -> None:
    out = _probe({**os.environ, compiled.PURE_ENV: "1"})
    files = out["files"]
    assert isinstance(files, dict) and set(files) == set(compiled.MODULES)
    assert all(f.endswith(".py") for f in files.values()), files
    assert out["compiled"] is False
    assert out["mode"] == "interpreted (SOFTVERBS_PURE is set)"


def test_installed_extensions_are_the_ones_that_run() -> None:
    """Without the switch, exactly the modules with a (fresh) extension beside them run
    compiled, and the reported mode counts them."""
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    out = _probe(env)
    files = out["files"]
    assert isinstance(files, dict)
    built = {m for m, f in files.items() if not f.endswith(".py")}

    def fresh(name: str) -> bool:
        src = Path(str(files[name])).with_name(name.rpartition(".")[2] + ".py")
        newest = max(p.stat().st_mtime for p in (src, src.with_suffix(".pxd")) if p.exists())
        ext = [src.with_name(src.stem + s) for s in importlib.machinery.EXTENSION_SUFFIXES]
        return any(e.exists() and newest <= e.stat().st_mtime + compiled.STALE_AFTER
                   for e in ext)  # fmt: skip

    linked_fresh = all(fresh(m) for m in compiled.LINKED)
    for name, path in files.items():
        expected = fresh(name) and (name not in compiled.LINKED or linked_fresh)
        assert (name in built) == expected, (name, path)
    assert out["compiled"] is bool(built)
    if built:
        assert str(out["mode"]).startswith(f"compiled ({len(built)} of {len(compiled.MODULES)}")
    else:
        assert str(out["mode"]).startswith("interpreted")


def test_stale_extension_gives_way_to_the_edited_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "svstale"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    ext = pkg / ("hot" + importlib.machinery.EXTENSION_SUFFIXES[0])
    ext.write_bytes(b"not really an extension")
    src = pkg / "hot.py"
    src.write_text("VALUE = 'source'\n")
    monkeypatch.setattr(compiled, "MODULES", ("svstale.hot",))
    finder = compiled._SourceFirst(pure=False)
    os.utime(ext, (1_000_000, 1_000_000))
    os.utime(src, (1_000_000 + compiled.STALE_AFTER / 2, 1_000_000 + compiled.STALE_AFTER / 2))
    assert finder.find_spec("svstale.hot", [str(pkg)]) is None  # fresh: the extension
    os.utime(src, (1_000_100, 1_000_100))  # edited after the build
    spec = finder.find_spec("svstale.hot", [str(pkg)])
    assert spec is not None and spec.origin == str(src)
    assert "svstale.hot" in compiled.stale
    compiled.stale.discard("svstale.hot")
    assert finder.find_spec("svstale.other", [str(pkg)]) is None  # not a hot module


def test_leftover_extension_of_an_unlisted_module_runs_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An extension of a module no longer in MODULES (an older build's) never hides
    the .py, even when it is newer than the source."""
    pkg = tmp_path / "svleft"
    pkg.mkdir()
    (pkg / "gone.py").write_text("VALUE = 'source'\n")
    (pkg / ("gone" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not really")
    monkeypatch.setattr(compiled, "MODULES", ("svleft.hot",))
    monkeypatch.setattr(compiled, "stale", set())
    for pure in (False, True):
        spec = compiled._SourceFirst(pure=pure).find_spec("svleft.gone", [str(pkg)])
        assert spec is not None and spec.origin == str(pkg / "gone.py")
    assert compiled.stale == {"svleft.gone"}
    assert compiled._SourceFirst(pure=False).find_spec("otherpkg.gone", [str(pkg)]) is None


def test_linked_modules_run_from_source_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Modules whose .pxd files link them (compiled.LINKED) cannot mix compiled and
    interpreted: one stale member -- its .py or its .pxd edited -- sends all to source."""
    pkg = tmp_path / "svlinked"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for leaf in ("a", "b"):
        (pkg / (leaf + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not really")
        (pkg / (leaf + ".py")).write_text("VALUE = 'source'\n")
        (pkg / (leaf + ".pxd")).write_text("")
        for f in pkg.glob(leaf + ".*"):
            os.utime(f, (1_000_000, 1_000_000))
    monkeypatch.setattr(compiled, "MODULES", ("svlinked.a", "svlinked.b"))
    monkeypatch.setattr(compiled, "LINKED", frozenset({"svlinked.a", "svlinked.b"}))
    monkeypatch.setattr(compiled, "stale", set())
    finder = compiled._SourceFirst(pure=False)
    assert finder.find_spec("svlinked.a", [str(pkg)]) is None  # all fresh: compiled
    os.utime(pkg / "b.pxd", (1_000_100, 1_000_100))  # b's declarations edited
    spec = finder.find_spec("svlinked.a", [str(pkg)])
    assert spec is not None and spec.origin == str(pkg / "a.py")  # a goes to source with b
    assert compiled.stale == {"svlinked.b"}
    spec = finder.find_spec("svlinked.b", [str(pkg)])
    assert spec is not None and spec.origin == str(pkg / "b.py")


def test_a_linked_module_that_did_not_compile_sends_its_links_to_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module of LINKED with no compiled module beside it (it failed to compile:
    setup.py leaves it interpreted) would meet its compiled links' typed fields and
    cimports as a Python module: they run from source with it, and mode() says why."""
    pkg = tmp_path / "svpartial"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for leaf in ("a", "b"):
        (pkg / (leaf + ".py")).write_text("VALUE = 'source'\n")
    (pkg / ("a" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not really")
    monkeypatch.setattr(compiled, "MODULES", ("svpartial.a", "svpartial.b"))
    monkeypatch.setattr(compiled, "LINKED", frozenset({"svpartial.a", "svpartial.b"}))
    monkeypatch.setattr(compiled, "stale", set())
    monkeypatch.setattr(compiled, "uncompiled", set())
    spec = compiled._SourceFirst(pure=False).find_spec("svpartial.a", [str(pkg)])
    assert spec is not None and spec.origin == str(pkg / "a.py")
    assert compiled.uncompiled == {"svpartial.b"} and not compiled.stale
    monkeypatch.setattr(compiled, "compiled_modules", lambda: ["svpartial.a"])
    assert compiled.mode() == ("compiled (1 of 2 modules, Cython; not compiled, so its "
                               "links run from source: svpartial.b)")  # fmt: skip
    (pkg / ("b" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not really")
    compiled.uncompiled.clear()
    assert compiled._SourceFirst(pure=False).find_spec("svpartial.a", [str(pkg)]) is None


def test_a_compiled_install_compiled_every_hot_module() -> None:
    """Where the install compiled any module, it compiled all of them.  A module that
    does not compile (its ``.pxd`` out of step with its ``.py``, say) is left
    interpreted with only a warning in pip's output (setup.py), and would run
    correctly and slowly: this is where it shows."""
    home = Path(softverbs.__file__).parent
    missing = []
    for name in compiled.MODULES:
        base = home.joinpath(*name.split(".")[1:])
        if not any(base.with_name(base.name + s).exists()
                   for s in importlib.machinery.EXTENSION_SUFFIXES):  # fmt: skip
            missing.append(name)
    if len(missing) == len(compiled.MODULES):
        pytest.skip("this install compiled nothing (no compiler, no Cython, or "
                    "SOFTVERBS_NO_COMPILE)")  # fmt: skip
    assert not missing, (
        f"not compiled: {missing}; see the warnings of `pip install -v -e .` "
        "(a module that fails to compile stays interpreted)"
    )


def test_version_reports_the_mode() -> None:
    r = subprocess.run([sys.executable, "-m", "softverbs", "--version"],
                       env={**os.environ, compiled.PURE_ENV: "1"}, capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    assert r.stdout == f"softverbs {softverbs.__version__}, interpreted (SOFTVERBS_PURE is set)\n"


def test_install_without_a_compiler_runs_interpreted(tmp_path: Path) -> None:
    """Build a wheel with CC=false (no working compiler), install it on its own and
    run a device through it: nothing compiled, and everything works."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", "*.egg-info", "lib"))  # fmt: skip
    env = {**os.environ, "CC": "false"}
    env.pop(compiled.PURE_ENV, None)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "dist"), str(tree)],
                       env=env, capture_output=True, text=True, timeout=600,
                       check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no working C compiler: softverbs' modules stay interpreted" in r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("softverbs-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")], names
    assert all(m.replace(".", "/") + ".py" in names for m in compiled.MODULES)
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(site), str(wheel)], capture_output=True, text=True, timeout=300,
                       check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    run_env = {**env, "PYTHONPATH": str(site)}
    out = _probe(run_env)
    assert str(out["home"]).startswith(str(site)), out["home"]
    assert out["compiled"] is False
    assert out["mode"] == "interpreted (no compiled modules installed)"
    r = subprocess.run([sys.executable, "-m", "softverbs", "demo", "-n", "20", "-s", "3000",
                        "--op", "send", "--json"], env=run_env, capture_output=True, text=True,
                       timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["iterations"] == 20


def test_service_reports_its_mode(host_service: str) -> None:
    """The service (started through ``python -m softverbs.service``, which works
    compiled) runs in this process's mode and says so in its status."""
    from softverbs.cli.service import fetch_status

    stats = fetch_status(host_service)
    assert stats is not None and stats["mode"] == compiled.mode()
    r = subprocess.run([sys.executable, "-m", "softverbs", "service", "status", "--socket",
                        host_service], capture_output=True, text=True, timeout=60,
                       check=False)  # fmt: skip
    assert r.returncode == 0 and f"mode: {compiled.mode()}\n" in r.stdout, r
