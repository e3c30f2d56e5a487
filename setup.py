"""Build hook: compile softverbs' C libraries into the package at install.

Everything else is in pyproject.toml.  Without a C compiler the Python
package still installs (a warning says C programs cannot use softverbs until
one is there: softverbs builds the libraries on first use then)."""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithNative(build_py):
    def run(self) -> None:
        super().run()
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
        try:
            from softverbs import native
        finally:
            sys.path.pop(0)
        out = os.path.join(self.build_lib, "softverbs", "native", "lib")
        try:
            native.build(out)
            native.write_stamp(out)
        except native.BuildError as exc:
            print(f"warning: {exc}", file=sys.stderr)


setup(cmdclass={"build_py": BuildPyWithNative})
