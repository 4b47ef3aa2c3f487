#!/bin/sh
# What tests/test_browser.py needs besides the Python packages of `make test` (playwright from
# PyPI brings its own driver): Debian's chromium package. No browser build is downloaded
# (never `playwright install`). Needs root and apt; the test runs this when chromium is missing
# and skips, quoting the output, if chromium is still missing afterwards.
set -eu
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "chromium is not installed and installing it needs root (apt-get install chromium)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is not installed and there is no apt-get to install it with" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Update the package lists only when they do not know chromium yet.
if ! apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -qq
fi
apt-get install -y -qq chromium
