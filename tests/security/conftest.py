"""Fixtures for the security suite (issue 15): a counting loopback teacher and a registry.

``CountingTeacher`` is a real ASGI app under uvicorn that answers every
request with a fixed status and body and counts what it was sent, so a test
can show that a refusal happened before any probe reached a teacher.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, run_registry, write_config
from tests.helpers import serve_app


@dataclass
class CountingTeacher:
    status: int = 500
    body: bytes = b'{"detail": "not a vllm error"}'
    requests: list[str] = field(default_factory=list)
    url: str = ""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.requests.append(scope["path"])
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


@pytest.fixture
def counting_teacher() -> Iterator[CountingTeacher]:
    teacher = CountingTeacher()
    with serve_app(teacher) as url:
        teacher.url = url
        yield teacher


@pytest.fixture
def registry(tmp_path: Path, tiny_model: TinyModel) -> Iterator[RegistryServer]:
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as server:
        yield server
