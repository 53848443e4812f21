"""The teacher kinds: one module each, dispatched from one table.

``KINDS`` maps a kind's name (``domain.vocabulary.TeacherKind``, the
``teachers.kind`` column) to its ``TeacherKindStrategy`` (``kinds.base``).
Registration, re-probe, relaunch, delete, the entry's live checks, a job's
pin, the registration body's rules and the ``teachers.json`` import ask the
table, never a kind's name.

Adding a kind: a module here with a ``KIND`` satisfying the protocol, its
entry in ``KINDS``, the ``TeacherKind`` member, and an Alembic revision
widening the ``teachers.kind`` CHECK constraint.  ``register_kind`` plugs a
kind in at run time (tests use it; see ``tests/api/test_kind_table.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from kiln_registry.domain.errors import RegistrationInvalid
from kiln_registry.teachers.kinds import fixture, local, remote
from kiln_registry.teachers.kinds.base import LegacyRules, TeacherKindStrategy

__all__ = ["KINDS", "LegacyRules", "TeacherKindStrategy", "kind_of", "plugged_kind"]

KINDS: Final[dict[str, TeacherKindStrategy]] = {
    remote.KIND.name: remote.KIND,
    local.KIND.name: local.KIND,
    fixture.KIND.name: fixture.KIND,
}


def kind_of(name: str) -> TeacherKindStrategy:
    """The strategy of kind ``name``, or ``RegistrationInvalid`` for a kind nobody serves."""
    strategy = KINDS.get(name)
    if strategy is None:
        raise RegistrationInvalid(
            f"teacher kind {name[:64]!r} is not served by this registry",
            rule="teacher.kind_unknown",
        )
    return strategy


@contextmanager
def plugged_kind(strategy: TeacherKindStrategy) -> Iterator[TeacherKindStrategy]:
    """``strategy`` in the table under its name for the block (the previous entry restored)."""
    previous = KINDS.get(strategy.name)
    KINDS[strategy.name] = strategy
    try:
        yield strategy
    finally:
        if previous is None:
            del KINDS[strategy.name]
        else:
            KINDS[strategy.name] = previous
