"""Build hook: compile softverbs' C libraries and its hot modules at install.

Everything else is in pyproject.toml.  Two optional steps, each of which
needs a C compiler; without one the package still installs and runs:

* the C client libraries (libibverbs.so.1, librdmacm.so.1) for unmodified C
  programs -- without a compiler a warning says softverbs builds them on
  first use instead;
* the hot Python modules (softverbs.compiled.MODULES) compiled by Cython in
  pure-Python mode, installed beside their .py files -- without Cython or a
  compiler (or with SOFTVERBS_NO_COMPILE=1) they run interpreted, and one
  that fails to compile is left interpreted with a warning.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")


def _import_from_src(name: str) -> Any:
    sys.path.insert(0, SRC)
    try:
        return __import__(f"softverbs.{name}", fromlist=[name])
    finally:
        sys.path.pop(0)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class BuildPyWithNative(build_py):
    def run(self) -> None:
        super().run()
        native = _import_from_src("native")
        out = os.path.join(self.build_lib, "softverbs", "native", "lib")
        try:
            native.build(out)
            native.write_stamp(out)
        except native.BuildError as exc:
            _warn(str(exc))


#: Cython's settings for the pure-Python-mode modules.  annotation_typing
#: stays off: the annotations are mypy's, and with it on Cython turns an
#: ``int`` annotation into a C long (an IntEnum comes back a plain int, a
#: float is truncated) and rejects duck types; the C types are in the .pxd files.
DIRECTIVES = {"language_level": 3, "annotation_typing": False}


def _extensions() -> list[Extension]:
    modules = _import_from_src("compiled").MODULES
    # -g0: no debug information for the generated C (tens of thousands of lines a
    # module), which would slow the build and make the files several times larger
    return [
        Extension(name, [os.path.join("src", *name.split(".")) + ".py"], extra_compile_args=["-g0"])
        for name in modules
    ]


class BuildHotModules(build_ext):
    """Cythonizes and compiles the hot modules; any failure leaves them interpreted."""

    def run(self) -> None:
        if os.environ.get("SOFTVERBS_NO_COMPILE", "") not in ("", "0"):
            _warn("SOFTVERBS_NO_COMPILE is set: softverbs' modules stay interpreted")
            return
        try:
            from Cython.Build import cythonize
        except ImportError:
            _warn("Cython is not installed: softverbs' modules stay interpreted (slower)")
            return
        if not self._compiler_works():
            _warn("no working C compiler: softverbs' modules stay interpreted (slower)")
            return
        generated = cythonize(
            self.extensions, compiler_directives=DIRECTIVES, quiet=True,
            build_dir=os.path.join(self.build_temp, "cython"),
        )  # fmt: skip
        c_sources = {ext.name: ext.sources for ext in generated}
        for ext in self.extensions:  # setuptools' own Extension objects, now from the C
            ext.sources = c_sources[ext.name]
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1
        super().run()

    def _compiler_works(self) -> bool:
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler

        cc = new_compiler()
        customize_compiler(cc)  # CC, CFLAGS from the environment, as build_ext does
        with tempfile.TemporaryDirectory() as tmp:
            probe = os.path.join(tmp, "probe.c")
            with open(probe, "w") as f:
                f.write("int main(void) { return 0; }\n")
            try:
                cc.compile([probe], output_dir=tmp)
            except Exception:
                return False
        return True

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # a compile error: this module runs interpreted
            _warn(f"{ext.name} stays interpreted: it did not compile ({exc})")


setup(
    ext_modules=_extensions(),
    cmdclass={"build_py": BuildPyWithNative, "build_ext": BuildHotModules},
)
