"""softverbs' C libraries: what lets unmodified C programs reach the device.

``libibverbs.so.1`` has the ABI of rdma-core's libibverbs (the structs of
``<infiniband/verbs.h>`` and the symbol versions programs link against) and is
a thin client of the host device: control verbs are messages to softverbsd
(docs/service-protocol.md), the data path is rings in shared memory
(docs/rings.md).  It holds no transport: the Python engine stays the only
implementation of the device.  ``libmlx5.so.1`` and ``libefa.so.1`` are stubs
with the symbols tools such as perftest link, each saying "not this vendor",
so such programs start.  ``softverbs exec`` puts their directory first on
``LD_LIBRARY_PATH``; nothing of a real rdma-core on the machine is touched.
``libsoftverbs_preload.so`` (on ``LD_PRELOAD`` under ``softverbs exec``)
shows ``/dev/infiniband/softverbsN`` to programs that check for a device
node (UCX), without root (docs/c-programs.md, UCX).

Building.  ``pip install .`` compiles them into the package (``lib/``, see
``setup.py``) when a C compiler is there (``$CC``, else ``cc``).  An
editable install, or an install made without a compiler, builds them on first
use into ``~/.cache/softverbs/native/<hash of the sources>/`` instead.  The
sources are this package's ``csrc/`` and ``include/``;
``include/softverbs/protocol.h`` is generated from the Python definitions
(``python -m softverbs.device.protocol --update .``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
INCLUDE = HERE / "include"
#: where ``pip install .`` puts the libraries
PACKAGED = HERE / "lib"

CFLAGS = ["-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-fPIC"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=undefined"]  # fmt: skip


#: the library ``softverbs exec`` puts on LD_PRELOAD (csrc/preload.c): the
#: device node /dev/infiniband/softverbsN that UCX checks for, without root
PRELOAD = "libsoftverbs_preload.so"


@dataclass(frozen=True)
class Library:
    """One shared object: its SONAME, sources and version script (under csrc/)."""

    soname: str
    sources: tuple[str, ...]
    version_script: str
    libs: tuple[str, ...] = ()


LIBRARIES = (
    Library("libibverbs.so.1", ("conn.c", "ring.c", "device.c", "verbs.c", "unsupported_ibverbs.c"),
            "libibverbs.map",
            ("-lpthread",)),
    Library("librdmacm.so.1", ("cma.c", "unsupported_rdmacm.c"), "librdmacm.map",
            ("-l:libibverbs.so.1", "-lpthread")),
    Library("libmlx5.so.1", ("providers/mlx5.c", "providers/mlx5_sig.c"), "providers/mlx5.map",
            ("-l:libibverbs.so.1",)),
    Library("libefa.so.1", ("providers/efa.c",), "providers/efa.map"),
    Library(PRELOAD, ("preload.c",), "preload.map", ("-ldl",)),
)  # fmt: skip


class BuildError(Exception):
    """The libraries cannot be built here (the message says why)."""


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc`` or ``gcc`` on PATH; None if none."""
    cc = os.environ.get("CC")
    if cc:
        return cc
    return shutil.which("cc") or shutil.which("gcc")


def sources_hash() -> str:
    """A hash of every source, header and version script: names a build."""
    h = hashlib.sha256()
    for path in sorted([*CSRC.rglob("*"), *INCLUDE.rglob("*")]):
        if path.is_file():
            h.update(str(path.relative_to(HERE)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build(outdir: str | os.PathLike[str], sanitize: bool = False, werror: bool = False) -> Path:
    """Compile the libraries into ``outdir`` (created); BuildError if not possible.

    ``werror`` makes a warning an error: the tests build so, an install does
    not (another compiler's new warning must not stop ``pip install``)."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (set CC, or install gcc): softverbs' libibverbs.so.1 "
                         "cannot be built, so C programs cannot use softverbs here")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    flags = [*CFLAGS, *(SANITIZE if sanitize else []), *(["-Werror"] if werror else [])]
    for lib in LIBRARIES:
        target = out / lib.soname
        with tempfile.NamedTemporaryFile(dir=out, prefix=f".{lib.soname}.", delete=False) as tmp:
            partial = Path(tmp.name)
        cmd = [cc, *flags, f"-I{INCLUDE}", "-shared", f"-Wl,-soname,{lib.soname}",
               f"-Wl,--version-script={CSRC / lib.version_script}", "-o", str(partial),
               *(str(CSRC / s) for s in lib.sources), f"-L{out}", *lib.libs]  # fmt: skip
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise BuildError(f"cannot run the C compiler {cc}: {exc.strerror}") from None
        if r.returncode:
            partial.unlink(missing_ok=True)
            raise BuildError(f"{cc} failed to build {lib.soname}:\n{r.stderr.strip()}")
        # the temporary file was made private (0600, so the compiler's output is
        # 0711): a library other users' programs load must be readable by them
        os.chmod(partial, 0o755)
        partial.replace(target)  # atomic: a concurrent user never sees half a library
    return out


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "softverbs" / "native" / sources_hash()


def library_dir() -> Path:
    """The directory of the built libraries: the packaged build if there is
    one, else a build in the cache (made now if needed).  BuildError if there
    is none and none can be made."""
    if all((PACKAGED / lib.soname).exists() for lib in LIBRARIES) and not _stale(PACKAGED):
        return PACKAGED
    cached = cache_dir()
    if all((cached / lib.soname).exists() for lib in LIBRARIES):
        return cached
    return build(cached)


def _stale(path: Path) -> bool:
    """A packaged build made from other sources (an editable checkout moved on)."""
    stamp = path / "SOURCES"
    return stamp.exists() and stamp.read_text().strip() != sources_hash()


def write_stamp(outdir: str | os.PathLike[str]) -> None:
    (Path(outdir) / "SOURCES").write_text(sources_hash() + "\n")
