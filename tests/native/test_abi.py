"""softverbs' C libraries have rdma-core 44's whole ABI, checked statically.

Debian bookworm ships rdma-core 44; every C program there that uses RDMA is
linked against its ``libibverbs.so.1``, ``librdmacm.so.1`` and the
``libmlx5.so.1``/``libefa.so.1`` of ``ibverbs-providers``, with symbol
versions and (Debian links ``-z now``) every symbol bound at start.  Two checks,
both with ``readelf`` on the ``.deb`` files themselves:

1. ``test_exports_are_rdma_core_44s``: each of softverbs' four libraries exports
   exactly the symbols of Debian's -- name, version, whether it is the default
   version, function or object -- plus softverbs' own ``SOFTVERBS_PRIVATE_*``.
2. ``test_every_debian_program_finds_its_symbols``: every ELF file in every
   Debian package that depends on libibverbs1, librdmacm1 or ibverbs-providers
   (``apt-cache rdepends``) finds each versioned symbol it imports from those
   libraries in softverbs' (0 missing), so each loads under ``softverbs exec``.

The packages are fetched with ``apt-get download`` into a cache outside the
tree (``$SOFTVERBS_ABI_CACHE``, else ``~/.cache/softverbs-abi``; about 125 MB,
a few seconds from a Debian mirror) as the tests' setup, and what each ``.deb``
imports is remembered there as JSON next to it, so later runs read no archive.
Without apt (not Debian) or without the mirror and an empty cache, the tests
skip saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from softverbs import native

#: the rdma-core packages whose libraries softverbs' replace, and those libraries
REFERENCE = {
    "libibverbs1": ("libibverbs.so.1",),
    "librdmacm1": ("librdmacm.so.1",),
    "ibverbs-providers": ("libmlx5.so.1", "libefa.so.1"),
}
LIBS = tuple(lib for libs in REFERENCE.values() for lib in libs)
#: the version nodes of each library (a symbol's version names its library)
VERSION_PREFIX = {"IBVERBS_": "libibverbs.so.1", "RDMACM_": "librdmacm.so.1",
                  "MLX5_": "libmlx5.so.1", "EFA_": "libefa.so.1"}  # fmt: skip
#: softverbs' own version nodes (libibverbs.map), which rdma-core has not
OWN = "SOFTVERBS" + "_PRIVATE_"
MULTIARCH = "usr/lib/x86_64-linux-gnu"
#: a readelf --dyn-syms -W line: Num Value Size Type Bind Vis Ndx Name
_SYM = re.compile(r"^\s*\d+:\s+\S+\s+\d+\s+(\w+)\s+\w+\s+\w+\s+(\w+)\s+(\S+?)(?:\s+\(\d+\))?$")


def _need_readelf() -> str:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed (Debian binutils)")
    return readelf


def dyn_symbols(path: Path) -> list[tuple[str, str, bool, str, bool]]:
    """(name, version, default, type, defined) of each versioned dynamic symbol."""
    out = subprocess.run([_need_readelf(), "--dyn-syms", "-W", str(path)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    syms = []
    for line in out.splitlines():
        m = _SYM.match(line)
        if not m or "@" not in m.group(3):
            continue
        kind, ndx, full = m.groups()
        default = "@@" in full
        name, version = full.replace("@@", "@").split("@", 1)
        syms.append((name, version, default, kind, ndx != "UND"))
    return syms


def exports(path: Path) -> set[tuple[str, str, bool, str]]:
    return {(n, v, d, k) for n, v, d, k, defined in dyn_symbols(path)
            if defined and not v.startswith(OWN) and v != n}  # fmt: skip


# --- the Debian packages, fetched into the cache -------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("SOFTVERBS_ABI_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "softverbs-abi"


def _apt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which(args[0]) is None:
        pytest.skip(f"{args[0]} is not here (not Debian): no Debian packages to compare with")
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=600)  # fmt: skip


def rdepends() -> list[str]:
    """The binary packages that depend on the reference packages, and these."""
    r = _apt("apt-cache", "rdepends", "--no-suggests", "--no-recommends", "--no-enhances",
             "--no-conflicts", "--no-breaks", "--no-replaces", *REFERENCE)  # fmt: skip
    names = {line.strip().lstrip("|").strip() for line in r.stdout.splitlines()
             if line.startswith(" ")}  # fmt: skip
    return sorted(names | set(REFERENCE))


def _debs(cache: Path, package: str) -> list[Path]:
    return sorted(cache.glob(f"{package}_*_amd64.deb")) + sorted(cache.glob(f"{package}_*_all.deb"))


def fetch(packages: list[str]) -> dict[str, Path]:
    """package -> its .deb in the cache, downloading those not there yet.  A package
    with no amd64 candidate (a virtual one) is left out; skip if none can be had."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not _debs(cache, p)]
    problem = ""
    if missing:
        r = _apt("apt-get", "download", *missing, cwd=cache)
        if r.returncode:  # one bad name fails the lot: fetch one by one, keep what comes
            for p in missing:
                one = _apt("apt-get", "download", p, cwd=cache)
                if one.returncode and "Can't select candidate" not in one.stderr:
                    problem = one.stderr.strip()[-300:]
    have = {p: _debs(cache, p)[-1] for p in packages if _debs(cache, p)}
    if not all(p in have for p in REFERENCE):
        pytest.skip(f"cannot download Debian's rdma-core packages into {cache}: {problem}")
    return have


def _unpack(deb: Path, into: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True, capture_output=True)


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def imports(deb: Path) -> dict[str, list[str]]:
    """ELF path in ``deb`` -> the versioned symbols (name@VERSION) it imports from
    the reference libraries; remembered next to the .deb."""
    memo = deb.with_suffix(".imports.json")
    if memo.exists():
        data: dict[str, list[str]] = json.loads(memo.read_text())
        return data
    result: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="softverbs-abi-") as tmp:
        _unpack(deb, Path(tmp))
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_symlink() or not path.is_file() or not _is_elf(path):
                continue
            wanted = sorted({f"{n}@{v}" for n, v, _, _, defined in dyn_symbols(path)
                             if not defined and v.startswith(tuple(VERSION_PREFIX))})  # fmt: skip
            if wanted:
                result[str(path.relative_to(tmp))] = wanted
    memo.write_text(json.dumps(result, indent=0))
    return result


@pytest.fixture(scope="module")
def ours() -> dict[str, set[tuple[str, str, bool, str]]]:
    _need_readelf()
    d = native.library_dir()
    return {lib: exports(d / lib) for lib in LIBS}


@pytest.fixture(scope="module")
def reference() -> Iterator[dict[str, set[tuple[str, str, bool, str]]]]:
    debs = fetch(list(REFERENCE))
    with tempfile.TemporaryDirectory(prefix="softverbs-abi-") as tmp:
        for package in REFERENCE:
            _unpack(debs[package], Path(tmp))
        yield {lib: exports(Path(tmp) / MULTIARCH / lib) for lib in LIBS}


Exports = dict[str, set[tuple[str, str, bool, str]]]


def test_exports_are_rdma_core_44s(ours: Exports, reference: Exports) -> None:
    report = []
    for lib in LIBS:
        assert len(reference[lib]) > 0, f"readelf found no versioned symbols in Debian's {lib}"
        missing = sorted(reference[lib] - ours[lib])
        extra = sorted(ours[lib] - reference[lib])
        if missing or extra:
            report.append(f"{lib}: missing {missing}\n  differing or extra {extra}")
    assert not report, "\n".join(report)


def test_every_debian_program_finds_its_symbols(ours: Exports) -> None:
    have = {f"{n}@{v}" for syms in ours.values() for n, v, _, _ in syms}
    packages = fetch(rdepends())
    checked: dict[str, int] = {}
    missing: dict[str, list[str]] = {}
    for package, deb in sorted(packages.items()):
        for elf, wanted in imports(deb).items():
            checked[package] = checked.get(package, 0) + 1
            lack = [s for s in wanted if s not in have]
            if lack:
                missing[f"{package}: /{elf}"] = lack
    # the programs the issue names are among those checked, so the check cannot be empty
    for package in ("perftest", "rdmacm-utils", "ibverbs-utils", "libfabric1", "python3-pyverbs"):
        assert checked.get(package), f"no ELF of {package} imports rdma-core's symbols?"
    total = sum(len(v) for v in missing.values())
    assert not missing, f"{total} versioned symbols missing:\n" + "\n".join(
        f"{k}: {' '.join(v)}" for k, v in sorted(missing.items())
    )


def test_getaddrinfo_and_unsupported_calls_answer_as_rdma_core(tmp_path: Path) -> None:
    """abi.c, linked -z now against the four libraries: rdma_getaddrinfo with the
    addresses in the hints (libfabric's verbs provider), with a node, and with
    nothing; and what the unsupported tables answer (ENOSYS for rsockets,
    EOPNOTSUPP for the vendor calls)."""
    cc = shutil.which(os.environ.get("CC", "gcc"))
    if cc is None:
        pytest.skip("no C compiler")
    d = native.library_dir()
    exe = tmp_path / "abi"
    build = subprocess.run([cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                            str(Path(__file__).with_name("abi.c")), "-o", str(exe), f"-L{d}",
                            *(f"-l:{lib}" for lib in LIBS), "-Wl,-z,now"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    env = {**os.environ, "LD_LIBRARY_PATH": str(d)}
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60,
                       check=False)  # fmt: skip
    assert r.returncode == 0 and r.stdout.rstrip().endswith("ok"), r.stdout + r.stderr
    assert "all 26 ok" in r.stdout, r.stdout
