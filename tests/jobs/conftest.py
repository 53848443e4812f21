"""Fixtures for the job-queue tests: the reference teacher, the student's vocabulary, and
the chat model with its teacher (module scope) for the generation tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import serve_app

if TYPE_CHECKING:
    from tests.jobs.generation_harness import ChatTeacher

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


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Path:
    """The tiny model with a chat template (generation jobs render prompts with it)."""
    from tests.jobs.generation_harness import add_chat_template

    return add_chat_template(tiny_model.path, tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def teacher(chat_model: Path) -> Iterator[ChatTeacher]:
    """The reference teacher serving ``chat_model``."""
    from tests.jobs.generation_harness import chat_teacher

    with chat_teacher(chat_model) as served:
        yield served
