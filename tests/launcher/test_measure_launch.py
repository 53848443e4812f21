"""The launch's helper children and the deferred recheck (launcher.children / measure_launch).

Real children (``python -c``) stand in for the recheck child's output: a
recheck that disagrees cannot otherwise be produced without changing the
installed runtime between two measurements.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.input_manifest import TeacherInput, load_teacher_input
from kiln_registry.launcher.children import HelperChild
from kiln_registry.launcher.measure_launch import PendingRecheck
from kiln_registry.launcher.phases import PhaseClock, terminal_listener
from kiln_registry.launcher.teacher_input import teacher_input_document

ENV = {"PATH": "/usr/bin:/bin"}


def _inputs(tmp_path: Path) -> TeacherInput:
    """A valid ``kiln.vllm-teacher-input.v2`` from the shared vectors."""
    vectors = json.loads((Path(__file__).parents[1] / "vectors" / "teacher_input.json").read_text())
    path = tmp_path / "input.json"
    path.write_text(json.dumps(vectors["valid"][0]["input"]))
    return load_teacher_input(str(path))


def _printing(data: bytes, *, delay: float = 0.0) -> HelperChild:
    code = f"import sys, time; time.sleep({delay}); sys.stdout.buffer.write({data!r})"
    return HelperChild([sys.executable, "-c", code], ENV, what="test child")


def test_helper_child_lines_and_bounds() -> None:
    child = _printing(b'{"a":1}\n{"b":2}\n')
    try:
        assert child.read_line(time.monotonic() + 60) == b'{"a":1}\n'
        assert child.finish(time.monotonic() + 60) == b'{"b":2}\n'
    finally:
        child.close()
    failing = HelperChild([sys.executable, "-c", "raise SystemExit(3)"], ENV, what="test child")
    with pytest.raises(LauncherError, match="exit status 3"):
        failing.finish(time.monotonic() + 60)
    failing.close()
    noisy = HelperChild([sys.executable, "-c", "print('x' * 200000)"], ENV, what="noisy child")
    with pytest.raises(LauncherError, match="more than"):
        noisy.finish(time.monotonic() + 60)
    noisy.close()


def test_pending_recheck_agrees_disagrees_and_is_interruptible(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    want = canonical_json(teacher_input_document(inputs)) + b"\n"
    clock = PhaseClock()
    agreeing = PendingRecheck(lambda: _printing(want), inputs, clock)
    assert agreeing.wait() is True and agreeing.wait() is True
    assert "recheck" in clock.durations()

    other = PendingRecheck(lambda: _printing(want.replace(b'"', b"'", 1)), inputs, clock)
    for _ in range(2):  # the refusal is kept
        with pytest.raises(LauncherError) as caught:
            other.wait()
        assert caught.value.rule == "launcher.recheck_mismatch"

    slow = PendingRecheck(lambda: _printing(want, delay=30), inputs, clock)
    try:
        assert slow.wait(lambda: True) is False  # a signal: the child keeps running
    finally:
        slow.close()


def test_phase_clock_document_and_terminal_lines() -> None:
    lines: list[str] = []
    clock = PhaseClock(terminal_listener(lines.append, "kiln-teacher"))
    with clock.phase("stage"):
        pass
    clock.record("runtime_digest", 1.23456)
    document = clock.document()
    assert list(document["phases"]) == ["stage", "runtime_digest"]  # type: ignore[call-overload]
    assert document["phases"]["runtime_digest"] == 1.235  # type: ignore[index]
    assert lines[-1] == "kiln-teacher: runtime_digest 1.23 s\n"
