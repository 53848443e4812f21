"""Attack 1 (alias hijack), bad tokens, the audit log and the caller identity in the scope.

A real registry (uvicorn in a thread, ``[server] auth = "required"``) with
tokens written to its database; ``kiln tokens revoke`` runs as a separate
process while the server runs and must apply to the very next request.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from kiln_registry.auth.tokens import generate_token
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO, RegistryServer, error_of, run_registry, write_config
from tests.auth.support import bearer, create_token
from tests.backend import execute, fetch

FIXTURE = {"alias": "pinned", "kind": "fixture", "model_id": "m"}


def _whoami(app: Any) -> None:
    """A test-only route showing what the auth layer put in the ASGI scope."""
    assert isinstance(app, FastAPI)

    @app.get("/test/whoami")
    async def whoami(request: Request) -> dict[str, object]:
        ident = request.scope["state"]["kiln_token"]
        return {"name": None if ident is None else ident.name,
                "scopes": None if ident is None else sorted(ident.scopes)}  # fmt: skip


@pytest.fixture
def secured(
    tmp_path: Path, tiny_model: TinyModel
) -> Iterator[tuple[RegistryServer, dict[str, str]]]:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "required"})
    db = tmp_path / "registry.db"
    tokens = {
        "read": create_token(db, "reader", {"read"}),
        "register": create_token(db, "registrar", {"register", "read"}),
        "admin": create_token(db, "root", {"admin"}),
    }
    with run_registry(config, extend=_whoami) as registry:
        yield registry, tokens


def audit(http: httpx.Client, admin: str) -> list[dict[str, Any]]:
    response = http.get("/v1/audit", headers=bearer(admin))
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


def test_alias_hijack_fails_closed(secured: tuple[RegistryServer, dict[str, str]]) -> None:
    registry, t = secured
    with registry.client() as http:
        assert http.post("/v1/teachers", json=FIXTURE).status_code == 401
        assert http.post("/v1/teachers", json=FIXTURE, headers=bearer(t["read"])).status_code == 403
        assert (
            http.post("/v1/teachers", json=FIXTURE, headers=bearer(t["register"])).status_code
            == 200
        )
        assert http.delete("/v1/teachers/pinned", headers=bearer(t["read"])).status_code == 403
        assert http.delete("/v1/teachers/pinned").status_code == 401
        # A register-scoped token may delete, but cannot take the name over.
        assert http.delete("/v1/teachers/pinned", headers=bearer(t["register"])).status_code == 200
        again = http.post("/v1/teachers", json=FIXTURE, headers=bearer(t["register"]))
        assert again.status_code == 409 and error_of(again)["code"] == "teacher_alias_reserved"
        assert "kiln teachers release" in error_of(again)["hint"]
        release = "/v1/admin/aliases/pinned/release"
        assert http.post(release, headers=bearer(t["register"])).status_code == 403
        assert http.post(release, headers=bearer(t["admin"])).json() == {
            "alias": "pinned", "released": True,
        }  # fmt: skip
        assert http.post(release, headers=bearer(t["admin"])).status_code == 404
        assert (
            http.post("/v1/teachers", json=FIXTURE, headers=bearer(t["register"])).status_code
            == 200
        )
        events = audit(http, t["admin"])
    rows = [(e["token"], e["action"], e["target"], e["outcome"]) for e in reversed(events)]
    assert rows == [
        ("reader", "teacher.register", None, "refused"),
        ("registrar", "teacher.register", "pinned", "ok"),
        ("reader", "teacher.delete", "pinned", "refused"),
        ("registrar", "teacher.delete", "pinned", "ok"),
        ("registrar", "teacher.register", "pinned", "refused"),
        ("registrar", "alias.release", "pinned", "refused"),
        ("root", "alias.release", "pinned", "ok"),
        ("root", "alias.release", "pinned", "refused"),
        ("registrar", "teacher.register", "pinned", "ok"),
    ]
    assert not any(token in str(events) for token in t.values())


def _bad_headers(valid: str) -> dict[str, list[tuple[str, str]]]:
    return {
        "unknown": [("authorization", f"Bearer {generate_token()}")],
        "malformed": [("authorization", "Bearer kiln_abc")],
        "oversized": [("authorization", "Bearer kiln_" + "a" * 4000)],
        "not bearer": [("authorization", f"Basic {valid}")],
        "bare token": [("authorization", valid)],
        "empty": [("authorization", "Bearer")],
        "two headers": [("authorization", f"Bearer {valid}"), ("authorization", f"Bearer {valid}")],
    }


def test_bad_tokens_get_401_and_change_nothing(
    secured: tuple[RegistryServer, dict[str, str]],
) -> None:
    registry, t = secured
    with registry.client() as http:
        for what, headers in _bad_headers(t["admin"]).items():
            response = http.post("/v1/teachers", json=FIXTURE, headers=httpx.Headers(headers))
            assert response.status_code == 401, what
            assert response.headers["www-authenticate"] == "Bearer"
            assert error_of(response)["code"] == "unauthorized"
            assert t["admin"] not in response.text
        in_query = http.post(
            f"/v1/teachers?access_token={t['admin']}", json=FIXTURE, headers=bearer(t["admin"])
        )
        assert in_query.status_code == 401 and "query string" in error_of(in_query)["message"]
        assert http.get("/v1/teachers", headers=bearer(t["admin"])).json()["teachers"] == []
        assert audit(http, t["admin"]) == []  # 401s are not recorded


def test_expired_and_revoked_tokens_stop_at_once(
    secured: tuple[RegistryServer, dict[str, str]], tmp_path: Path
) -> None:
    registry, t = secured
    db = tmp_path / "registry.db"
    short = create_token(db, "short", {"read"}, days=1)
    with registry.client() as http:
        assert http.get("/v1/teachers", headers=bearer(short)).status_code == 200
        execute(db, "UPDATE api_tokens SET expires_at = '2000-01-01T00:00:00.000000Z'"
                    " WHERE name = 'short'")  # fmt: skip
        expired = http.get("/v1/teachers", headers=bearer(short))
        assert expired.status_code == 401 and "expired" in error_of(expired)["message"]
        assert http.get("/v1/teachers", headers=bearer(t["read"])).status_code == 200
        revoke = subprocess.run(
            [sys.executable, "-m", "kiln_registry.cli.main", "tokens", "revoke",
             "--config", str(tmp_path / "kiln.toml"), "reader"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert revoke.returncode == 0, revoke.stderr
        assert http.get("/v1/teachers", headers=bearer(t["read"])).status_code == 401


def test_the_caller_identity_is_in_the_asgi_scope(
    secured: tuple[RegistryServer, dict[str, str]],
) -> None:
    registry, t = secured
    with registry.client() as http:
        assert http.get("/test/whoami", headers=bearer(t["read"])).status_code == 403
        me = http.get("/test/whoami", headers=bearer(t["admin"]))
    assert me.json() == {"name": "root", "scopes": ["admin"]}


def test_with_auth_off_the_identity_is_none_and_changes_are_audited(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)  # loopback: auth off by default
    with run_registry(config, extend=_whoami) as registry, registry.client() as http:
        assert http.get("/test/whoami").json() == {"name": None, "scopes": None}
        assert http.post("/v1/teachers", json=FIXTURE).status_code == 200
        [event] = http.get("/v1/audit").json()["events"]
    assert (event["token"], event["action"], event["target"]) == (
        None,
        "teacher.register",
        "pinned",
    )


def test_last_used_is_written_in_batches(
    secured: tuple[RegistryServer, dict[str, str]], tmp_path: Path
) -> None:
    registry, t = secured
    with registry.client() as http:
        for _ in range(5):
            assert http.get("/v1/teachers", headers=bearer(t["read"])).status_code == 200
    rows = dict(fetch(tmp_path / "registry.db", "SELECT name, last_used_at FROM api_tokens"))
    # The first use is written (on the next request); later uses wait a minute.
    assert rows["reader"] is not None and rows["root"] is None


def test_kiln_teachers_release_and_kiln_audit_need_an_admin_token(
    secured: tuple[RegistryServer, dict[str, str]],
) -> None:
    registry, t = secured
    with registry.client() as http:
        assert (
            http.post("/v1/teachers", json=FIXTURE, headers=bearer(t["register"])).status_code
            == 200
        )
        assert http.delete("/v1/teachers/pinned", headers=bearer(t["register"])).status_code == 200

    def kiln(*argv: str, token: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kiln_registry.cli.main", *argv, "--server", registry.url],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "KILN_TOKEN": token},
        )  # fmt: skip

    refused = kiln("teachers", "release", "pinned", token=t["register"])
    assert refused.returncode == 2 and "forbidden" in refused.stderr
    released = kiln("teachers", "release", "pinned", token=t["admin"])
    assert released.returncode == 0 and "released pinned" in released.stdout
    shown = kiln("audit", "--limit", "2", token=t["admin"])
    assert shown.returncode == 0 and "alias.release\tpinned\tok" in shown.stdout
    assert kiln("audit", token=t["read"]).returncode == 2
