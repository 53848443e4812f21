#!/usr/bin/env bash
# System tools the test suite uses for real file-system faults:
# xfsprogs (mkfs.xfs) for the reflink staging path on a loop-mounted XFS image.
# Installed only when missing and only as root (CI and these machines run as root);
# elsewhere the XFS tests say why they cannot run.
set -euo pipefail
if command -v mkfs.xfs >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: mkfs.xfs missing and cannot install it (not root or no apt-get)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq xfsprogs >/dev/null
