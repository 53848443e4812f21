"""Fixtures for the job-queue tests: the reference teacher and the student's vocabulary."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import serve_app

REFERENCE_MODEL_ID = "tiny-ref"


@dataclass(frozen=True)
class ReferenceTeacher:
    url: str
    identity: TeacherIdentity


@pytest.fixture(scope="session")
def reference_teacher(tiny_model: TinyModel) -> Iterator[ReferenceTeacher]:
    """The eager Transformers reference teacher on the tiny model (K <= 8, 64 tokens)."""
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    teacher, identity = load_reference_teacher(
        tiny_model.path, served_model_id=REFERENCE_MODEL_ID, max_top_k=8, max_model_len=64
    )
    with serve_app(create_reference_app(teacher, api_key_env=None)) as url:
        yield ReferenceTeacher(url=url, identity=identity)


@pytest.fixture(scope="session")
def student_vocab_sha256(tiny_model: TinyModel) -> str:
    return student_vocab(tiny_model.path)[0]
