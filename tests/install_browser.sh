#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the report's browser test (tests/test_report_html.py).
# .ci/run calls this before pytest; the test's session fixture calls it too when chromium is missing.
# Exit 0 when chromium is (now) on PATH, 3 when apt is not available here (the test then skips, saying so).
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser.sh: apt-get is not available; cannot install chromium" >&2
    exit 3
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install_browser.sh: not root and no passwordless sudo; cannot run apt-get" >&2
        exit 3
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# The package lists are often empty in fresh containers: chromium is not found without an update first.
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
