"""Fixtures for the teacher-endpoint tests: reference teachers, a registry with the alias.

The reference teacher is the session's tiny model (max_top_k 8, max_model_len 64) under
uvicorn on 127.0.0.1 (``tests.api.conftest``); the registry is ``create_app`` in a thread
on a fresh database (``tests.api.support.run_registry``).  All loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import reference as reference  # shared session fixtures
from tests.api.conftest import teacher_url as teacher_url
from tests.api.conftest import tls_files as tls_files
from tests.api.support import RegistryServer, remote, run_registry, write_config

ALIAS = "tiny@vllm"


@pytest.fixture
def registry(tmp_path: Path, tiny_model: TinyModel) -> Iterator[RegistryServer]:
    """A fresh registry (new database) for the tiny student, no credentials."""
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as server:
        yield server


def register(registry: RegistryServer, alias: str, urls: list[str]) -> dict[str, object]:
    """Register ``urls`` (one URL, or a replica set) under ``alias``; the entry."""
    body = remote(alias, urls[0])
    if len(urls) > 1:
        del body["url"]
        body["urls"] = urls
    with registry.client() as http:
        created = http.post("/v1/teachers", json=body)
    assert created.status_code == 200, created.text
    entry: dict[str, object] = created.json()
    return entry
