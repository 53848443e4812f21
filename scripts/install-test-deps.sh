#!/usr/bin/env bash
# System tools the test suite uses, installed only when missing and only as root
# (CI and these machines run as root); elsewhere the tests that need them say why
# they cannot run.
#   xfsprogs (mkfs.xfs): the reflink staging path on a loop-mounted XFS image.
#   chromium: the browser tests (tests/browser) drive Debian's headless Chromium
#             through Playwright (no browser download; Playwright's driver ships in
#             its wheel).
#   faketime: libfaketime, preloaded into one `kiln worker` to skew its clock
#             (tests/scaleout/test_clock_skew.py: leases follow the database's clock).
#   postgresql: the PostgreSQL backend tests (tests/pg_server.py runs initdb and
#               postgres from /usr/lib/postgresql/<version>/bin, which Debian keeps
#               off PATH).
set -euo pipefail
missing=()
if ! command -v mkfs.xfs >/dev/null 2>&1; then
    missing+=(xfsprogs)
fi
if ! command -v chromium >/dev/null 2>&1; then
    missing+=(chromium)
fi
if ! compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null; then
    missing+=(faketime)
fi
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    missing+=(postgresql)
fi
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: ${missing[*]} missing and cannot install (not root or no apt-get)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
