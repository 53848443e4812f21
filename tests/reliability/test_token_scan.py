"""Secret-leak scan extended to API tokens (issue 15).

A real ``kiln serve`` (debug logging, ``auth = "required"``) and tokens made
by ``kiln tokens create``; the test uses every token (valid, wrong scope,
revoked, expired, in the query string, malformed), runs ``kiln audit`` and
``kiln tokens list`` with the token in ``KILN_TOKEN``, and captures ``ps``
output of every process while they run.  Then every response (status,
headers, body), log line, CLI output, the database files, the audit rows and
the ``ps`` output are scanned for each token in every form
``test_secret_scan.needles`` knows (raw, base64 at every alignment, URL and
JSON forms, any 16-character piece).  Only ``kiln tokens create``'s own
stdout, where the token is printed once on purpose, is exempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import CLEAN_EXIT, REPO, ServerProcess, write_config
from tests.backend import execute
from tests.reliability.test_secret_scan import _database_texts, _response_text, scan

FIXTURE = {"alias": "pinned", "kind": "fixture", "model_id": "m"}


def kiln(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *argv], cwd=REPO, capture_output=True,
        text=True, timeout=120, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _make(config: Path, name: str, *scopes: str) -> str:
    argv = ["tokens", "create", "--config", str(config), "--name", name]
    for scope in scopes:
        argv += ["--scope", scope]
    made = kiln(*argv)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _ps() -> str:
    return subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def _requests(http: httpx.Client, t: dict[str, str]) -> list[httpx.Response]:
    def auth(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    return [
        http.post("/v1/teachers", json=FIXTURE, headers=auth(t["admin"])),
        http.get("/v1/teachers/pinned", headers=auth(t["read"])),
        http.delete("/v1/teachers/pinned", headers=auth(t["read"])),
        http.delete("/v1/teachers/pinned", headers=auth(t["admin"])),
        http.post("/v1/admin/aliases/pinned/release", headers=auth(t["admin"])),
        http.get(f"/v1/teachers?access_token={t['read']}"),
        http.get(f"/v1/teachers?x={t['read']}", headers=auth(t["read"])),
        http.get("/v1/teachers", headers=auth(t["revoked"])),
        http.get("/v1/teachers", headers=auth(t["expired"])),
        http.get("/v1/teachers", headers=auth(t["read"][:-1])),
        http.get("/v1/teachers", headers={"authorization": f"Basic {t['admin']}"}),
        http.get("/metrics", headers=auth(t["read"])),
        http.get("/v1/audit", headers=auth(t["admin"])),
    ]


def test_tokens_leak_nowhere(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path,
                          server={"auth": "required", "log_level": "debug"})  # fmt: skip
    names = {"admin": ("admin",), "read": ("read",), "revoked": ("read",), "expired": ("read",)}
    tokens = {name: _make(config, f"t-{name}", *scopes) for name, scopes in names.items()}
    texts: list[tuple[str, str]] = []
    with ServerProcess(config, tmp_path / "server.log") as server:
        server.wait_ready()
        revoked = kiln("tokens", "revoke", "--config", str(config), "t-revoked")
        execute(tmp_path / "registry.db", "UPDATE api_tokens SET expires_at = "
                "'2000-01-01T00:00:00.000000Z' WHERE name = 't-expired'")  # fmt: skip
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as http:
            responses = _requests(http, tokens)
        texts.append(("ps while serving", _ps()))
        cli = [
            kiln("audit", "--server", server.url, env={"KILN_TOKEN": tokens["admin"]}),
            kiln(
                "audit",
                "--server",
                server.url,
                "--json",
                "--token-env",
                "ADMIN_T",
                env={"ADMIN_T": tokens["admin"]},
            ),
            kiln("teachers", "list", "--server", server.url, env={"KILN_TOKEN": tokens["read"]}),
            kiln("teachers", "list", "--server", server.url, env={"KILN_TOKEN": "kiln_bad"}),
            kiln("tokens", "list", "--config", str(config)),
            revoked,
        ]
        assert server.stop() in CLEAN_EXIT
    statuses = [r.status_code for r in responses]
    assert statuses == [200, 200, 403, 200, 200, 401, 401, 401, 401, 401, 401, 200, 200]
    assert [c.returncode for c in cli] == [0, 0, 0, 2, 0, 0], [c.stderr for c in cli]
    assert "teacher.delete" in cli[0].stdout and "t-admin" in cli[0].stdout
    log = server.output()
    # The access log has the refused query-token requests, never a query string.
    assert "status=401" in log and "access_token" not in log
    texts += [(f"response {i}", _response_text(r)) for i, r in enumerate(responses)]
    texts += [(f"log line {n}", line) for n, line in enumerate(log.splitlines(), 1)]
    texts += [(f"cli {i}", c.stdout + c.stderr) for i, c in enumerate(cli)]
    texts += _database_texts(tmp_path)
    hits = scan(texts, tokens.values())
    assert hits == [], hits
