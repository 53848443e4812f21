"""Issue 15, attack 7: the audit log and the reserved aliases cannot grow without bound.

The audit log keeps at most ``[server] audit_max_events`` events and none
older than ``audit_retain_days`` (pruned as events are written, on a real
migrated SQLite file); at most ``max_reserved_aliases`` deleted aliases stay
reserved, and a delete past the cap is refused and changes nothing.  The keys
are strict.  Every "delete and register again" hint names the release step.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.auth.models import AuditEventRow
from kiln_registry.auth.repository import AuditBounds, AuditRepository
from kiln_registry.config.loader import load_config
from kiln_registry.db.engine import open_engine, session_factory, upgrade_to_head
from kiln_registry.db.repository import unit_of_work
from kiln_registry.domain.errors import ConfigError
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config

RELEASE = "kiln teachers release ALIAS"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_engine(tmp_path / "registry.db")
    upgrade_to_head(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def _record(sessions: sessionmaker[Session], bounds: AuditBounds, n: int) -> None:
    for i in range(n):
        with unit_of_work(sessions) as session:
            AuditRepository(session, bounds).record(
                token_name="t", action="job.submit", target=f"e{i}", outcome="ok"
            )


def _targets(sessions: sessionmaker[Session]) -> list[str]:
    with unit_of_work(sessions) as session:
        rows = session.scalars(select(AuditEventRow.target).order_by(AuditEventRow.id))
        return [str(t) for t in rows]


def _old_events(sessions: sessionmaker[Session], days: float, n: int) -> None:
    old = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with unit_of_work(sessions) as session:
        for i in range(n):
            session.add(AuditEventRow(at=old, token_name=None, action="a", target=f"old{i}",
                                      outcome="ok", status=200))  # fmt: skip


def test_the_audit_log_keeps_the_newest_max_events(sessions: sessionmaker[Session]) -> None:
    _old_events(sessions, 31, 15)  # older than audit_keep_days (30): these may go
    _record(sessions, AuditBounds(max_events=10), 5)
    assert _targets(sessions) == [f"old{i}" for i in range(10, 15)] + [f"e{i}" for i in range(5)]


def test_the_audit_log_never_drops_an_event_younger_than_keep_days(
    sessions: sessionmaker[Session],
) -> None:
    """Issue 27 item 1: a full log refuses (``room``) rather than forgetting young events."""
    _old_events(sessions, 29, 8)  # younger than audit_keep_days (30)
    bounds = AuditBounds(max_events=10)
    _record(sessions, bounds, 2)
    with unit_of_work(sessions) as session:
        room = AuditRepository(session, bounds).room()
    assert not room.free and 86_400 - 60 <= room.retry_after_s <= 86_400
    _record(sessions, bounds, 1)  # a write that got past the check still drops nothing young
    assert len(_targets(sessions)) == 11
    with unit_of_work(sessions) as session:
        assert AuditRepository(session, AuditBounds(max_events=10, keep_days=28)).room().free


def test_the_audit_log_drops_events_past_retain_days(sessions: sessionmaker[Session]) -> None:
    old = (datetime.now(UTC) - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with unit_of_work(sessions) as session:
        for i in range(300):  # more than one write's peek: the next writes take the rest
            session.add(AuditEventRow(at=old, token_name=None, action="a", target=f"old{i}",
                                      outcome="ok", status=200))  # fmt: skip
    _record(sessions, AuditBounds(retain_days=2), 2)
    assert _targets(sessions) == ["e0", "e1"]
    _record(sessions, AuditBounds(retain_days=7), 1)  # nothing is 7 days old
    assert _targets(sessions) == ["e0", "e1", "e0"]


def test_without_retain_days_old_events_stay(sessions: sessionmaker[Session]) -> None:
    old = (datetime.now(UTC) - timedelta(days=3000)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with unit_of_work(sessions) as session:
        session.add(AuditEventRow(at=old, token_name=None, action="a", target="old",
                                  outcome="ok", status=200))  # fmt: skip
    _record(sessions, AuditBounds(), 1)
    assert _targets(sessions) == ["old", "e0"]


@pytest.fixture
def capped(tmp_path: Path, tiny_model: TinyModel) -> Iterator[RegistryServer]:
    server = {"max_reserved_aliases": 2, "audit_max_events": 1000, "audit_retain_days": 30}
    with run_registry(write_config(tmp_path, student=tiny_model.path, server=server)) as reg:
        yield reg


def _count(registry: RegistryServer, action: str) -> int:
    with unit_of_work(registry.ctx.sessions) as session:
        query = select(func.count()).where(AuditEventRow.action == action)
        return int(session.scalar(query) or 0)


def test_a_delete_past_max_reserved_aliases_is_refused(capped: RegistryServer) -> None:
    with capped.client() as http:
        for alias in ("a", "b", "c"):
            body = {"alias": alias, "kind": "fixture", "model_id": "m"}
            assert http.post("/v1/teachers", json=body).status_code == 200
        assert http.delete("/v1/teachers/a").status_code == 200
        assert http.delete("/v1/teachers/b").status_code == 200
        refused = http.delete("/v1/teachers/c")
        assert refused.status_code == 409, refused.text
        error = error_of(refused)
        assert error["code"] == "reserved_aliases_full" and error["rule"] == "alias.reserved_full"
        assert "kiln teachers release" in error["hint"]
        assert http.get("/v1/teachers/c").status_code == 200  # nothing changed
        assert http.post("/v1/admin/aliases/a/release").status_code == 200
        assert http.delete("/v1/teachers/c").status_code == 200
    assert _count(capped, "teacher.delete") == 4  # refusals are audited too


def test_reregistering_hints_name_the_release(capped: RegistryServer) -> None:
    body = {"alias": "x", "kind": "fixture", "model_id": "m"}
    with capped.client() as http:
        assert http.post("/v1/teachers", json=body).status_code == 200
        exists = error_of(http.post("/v1/teachers", json=body))
        assert exists["code"] == "teacher_alias_exists" and RELEASE in exists["hint"]
        assert http.delete("/v1/teachers/x").status_code == 200
        reserved = error_of(http.post("/v1/teachers", json=body))
        assert reserved["code"] == "teacher_alias_reserved" and "release" in reserved["hint"]


@pytest.mark.parametrize(
    "line",
    [
        "max_reserved_aliases = 0",
        "audit_max_events = 999",
        'audit_max_events = "1000000"',
        "audit_retain_days = 0",
        "audit_retain_days = 1.5",
        "audit_retain = 30",
        "audit_keep_days = 0",
        "audit_retain_days = 7",  # shorter than audit_keep_days (30): a contradiction
    ],
)
def test_growth_keys_are_strict(tmp_path: Path, tiny_model: TinyModel, line: str) -> None:
    path = write_config(tmp_path, student=tiny_model.path)
    text = path.read_text(encoding="utf-8").replace("[server]\n", f"[server]\n{line}\n", 1)
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert line.split(" ")[0] in str(refused.value)
