"""TeacherRepository and unit_of_work on a real, migrated SQLite file."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.db.engine import open_engine, session_factory, upgrade_to_head
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import (
    MAX_STATUS_MESSAGE_CHARS,
    TeacherRepository,
    unit_of_work,
)
from kiln_registry.domain.errors import (
    AliasExists,
    InputError,
    RegistrationInvalid,
    TeacherNotFound,
)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_engine(tmp_path / "registry.db")
    upgrade_to_head(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def _teacher(alias: str, **fields: str) -> TeacherRow:
    values = {"kind": "remote", "status": "configured", "model_id": "org/model"} | fields
    return TeacherRow(alias=alias, **values)


def test_insert_get_and_list_in_alias_order(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        for alias in ("charlie", "alpha", "bravo"):
            repo.insert(_teacher(alias, credential_id="openai-prod"))
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        row = repo.get("alpha")
        assert row is not None
        assert (row.kind, row.credential_id, row.status) == ("remote", "openai-prod", "configured")
        assert row.created_at == row.updated_at
        assert row.created_at.endswith("Z")
        assert repo.get("missing") is None
        assert [r.alias for r in repo.list_all()] == ["alpha", "bravo", "charlie"]
        assert [r.alias for r in repo.list_all(limit=2)] == ["alpha", "bravo"]


def test_same_alias_twice_is_alias_exists_and_keeps_the_session_usable(
    factory: sessionmaker[Session],
) -> None:
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        repo.insert(_teacher("t1"))
        with pytest.raises(AliasExists) as info:
            repo.insert(_teacher("t1", kind="local", notes="do-not-echo"))
        assert info.value.code == "teacher_alias_exists"
        assert "t1" in info.value.message
        # The chained driver error names the statement but not the bound values.
        assert "do-not-echo" not in str(info.value.__cause__)
        repo.insert(_teacher("t2"))
    with unit_of_work(factory) as session:
        rows = TeacherRepository(session).list_all()
        assert [(r.alias, r.kind) for r in rows] == [("t1", "remote"), ("t2", "remote")]


def test_the_repository_never_commits(factory: sessionmaker[Session]) -> None:
    session = factory()
    repo = TeacherRepository(session)
    repo.insert(_teacher("uncommitted"))
    repo.add_receipt("uncommitted", "passed", None, {})
    session.close()  # no commit: everything is discarded
    with unit_of_work(factory) as check:
        assert TeacherRepository(check).get("uncommitted") is None
        assert TeacherRepository(check).list_receipts("uncommitted") == []


def test_unit_of_work_rolls_back_when_the_block_raises(factory: sessionmaker[Session]) -> None:
    with pytest.raises(RuntimeError), unit_of_work(factory) as session:
        TeacherRepository(session).insert(_teacher("rolled-back"))
        raise RuntimeError("request failed after the insert")
    with unit_of_work(factory) as session:
        assert TeacherRepository(session).get("rolled-back") is None


def test_delete(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        TeacherRepository(session).insert(_teacher("gone"))
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        assert repo.delete("gone") is True
        assert repo.get("gone") is None
        assert repo.delete("gone") is False
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        assert repo.get("gone") is None
        repo.insert(_teacher("gone", kind="local"))  # deleted aliases can be registered again


def test_update_status(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        TeacherRepository(session).insert(_teacher("s"))
    with unit_of_work(factory) as session:
        TeacherRepository(session).update_status("s", "verified", "probe passed")
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        row = repo.get("s")
        assert row is not None
        assert (row.status, row.status_message) == ("verified", "probe passed")
        assert row.updated_at > row.created_at
        repo.update_status("s", "unavailable", "x" * (MAX_STATUS_MESSAGE_CHARS + 50))
        row = repo.get("s")
        assert row is not None and row.status_message is not None
        assert len(row.status_message) == MAX_STATUS_MESSAGE_CHARS
        with pytest.raises(TeacherNotFound):
            repo.update_status("nobody", "verified", None)
        with pytest.raises(RegistrationInvalid) as info:
            repo.update_status("s", "trusted", None)
        assert info.value.rule == "teacher.status"


@pytest.mark.parametrize(("field", "value"), [("kind", "cloud"), ("status", "ok")])
def test_insert_refuses_values_outside_the_allowed_sets(
    factory: sessionmaker[Session], field: str, value: str
) -> None:
    with unit_of_work(factory) as session:
        with pytest.raises(RegistrationInvalid) as info:
            TeacherRepository(session).insert(_teacher("bad", **{field: value}))
        assert info.value.rule == f"teacher.{field}"
        assert value in info.value.message


def test_receipts_newest_first_bounded_and_outliving_the_alias(
    factory: sessionmaker[Session],
) -> None:
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        repo.insert(_teacher("r"))
        ids = [
            repo.add_receipt("r", "failed", None, {"attempt": 1, "error": "timeout"}),
            repo.add_receipt("r", "passed", "sha256:" + "ab" * 32, {"attempt": 2}),
            repo.add_receipt("r", "passed", "sha256:" + "ab" * 32, {"attempt": 3}),
        ]
        assert ids == sorted(ids)
        repo.add_receipt("other", "passed", None, {})
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        assert repo.delete("r")
    with unit_of_work(factory) as session:
        receipts = TeacherRepository(session).list_receipts("r")
        assert [r.id for r in receipts] == ids[::-1]
        assert receipts[-1].report_json == '{"attempt":1,"error":"timeout"}'
        assert receipts[0].identity_digest == "sha256:" + "ab" * 32
        assert [r.id for r in TeacherRepository(session).list_receipts("r", limit=1)] == [ids[2]]


@pytest.mark.parametrize(
    ("report", "rule"),
    [
        ({"score": float("nan")}, "db.receipt"),
        ({"blob": object()}, "db.receipt"),
        ({"text": "x" * (1 << 20)}, "db.receipt_size"),
    ],
)
def test_add_receipt_refuses_bad_reports(
    factory: sessionmaker[Session], report: dict[str, object], rule: str
) -> None:
    with unit_of_work(factory) as session:
        with pytest.raises(InputError) as info:
            TeacherRepository(session).add_receipt("r", "passed", None, report)
        assert info.value.rule == rule
        with pytest.raises(InputError) as outcome:
            TeacherRepository(session).add_receipt("r", "maybe", None, {})
        assert outcome.value.rule == "db.receipt_outcome"


@pytest.mark.parametrize("limit", [0, -1, 10_001, True])
def test_list_limits_are_bounded(factory: sessionmaker[Session], limit: int) -> None:
    with unit_of_work(factory) as session:
        repo = TeacherRepository(session)
        with pytest.raises(InputError) as info:
            repo.list_all(limit=limit)
        assert info.value.rule == "db.limit"
        with pytest.raises(InputError):
            repo.list_receipts("r", limit=limit)


def test_fifty_concurrent_registrations_of_one_alias_one_wins(
    factory: sessionmaker[Session],
) -> None:
    workers = 50
    barrier = threading.Barrier(workers)
    outcomes: list[str] = []
    lock = threading.Lock()

    def register(number: int) -> None:
        barrier.wait()
        try:
            with unit_of_work(factory) as session:
                TeacherRepository(session).insert(_teacher("contested", notes=f"worker {number}"))
            result = "won"
        except AliasExists:
            result = "alias_exists"
        except Exception as exc:  # e.g. "database is locked": fails the assertion below
            result = f"unexpected {exc!r}"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=register, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["alias_exists"] * (workers - 1) + ["won"]
    with unit_of_work(factory) as session:
        rows = TeacherRepository(session).list_all()
        assert [r.alias for r in rows] == ["contested"]
