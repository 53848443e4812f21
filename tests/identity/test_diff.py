"""identity.diff: the differing identity fields, their cause and the way out (issue 18 item 8)."""

from __future__ import annotations

import dataclasses

from kiln_registry.identity.diff import differing_fields, mismatch_detail
from tests.jobs.harness import student_identity

VOCAB = "ab" * 32


def test_names_each_differing_field_in_document_order() -> None:
    pinned = student_identity(VOCAB)
    changed = dataclasses.replace(pinned, max_top_k=4, implementation="vllm:0.33.0")
    assert differing_fields(pinned, changed) == ["max_top_k", "implementation"]
    detail = mismatch_detail(pinned, changed)
    assert detail.startswith("identity fields that differ: max_top_k, implementation (")
    assert "vLLM version or its inference options changed" in detail
    assert "launch bounds" in detail and "register the new identity under a new alias" in detail


def test_a_different_model_is_named_as_such() -> None:
    pinned = student_identity(VOCAB)
    other = dataclasses.replace(pinned, base_model_sha256="cd" * 32)
    assert "a different model or adapter is served" in mismatch_detail(pinned, other)
    assert differing_fields(pinned, pinned) == []
