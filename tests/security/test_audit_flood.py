"""Issue 27, items 1 and 15: no anonymous audit rows, no eviction of young ones, redaction.

A real registry (uvicorn on 127.0.0.1, ``auth = "required"``,
``audit_max_events = 1000``) on a real database.  Before the fix every method
on an open path (``POST /health``: 405) wrote an anonymous audit row, and 1,000
of them evicted the admin's rows.  Now open paths are open for ``GET``/``HEAD``
only, a 401 or a request naming no state-changing route writes nothing, a
full log of young events refuses the next state change (``503
audit_log_full`` with ``Retry-After``) and changes nothing, and a token-shaped
alias is redacted in the audit table as in the log file.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kiln_registry.auth.models import AuditEventRow
from kiln_registry.auth.tokens import generate_token
from kiln_registry.db.repository import unit_of_work
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.auth.support import bearer, create_token
from tests.backend import execute, fetch

OPEN = ["/health", "/", "/ui", "/docs", "/assets/ui.js", "/nowhere"]
STAMP = "%Y-%m-%dT%H:%M:%S.%fZ"


@pytest.fixture
def audited(tmp_path: Path, tiny_model: TinyModel) -> Iterator[tuple[RegistryServer, str, str]]:
    server = {"auth": "required", "audit_max_events": 1000}
    config = write_config(tmp_path, student=tiny_model.path, server=server)
    db = tmp_path / "registry.db"
    admin = create_token(db, "root", {"admin"})
    register = create_token(db, "registrar", {"register", "read"})
    with run_registry(config) as registry:
        yield registry, admin, register


def _events(registry: RegistryServer) -> int:
    with unit_of_work(registry.ctx.sessions) as session:
        return session.query(AuditEventRow).count()


def _fixture(alias: str) -> dict[str, str]:
    return {"alias": alias, "kind": "fixture", "model_id": "m"}


def test_anonymous_requests_never_write_audit_rows(
    audited: tuple[RegistryServer, str, str],
) -> None:
    registry, admin, _ = audited
    with registry.client() as http:
        for path in OPEN:
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                response = http.request(method, path)
                assert response.status_code == 401, (method, path, response.text)
        assert http.get("/health").status_code == 200  # still open for its own method
        assert http.head("/ui").status_code in (200, 405)
    assert _events(registry) == 0
    with registry.client() as http:  # a token holder's stray request is audited, by name
        assert http.post("/health", headers=bearer(admin)).status_code == 405
    assert _events(registry) == 1


def test_with_auth_off_open_paths_write_no_rows(tmp_path: Path, tiny_model: TinyModel) -> None:
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as registry:
        with registry.client() as http:
            for path in OPEN:
                assert http.post(path).status_code in (404, 405), path
            assert http.post("/v1/teachers", json=_fixture("a")).status_code == 200
        assert _events(registry) == 1  # the registration only


def test_a_full_log_refuses_state_changes_instead_of_forgetting(
    audited: tuple[RegistryServer, str, str], tmp_path: Path
) -> None:
    registry, admin, register = audited
    db = tmp_path / "registry.db"
    with registry.client() as http:
        assert http.post(
            "/v1/teachers", json=_fixture("first"), headers=bearer(register)
        ).is_success
        young = datetime.now(UTC).strftime(STAMP)
        with unit_of_work(registry.ctx.sessions) as session:
            session.add_all(
                AuditEventRow(
                    at=young,
                    token_name=None,
                    action="job.submit",
                    target=f"j{i}",
                    outcome="ok",
                    status=200,
                )
                for i in range(999)
            )
        refused = http.post("/v1/teachers", json=_fixture("second"), headers=bearer(register))
        assert refused.status_code == 503, refused.text
        assert error_of(refused)["code"] == "audit_log_full"
        assert 0 < int(refused.headers["retry-after"]) <= 86_400
        assert http.get("/v1/teachers/second", headers=bearer(register)).status_code == 404
        deleted = http.delete("/v1/teachers/first", headers=bearer(admin))
        assert deleted.status_code == 503  # every state change, an admin's too
        assert http.get("/v1/teachers/first", headers=bearer(register)).status_code == 200
        assert _events(registry) == 1000
        first = fetch(db, "SELECT target FROM audit_events ORDER BY id LIMIT 1")
        assert first == [("first",)]  # the oldest row was not forgotten
        # Once the oldest row is older than audit_keep_days it may go, and only it.
        old = (datetime.now(UTC) - timedelta(days=31)).strftime(STAMP)
        execute(db, f"UPDATE audit_events SET at = '{old}' WHERE target = 'first'")
        assert http.post(
            "/v1/teachers", json=_fixture("second"), headers=bearer(register)
        ).is_success
    targets = [t for (t,) in fetch(db, "SELECT target FROM audit_events ORDER BY id")]
    assert len(targets) == 1000 and targets[0] == "j0" and targets[-1] == "second"


def test_a_token_shaped_alias_is_redacted_in_the_audit_table(
    audited: tuple[RegistryServer, str, str], tmp_path: Path
) -> None:
    registry, admin, register = audited
    shaped = generate_token()  # what a careless caller pastes as an alias
    with registry.client() as http:
        answer = http.post("/v1/teachers", json=_fixture(shaped), headers=bearer(register))
        assert answer.status_code in (200, 400), answer.text
        http.post(f"/v1/teachers/{shaped}/probe", headers=bearer(register))
        events = http.get("/v1/audit", headers=bearer(admin)).json()["events"]
    assert len(events) == 2
    assert all(e["target"] == "kiln_[redacted]" for e in events), events
    rows = fetch(tmp_path / "registry.db", "SELECT * FROM audit_events")
    assert rows and not any(shaped in str(row) for row in rows)
