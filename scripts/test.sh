#!/usr/bin/env bash
# Install everything the test suite needs from the project's own files, then
# run the whole suite (pytest also runs mypy --strict and ruff; see
# tests/test_lint.py).  System tools (tshark, iproute2) come from Debian
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
python3 -m pytest -q "$@"
