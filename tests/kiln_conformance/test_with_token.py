"""Kiln's wire shapes hold for an authorised caller: the conformance cases, with a token.

Issue 15: with ``[server] auth = "required"`` the registry's answers to a
caller holding a token are the ones the unauthenticated loopback runs check.
This module re-collects the registry-backed cases of ``test_wire_shapes``
(values from Kiln's ``crates/kiln-server`` error envelope and teacher
artifact schema, cited there) and ``test_aliases`` (Kiln's alias rules,
cited there) against a registry that requires tokens, whose ``client()``
sends an ``admin`` bearer token on every request.  Fixtures defined here
replace the modules' own ``registry`` fixture for the re-collected cases.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, run_registry, write_config
from tests.auth.support import bearer, create_token
from tests.kiln_conformance import test_aliases as aliases
from tests.kiln_conformance import test_wire_shapes as wire


class TokenRegistry(RegistryServer):
    """A registry whose test client sends ``Authorization: Bearer <admin token>``."""

    token: str = ""

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, trust_env=False,
                            headers=bearer(self.token))  # fmt: skip


def _secured(directory: Path, model: Path, **kwargs: object) -> Iterator[TokenRegistry]:
    config = write_config(directory, student=model, server={"auth": "required"}, **kwargs)  # type: ignore[arg-type]
    token = create_token(directory / "registry.db", "conformance", {"admin"})
    with run_registry(config) as server:
        secured = TokenRegistry(ctx=server.ctx, url=server.url)
        secured.token = token
        with httpx.Client(base_url=server.url, trust_env=False) as anonymous:
            assert anonymous.get("/v1/teachers").status_code == 401  # really secured
        yield secured


@pytest.fixture(scope="module")
def registry(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[RegistryServer]:
    directory = tmp_path_factory.mktemp("wire-token")
    credentials = {"primary": (wire.ORIGIN, wire.KEY_ENV)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(wire.KEY_ENV, "sk-wire-test-not-a-real-key")
        yield from _secured(directory, tiny_model.path, credentials=credentials)


@pytest.fixture(autouse=True)
def _token_in_environment(registry: RegistryServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python client and the CLI (cases that use them) read ``KILN_TOKEN``."""
    assert isinstance(registry, TokenRegistry)
    monkeypatch.setenv("KILN_TOKEN", registry.token)


teacher_url = wire.teacher_url
openapi = wire.openapi
hf_alias = aliases.hf_alias

# Re-collect every case of both modules that talks to the registry fixture.
for _module, _prefix in ((wire, "wire"), (aliases, "aliases")):
    for _name, _case in inspect.getmembers(_module, inspect.isfunction):
        params = inspect.signature(_case).parameters
        if _name.startswith("test_") and ({"registry", "openapi"} & set(params)):
            globals()[f"test_{_prefix}_{_name[5:]}"] = _case
