"""Each engine module imports first, on its own, in a fresh interpreter.

Compiled, the ``.pxd`` files link the engine's modules at the C level: a
module's initialisation imports the modules whose extension types it
``cimport``s, which may import it back before its own body has run (``core``
cimports ``HCA``, and ``hca`` imports ``core``).  Which module a program
imports first decides the order, so every order that starts somewhere must
work -- in both modes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from softverbs.compiled import MODULES

ENGINE = [m for m in MODULES if m.startswith(("softverbs.engine.", "softverbs.wire."))]
ENGINE.append("softverbs.engine.congestion")  # imports core: the order a CLI command met


@pytest.mark.parametrize("module", ENGINE)
@pytest.mark.parametrize("pure", ["0", "1"])
def test_imports_first(module: str, pure: str) -> None:
    env = dict(os.environ, SOFTVERBS_PURE=pure)
    r = subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
