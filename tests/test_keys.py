"""``GET /v1/keys`` and ``kiln keys show``: the registry's corpus-signing public key.

A real registry (lifespan on, so the job workers create the key at start) on
loopback over a migrated SQLite file in ``tmp_path``.
"""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from kiln_registry.api.app import create_app
from kiln_registry.cli.main import run
from kiln_registry.jobs.core.signing import KEY_FILE_NAME, key_path, keys_document, load_signer
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.harness import make_config, running_registry


def _toml(tmp_path: Path, student: Path) -> Path:
    path = tmp_path / "kiln.toml"
    path.write_text(
        f'[server]\ndatabase = "{tmp_path / "db" / "registry.db"}"\n'
        f'[student]\nmodel_path = "{student}"\n'
        f'[jobs]\ncorpus_root = "{tmp_path / "corpora"}"\nresult_root = "{tmp_path / "results"}"\n',
        encoding="utf-8",
    )
    return path


def _secret_forms(path: Path) -> list[bytes]:
    """The private key as raw bytes, hex and base64 (the PEM body)."""
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    body = b"".join(path.read_bytes().splitlines()[1:-1])
    return [raw, raw.hex().encode(), base64.b64encode(raw), body]


def test_the_registry_creates_its_key_at_start_and_serves_the_public_half(
    tmp_path: Path, tiny_model: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path, tiny_model.path)
    database = tmp_path / "db" / "registry.db"
    with running_registry(config) as reg:
        path = database.parent / KEY_FILE_NAME
        assert key_path(database.parent) == path and stat.S_IMODE(path.stat().st_mode) == 0o600
        response = reg.http.get("/v1/keys")
        assert response.status_code == 200
        served = response.json()
        assert served == keys_document([load_signer(path).public])
        assert run(["keys", "show", "--server", reg.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == served
    toml = _toml(tmp_path, tiny_model.path)
    assert run(["keys", "show", "--config", str(toml), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == served
    assert run(["keys", "show", "--config", str(toml)]) == 0
    text = capsys.readouterr().out
    assert served["keys"][0]["key_id"] in text and served["keys"][0]["public_key"] in text
    # A restart keeps the key; the private half is in no database file.
    with running_registry(config) as reg:
        assert reg.http.get("/v1/keys").json() == served
    stored = b"".join(p.read_bytes() for p in database.parent.glob("registry.db*"))
    assert stored and not [form for form in _secret_forms(path) if form in stored]


def test_keys_show_refusals(
    tmp_path: Path, tiny_model: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "db").mkdir()
    toml = _toml(tmp_path, tiny_model.path)
    assert run(["keys", "show", "--config", str(toml)]) == 2
    assert "signing.missing" in capsys.readouterr().err
    assert not (tmp_path / "db" / KEY_FILE_NAME).exists()  # showing never creates a key
    assert run(["keys", "show", "--config", str(toml), "--server", "http://127.0.0.1:9"]) == 2
    assert "either --config or --server" in capsys.readouterr().err
    assert run(["keys", "show", "--server", "http://127.0.0.1:9"]) == 2
    assert "client.connect" in capsys.readouterr().err


def test_the_keys_route_is_in_the_openapi_document() -> None:
    schema = create_app(None).openapi()
    operation = schema["paths"]["/v1/keys"]["get"]
    assert operation["operationId"] == "getSigningKeys"
    ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    model = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert list(model["properties"]) == ["keys"]
    key = schema["components"]["schemas"]["SigningKey"]
    assert set(key["properties"]) == {"key_id", "algorithm", "public_key"}
    assert all(prop.get("description") for prop in key["properties"].values())
