#!/usr/bin/env bash
# Install everything the test suite needs from the project's own files, then
# run the whole suite (pytest also runs mypy --strict and ruff; see
# tests/test_lint.py) with the hot modules compiled where a C compiler exists,
# and the device tests again interpreted.  System tools (tshark, iproute2) come from Debian
# packages when we are root and they are missing; tests that need a tool
# that is still absent skip with the reason printed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=""
    for pkg in $(grep -v '^#' scripts/apt-packages.txt); do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null || true
        apt-get install -y -qq $missing >/dev/null || echo "warning: could not install:$missing"
    fi
fi
python3 -m pip install -q -e '.[test]'
python3 -c 'from softverbs.compiled import mode; print("softverbs:", mode())'
python3 -m pytest -q "$@"
# The same install again with the hot modules interpreted (SOFTVERBS_PURE=1,
# softverbs.compiled): the tests that drive the device end to end must pass
# the same way.  A subset, to keep the whole run under 15 minutes on 2 cores;
# with arguments (a selection of tests) only the compiled run happens.
if [ $# -eq 0 ]; then
    SOFTVERBS_PURE=1 python3 -m pytest -q \
        tests/scenarios tests/service tests/native tests/engine tests/verbs \
        tests/wire tests/test_compiled.py
fi
