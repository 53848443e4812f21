"""Fixtures for the registry API tests: reference teachers (plain and TLS) and a registry.

The reference teacher runs the session's ``tiny_model`` (max_top_k 8,
max_model_len 64) under uvicorn on 127.0.0.1; the TLS one serves the same
model with a trustme certificate for ``localhost`` and requires the bearer
key in ``KEY_ENV`` (tests set it with monkeypatch and mark ``secret_env``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, run_registry, serve_tls, write_config
from tests.helpers import serve_app

KEY_ENV = "KILN_API_TEST_TEACHER_KEY"
SECRET = "sk-kiln-planted-7Qf3xZ9-do-not-echo"
SERVED = "teacher-tiny"


@dataclass(frozen=True)
class TlsFiles:
    ca_pem: Path
    cert_pem: Path


@dataclass(frozen=True)
class TlsTeacher:
    port: int
    origin: str
    url: str


@pytest.fixture(scope="session")
def reference(tiny_model: TinyModel) -> tuple[ReferenceTeacher, TeacherIdentity]:
    return load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=8, max_model_len=64
    )


@pytest.fixture(scope="session")
def teacher_url(reference: tuple[ReferenceTeacher, TeacherIdentity]) -> Iterator[str]:
    """A credential-free reference teacher on http://127.0.0.1."""
    with serve_app(create_reference_app(reference[0], api_key_env=None)) as url:
        yield url


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    ca = trustme.CA()
    directory = tmp_path_factory.mktemp("tls")
    ca_pem, cert_pem = directory / "ca.pem", directory / "server.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(cert_pem)
    )
    return TlsFiles(ca_pem=ca_pem, cert_pem=cert_pem)


@pytest.fixture(scope="session")
def tls_teacher(
    reference: tuple[ReferenceTeacher, TeacherIdentity], tls_files: TlsFiles
) -> Iterator[TlsTeacher]:
    """The reference teacher over HTTPS, guarded by the bearer key in ``KEY_ENV``."""
    app = create_reference_app(reference[0], api_key_env=KEY_ENV)
    with serve_tls(app, tls_files.cert_pem) as port:
        origin = f"https://localhost:{port}"
        yield TlsTeacher(port=port, origin=origin, url=origin + "/v1")


@pytest.fixture
def registry(tmp_path: Path, tiny_model: TinyModel) -> Iterator[RegistryServer]:
    """A fresh registry (new database) for the tiny student, no credentials."""
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as server:
        yield server
