"""Fixtures: a fake vLLM on a short-path Unix socket, and gateways in front of it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.support import (
    FakeUpstream,
    RunningGateway,
    config_for,
    fake_upstream,
    running_gateway,
)

GatewayFactory = Callable[..., AbstractContextManager[RunningGateway]]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A private directory with a short path (a Unix socket path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="kgw-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def upstream(socket_dir: Path) -> Iterator[FakeUpstream]:
    with fake_upstream(socket_dir) as app:
        yield app


@pytest.fixture
def gateway(upstream: FakeUpstream) -> Iterator[RunningGateway]:
    with running_gateway(config_for(upstream.path)) as running:
        yield running


@pytest.fixture
def make_gateway(upstream: FakeUpstream) -> GatewayFactory:
    def factory(**overrides: Any) -> AbstractContextManager[RunningGateway]:
        return running_gateway(config_for(upstream.path, **overrides))

    return factory
