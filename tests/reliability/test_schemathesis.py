"""Schema-driven API testing: schemathesis against a live ``kiln serve`` on loopback.

The registry runs as a real ``kiln serve --config`` subprocess (tiny student,
fresh database) with a fixture teacher and a real reference teacher already
registered, and the reference teacher reachable so generated registrations
can succeed.  schemathesis (its CLI, in a subprocess, so its own warnings and
plugins stay out of this pytest session) reads a copy of
``openapi/kiln-registry.openapi.json`` to which this test only adds
``examples``: good registration bodies (the reference teacher, a fixture
teacher) and the registered aliases, so the examples phase also walks the
success paths.  The schema itself is not changed.  The registry requires
tokens (``auth = "required"``) and schemathesis sends an ``admin`` token, so
the schema's ``bearerAuth`` requirement is exercised too: a request it sends
without the header must be refused (401).

Checks: no 5xx, every response conforms to the schema (status code, content
type, headers, body), invalid requests are refused.  The run is bounded (a
fixed seed, a per-operation example cap, a subprocess deadline, no shrinking) and
the number of cases is recorded in the JSON report; the terminal summary
line prints it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import reference, teacher_url  # noqa: F401  (session fixtures)
from tests.api.support import REPO, ServerProcess, remote, write_config
from tests.auth.support import bearer, create_token

pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")

SCHEMA = REPO / "openapi" / "kiln-registry.openapi.json"
SEED = 20261129
MAX_EXAMPLES = 12
RUN_TIMEOUT_S = 150
CHECKS = (
    "kiln_no_internal_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)
# The registry answers 502/503 on purpose (a teacher that failed its probe, a
# full probe limiter): those are documented in the schema and carry the error
# envelope with their own code.  A 500, or any 5xx without a deliberate code,
# is a server error.  The hook file also tallies the statuses it saw.
HOOKS = """
import json, os
import schemathesis

DELIBERATE = {
    502: {"teacher_identity_probe_failed"},
    503: {"teacher_identity_probe_busy"},
}

@schemathesis.check
def kiln_no_internal_error(ctx, response, case):
    with open(os.environ["KILN_ST_TALLY"], "a", encoding="utf-8") as out:
        out.write(json.dumps([case.operation.label, response.status_code]) + "\\n")
    if response.status_code < 500:
        return None
    try:
        code = response.json()["error"]["code"]
    except Exception:
        code = None
    if code not in DELIBERATE.get(response.status_code, ()):
        raise AssertionError(f"server error {response.status_code} with code {code!r}")
    return None
"""
FIXTURE_ALIAS = "fixture-teacher"
REMOTE_ALIAS = "reference@vllm"


def _with_examples(schema: dict[str, Any], teacher: str) -> dict[str, Any]:
    """A copy of ``schema`` whose registration body and alias parameter carry examples."""
    doc = copy.deepcopy(schema)
    body = doc["paths"]["/v1/teachers"]["post"]["requestBody"]["content"]["application/json"]
    body["examples"] = {
        "remote": {"value": remote("generated@vllm", teacher)},
        "fixture": {
            "value": {"alias": "generated-fixture", "kind": "fixture", "model_id": "fixture-model"}
        },
    }
    for item in doc["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "alias" and parameter.get("in") == "path":
                    parameter["examples"] = {
                        "fixture": {"value": FIXTURE_ALIAS},
                        "remote": {"value": REMOTE_ALIAS},
                    }
    return doc


@pytest.fixture
def admin_token(tmp_path: Path) -> str:
    return create_token(tmp_path / "registry.db", "schemathesis", {"admin"})


@pytest.fixture
def live_registry(
    tmp_path: Path,
    tiny_model: TinyModel,
    teacher_url: str,  # noqa: F811
    admin_token: str,
) -> Iterator[str]:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "required"})
    with ServerProcess(config, tmp_path / "server.log") as server:
        server.wait_ready()
        headers = bearer(admin_token)
        with httpx.Client(
            base_url=server.url, timeout=60, trust_env=False, headers=headers
        ) as http:
            for body in (
                {"alias": FIXTURE_ALIAS, "kind": "fixture", "model_id": "fixture-model"},
                remote(REMOTE_ALIAS, teacher_url),
            ):
                response = http.post("/v1/teachers", json=body)
                assert response.status_code == 200, response.text
        yield server.url
        assert server.proc.poll() is None, server.output()


# The token travels in the environment (never in argv, where `ps` shows it).  A
# request whose head is over serve_guard's bound is refused with 431 before it
# is parsed (documented on every operation): schemathesis' own list of refusal
# statuses lacks it.
ST_CONFIG = """
headers = { Authorization = "Bearer ${KILN_ST_TOKEN}" }

[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, 431]
"""


def _run_schemathesis(
    tmp_path: Path, url: str, teacher: str, token: str
) -> tuple[int, str, dict[str, Any]]:
    schema_path = tmp_path / "openapi-with-examples.json"
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    schema_path.write_text(json.dumps(_with_examples(schema, teacher)), encoding="utf-8")
    report = tmp_path / "st-report.json"
    argv = [
        str(Path(sys.executable).with_name("st")), "run", str(schema_path), f"--url={url}",
        f"--seed={SEED}", f"--max-examples={MAX_EXAMPLES}",
        "--no-shrink", "--workers=1", "--request-timeout=60", "--phases=examples,coverage,fuzzing",
        f"--checks={','.join(CHECKS)}", "--report=json", f"--report-json-path={report}",
        "--continue-on-failure", "--output-truncate=false",
    ]  # fmt: skip
    config = tmp_path / "schemathesis.toml"
    config.write_text(ST_CONFIG, encoding="utf-8")
    argv[1:1] = [f"--config-file={config}"]  # an option of `st` itself
    hooks = tmp_path / "kiln_st_hooks.py"
    hooks.write_text(HOOKS, encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "SCHEMATHESIS_HOOKS": str(hooks), "KILN_ST_TALLY": str(tmp_path / "tally.jsonl"),
           "SCHEMATHESIS_TELEMETRY": "false", "NO_COLOR": "1",
           "KILN_ST_TOKEN": token}  # fmt: skip
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    data = json.loads(report.read_text(encoding="utf-8")) if report.exists() else {}
    return done.returncode, done.stdout + done.stderr, data


def _tally(path: Path) -> Counter[tuple[str, int]]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return Counter((str(op), int(status)) for op, status in map(json.loads, lines))


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    tmp_path: Path,
    live_registry: str,
    teacher_url: str,  # noqa: F811
    admin_token: str,
) -> None:
    status, output, report = _run_schemathesis(tmp_path, live_registry, teacher_url, admin_token)
    (tmp_path / "st-output.txt").write_text(output, encoding="utf-8")  # whole, for a failure
    assert status == 0, output[-20000:]
    cases = report["test_cases"]
    assert cases["with_failures"] == 0 and cases["errored"] == 0, cases
    assert report["operations"]["tested"] == report["operations"]["total"], report["operations"]
    seen = _tally(tmp_path / "tally.jsonl")
    # The custom check ran on every response, and some registrations succeeded.
    assert sum(seen.values()) >= cases["generated"] > 0, (seen, cases)
    assert seen[("POST /v1/teachers", 200)] >= 1, seen
    assert not [key for key in seen if key[1] == 500], seen
    print(f"schemathesis: {cases['generated']} cases, seed {SEED}, statuses {dict(seen)}")
