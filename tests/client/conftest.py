"""A live registry (job workers on) with the reference teacher registered, for the client tests.

The registry is ``tests.jobs.harness.running_registry`` (uvicorn on a free
loopback port, real SQLite in a temporary directory); the teacher is the
eager reference teacher on the session's tiny model.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.conftest import reference_teacher as reference_teacher  # shared fixtures
from tests.jobs.conftest import student_vocab_sha256 as student_vocab_sha256
from tests.jobs.harness import Registry, make_config, running_registry

ALIAS = "ref@tiny"


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model: TinyModel,
    reference_teacher: ReferenceTeacher,
) -> Iterator[Registry]:
    config = make_config(tmp_path_factory.mktemp("registry"), tiny_model.path)
    with running_registry(config) as reg:
        reg.register(ALIAS, reference_teacher.url, REFERENCE_MODEL_ID)
        yield reg
