#!/usr/bin/env sh
# The graph viewer tests drive Debian's Chromium (Playwright's own browser download cannot run here).
# When it is missing and we run as root with apt, this installs Debian's `chromium` and the packages it
# needs, nothing else: it first asks apt what that takes (a dry run), says it, and installs only when no
# installed package would be upgraded by it (recommended packages are left out). Otherwise it says what
# to do, and the browser tests fail loudly.
CHROMIUM="${MSPROBE_CHROMIUM:-/usr/bin/chromium}"
[ -x "$CHROMIUM" ] && exit 0
MANUAL="install Debian's 'chromium' yourself (apt-get install --no-install-recommends chromium) or set
MSPROBE_CHROMIUM to a Chromium binary; the graph viewer tests need it."

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "make test: Chromium is missing ($CHROMIUM): $MANUAL" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
INSTALL="apt-get install -y -q --no-install-recommends --no-upgrade chromium"

plan() {  # apt's dry run: "Inst name (version ...)" is a new package, "Inst name [old] (new ...)" an upgrade
    apt-get install -s --no-install-recommends --no-upgrade chromium 2>/dev/null | grep '^Inst '
}

steps=$(plan)
if [ -z "$steps" ]; then
    echo "make test: Chromium is missing; apt knows no 'chromium' package yet: running 'apt-get update -q'" \
         "(it refreshes apt's package lists, installs nothing)"
    apt-get update -q >/dev/null || { echo "make test: apt-get update failed: $MANUAL" >&2; exit 0; }
    steps=$(plan)
fi
new=$(echo "$steps" | sed -n 's/^Inst \([^ ]*\) (.*/\1/p' | tr '\n' ' ')
upgrades=$(echo "$steps" | sed -n 's/^Inst \([^ ]*\) \[.*/\1/p' | tr '\n' ' ')
if [ -z "$new" ]; then
    echo "make test: Chromium is missing and apt cannot install 'chromium' here: $MANUAL" >&2
    exit 0
fi
if [ -n "$upgrades" ]; then
    echo "make test: installing Debian's chromium here would also upgrade installed packages ($upgrades)," \
         "so it is not done: $MANUAL" >&2
    exit 0
fi
echo "make test: the graph viewer tests need Chromium; installing Debian's chromium with" \
     "'$INSTALL': $(echo "$new" | wc -w) new packages ($new), no upgrades, no recommended packages"
$INSTALL
