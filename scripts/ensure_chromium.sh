#!/usr/bin/env sh
# The graph viewer tests drive Debian's Chromium (Playwright's own browser download cannot run here).
# Installs it when missing and we may (root + apt); otherwise says what to do, and the tests fail loudly.
[ -x "${MSPROBE_CHROMIUM:-/usr/bin/chromium}" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }
else
    echo "Chromium is missing: install Debian's 'chromium' (sudo apt-get install chromium) or set MSPROBE_CHROMIUM;" \
         "the graph viewer tests need it." >&2
fi
