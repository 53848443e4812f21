"""domain.text (the one quoting/clipping/excerpt helper and pydantic error renderer) and
domain.vocabulary (the one set of kinds and statuses): the outputs the call sites showed
before they shared these helpers, and the CHECK lists and wire enums built from them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from sqlalchemy import CheckConstraint

from kiln_registry.db.models import TEACHER_KINDS, TEACHER_STATUSES, Base
from kiln_registry.domain.text import (
    clipped,
    clipped_repr,
    error_location,
    error_message,
    escaped_excerpt,
    line_excerpt,
    quoted,
    render_errors,
    shown,
)
from kiln_registry.domain.vocabulary import (
    ACTIVE_JOB_STATUSES,
    PUBLISHED_TEACHER_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobKind,
    JobStatus,
    TeacherKind,
    TeacherStatus,
)
from kiln_registry.jobs.core.models import JOB_KINDS, JOB_STATUSES
from kiln_registry.wire.jobs import JobStatus as WireJobStatus
from kiln_registry.wire.teachers import TeacherKind as WireTeacherKind
from kiln_registry.wire.teachers import TeacherStatus as WireTeacherStatus


def test_quoted_is_the_repr_of_the_cut_value() -> None:
    assert quoted("abc", 80) == "'abc'"
    assert quoted("x" * 100, 80) == repr("x" * 80)
    assert quoted("x" * 100, 64, "...") == repr("x" * 64 + "...")
    assert quoted(12345, 3) == "'123'"
    assert quoted("a\nb", 80) == "'a\\nb'"


def test_shown_quotes_a_name_to_64_characters() -> None:
    assert shown("alias") == "'alias'"
    assert shown("a" * 64) == repr("a" * 64)
    assert shown("a" * 65) == repr("a" * 64 + "...")


def test_clipped_keeps_the_total_within_the_limit() -> None:
    assert clipped("short", 10) == "short"
    assert clipped("x" * 11, 10) == "x" * 9 + "…"
    assert clipped("x" * 11, 10, "...") == "x" * 7 + "..."
    assert clipped_repr("y" * 100, 20) == repr("y" * 100)[:17] + "..."
    assert len(clipped_repr({"k": "v" * 100}, 60)) == 60


def test_excerpts_of_untrusted_bytes() -> None:
    assert escaped_excerpt(b"ok\x1b[31m\xff", 400) == "ok\\x1b[31m\ufffd"
    assert escaped_excerpt(b"z" * 1000, 5) == "zzzzz"
    assert line_excerpt(b"  a\r\n\tb\x00c  ", 200) == "a b c"
    assert line_excerpt(b"w" * 1000, 7) == "w" * 7


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    name: str

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        raise ValueError("name is refused")


def test_one_renderer_of_pydantic_errors() -> None:
    try:
        _Body.model_validate({"n": "x", "name": "a", "extra": 1})
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
    lines = render_errors(errors, 2, lambda e: f"{error_location(e['loc'], empty='-')}: "
                          f"{error_message(e)}")  # fmt: skip
    assert lines[0].startswith("n: Input should be a valid integer")
    assert lines[1] == "name: name is refused"
    assert lines[2] == "... and 1 more"
    assert error_location(("body", "a", 0), empty="body", skip=("body",)) == "a.0"
    assert error_location((), empty="(top level)") == "(top level)"


def test_the_rows_check_lists_come_from_the_vocabulary_unchanged() -> None:
    assert TEACHER_KINDS == ("remote", "local", "fixture")
    assert TEACHER_STATUSES == (
        "verified", "configured", "legacy_unverified", "unavailable", "launching",
    )  # fmt: skip
    assert JOB_KINDS == ("teacher_scoring", "off_policy_generation")
    assert JOB_STATUSES == ("queued", "probing", "running", "succeeded", "failed", "cancelled")
    metadata = Base.metadata
    checks = {
        str(c.sqltext)
        for table in (metadata.tables["teachers"], metadata.tables["jobs"])
        for c in table.constraints
        if isinstance(c, CheckConstraint)
    }
    assert "kind IN ('remote', 'local', 'fixture')" in checks
    assert "status IN ('queued', 'probing', 'running', 'succeeded', 'failed', 'cancelled')" in (
        checks
    )
    assert "kind IN ('teacher_scoring', 'off_policy_generation')" in checks


def test_the_wire_enums_are_the_vocabulary() -> None:
    assert WireTeacherKind is TeacherKind and WireJobStatus is JobStatus
    assert [s.value for s in WireTeacherStatus] == [s.value for s in PUBLISHED_TEACHER_STATUSES]
    assert set(TeacherStatus) - set(PUBLISHED_TEACHER_STATUSES) == {TeacherStatus.launching}
    assert set(ACTIVE_JOB_STATUSES) | set(TERMINAL_JOB_STATUSES) | {JobStatus.queued} == set(
        JobStatus
    )
    assert [k.value for k in JobKind] == list(JOB_KINDS)
