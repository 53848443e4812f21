"""Tokens: their shape, digest-only storage, and ``kiln tokens create|list|revoke``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_registry.auth.tokens import (
    TokenIdentity,
    check_scopes,
    generate_token,
    redact_tokens,
    token_digest,
)
from kiln_registry.credentials.redaction import well_formed
from kiln_registry.domain.errors import InputError
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO, write_config
from tests.backend import fetch, is_postgres, rows_text


def kiln(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_token_is_kiln_plus_256_random_bits_url_safe() -> None:
    tokens = {generate_token() for _ in range(64)}
    assert len(tokens) == 64
    for token in tokens:
        assert token.startswith("kiln_") and len(token) >= 5 + 43
        assert well_formed(token)
        assert all(c.isalnum() or c in "-_" for c in token[5:])
    digest = token_digest("kiln_" + "a" * 43)
    assert len(digest) == 64 and digest == token_digest("kiln_" + "a" * 43)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "kiln_",
        "kiln_short",
        "KILN_" + "a" * 43,
        "kiln_" + "a" * 43 + "!",
        "kiln_" + "a" * 300,
        "Bearer kiln_" + "a" * 43,
    ],
)
def test_malformed_tokens_are_not_well_formed(text: str) -> None:
    assert not well_formed(text)


def test_identity_repr_and_redaction_never_show_a_token() -> None:
    token = generate_token()
    identity = TokenIdentity(name="ci", scopes=frozenset({"read"}))
    assert token not in repr(identity) and identity.allows("read") and not identity.allows("jobs")
    assert TokenIdentity(name="a", scopes=frozenset({"admin"})).allows("jobs")
    assert redact_tokens(f"GET /v1/teachers?access_token={token} 200") == (
        "GET /v1/teachers?access_token=kiln_[redacted] 200"
    )


def test_unknown_or_missing_scopes_are_refused() -> None:
    with pytest.raises(InputError, match="unknown scope"):
        check_scopes(["read", "root"])
    with pytest.raises(InputError, match="at least one"):
        check_scopes([])


def test_cli_create_list_revoke_stores_only_a_digest(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    made = kiln("tokens", "create", "--config", str(config), "--name", "ci",
                "--scope", "read", "--scope", "jobs", "--expires-in", "30")  # fmt: skip
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert well_formed(token) and token not in made.stderr
    again = kiln("tokens", "create", "--config", str(config), "--name", "ci", "--scope", "read")
    assert again.returncode == 2 and "exists" in again.stderr
    listed = kiln("tokens", "list", "--config", str(config), "--json")
    assert listed.returncode == 0 and token not in listed.stdout
    [row] = json.loads(listed.stdout)["tokens"]
    assert row["name"] == "ci" and row["scopes"] == ["jobs", "read"] and row["expires_at"]
    assert row["last_used_at"] is None
    database = tmp_path / "registry.db"
    stored = fetch(database, "SELECT digest FROM api_tokens")
    audit = fetch(database, "SELECT action, target, token_name FROM audit_events")
    assert stored == [(token_digest(token),)]
    assert token not in rows_text(database)
    if not is_postgres():  # and nowhere in the SQLite file's bytes
        assert database.read_bytes().find(token.encode()) == -1
    revoked = kiln("tokens", "revoke", "--config", str(config), "ci")
    assert revoked.returncode == 0, revoked.stderr
    missing = kiln("tokens", "revoke", "--config", str(config), "ci")
    assert missing.returncode == 2 and "no token named" in missing.stderr
    assert audit == [("token.create", "ci", None)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--name", "bad name", "--scope", "read"], "token name"),
        (["--name", "x", "--scope", "root"], "invalid choice"),
        (["--name", "x"], "--scope"),
        (["--name", "x", "--scope", "read", "--expires-in", "0"], "days"),
        (["--name", "x", "--scope", "read", "--token", "kiln_abc"], "unrecognized"),
    ],
)
def test_cli_create_refuses_bad_input(
    tmp_path: Path, tiny_model: TinyModel, argv: list[str], message: str
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    result = kiln("tokens", "create", "--config", str(config), *argv)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "kiln_" not in result.stdout


def test_a_second_token_of_one_name_is_refused_and_the_first_kept(tmp_path: Path) -> None:
    from kiln_registry.auth.repository import TokenNameExists
    from tests.auth.support import create_token

    database = tmp_path / "registry.db"
    first = create_token(database, "ci", {"read"})
    with pytest.raises(TokenNameExists) as refused:
        create_token(database, "ci", {"admin"})
    assert refused.value.code == "token_exists" and "ci" in refused.value.message
    rows = fetch(database, "SELECT scopes, digest FROM api_tokens WHERE name = 'ci'")
    assert rows == [("read", token_digest(first))]
