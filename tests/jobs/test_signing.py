"""The corpus-signing key file: created once, private, refused when unsafe; the keys document."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from kiln_registry.domain.errors import ConfigError, InputError
from kiln_registry.jobs.core.signing import (
    KEY_FILE_NAME,
    CorpusSigner,
    PublicKey,
    key_path,
    keys_document,
    load_or_create_signer,
    load_signer,
    parse_keys,
    read_keys_file,
)


def _path(tmp_path: Path) -> Path:
    return key_path(tmp_path)


def _private_raw(signer: CorpusSigner, path: Path) -> bytes:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def test_the_first_start_creates_a_private_key_file_and_later_starts_reuse_it(
    tmp_path: Path,
) -> None:
    path = _path(tmp_path)
    assert path == tmp_path / KEY_FILE_NAME
    first = load_or_create_signer(path)
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE_NAME]  # no temp file left
    again = load_or_create_signer(path)
    assert again.public == first.public == load_signer(path).public
    assert first.public.key_id == PublicKey.from_raw(first.public.raw).key_id
    assert len(first.public.raw) == 32 and len(first.public.key_id) == 64


def test_the_signer_never_shows_its_private_key(tmp_path: Path) -> None:
    path = _path(tmp_path)
    signer = load_or_create_signer(path)
    secret = _private_raw(signer, path)
    shown = repr(signer) + json.dumps(keys_document([signer.public]))
    assert signer.public.key_id in shown
    assert secret.hex() not in shown and path.read_text().splitlines()[1] not in shown


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = _path(tmp_path)
    load_or_create_signer(path)
    for mode in (0o640, 0o604, 0o620):
        path.chmod(mode)
        with pytest.raises(ConfigError) as caught:
            load_or_create_signer(path)
        assert caught.value.rule == "signing.mode" and oct(mode) in caught.value.message
    path.chmod(0o600)
    load_signer(path)


def test_a_symlinked_key_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.key"
    load_or_create_signer(real)
    os.symlink(real, _path(tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_or_create_signer(_path(tmp_path))
    assert caught.value.rule == "signing.symlink"
    os.unlink(_path(tmp_path))
    os.symlink(tmp_path / "missing", _path(tmp_path))  # dangling: never created through
    with pytest.raises(ConfigError) as caught:
        load_or_create_signer(_path(tmp_path))
    assert caught.value.rule == "signing.symlink" and not (tmp_path / "missing").exists()


def test_other_unusable_key_files_are_refused(tmp_path: Path) -> None:
    path = _path(tmp_path)
    path.mkdir()
    with pytest.raises(ConfigError) as caught:
        load_or_create_signer(path)
    assert caught.value.rule in ("signing.file", "signing.open")
    path.rmdir()
    os.mkfifo(path, 0o600)  # opened without blocking, then refused
    with pytest.raises(ConfigError) as caught:
        load_or_create_signer(path)
    assert caught.value.rule == "signing.file"
    path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"not a key")
    os.close(fd)
    with pytest.raises(ConfigError) as caught:
        load_or_create_signer(path)
    assert caught.value.rule == "signing.format"
    path.unlink()
    with pytest.raises(ConfigError) as caught:
        load_signer(path)  # reading never creates
    assert caught.value.rule == "signing.missing" and not path.exists()
    with pytest.raises(ConfigError) as caught:
        load_or_create_signer(tmp_path / "no-such-dir" / KEY_FILE_NAME)
    assert caught.value.rule == "signing.create"


def test_the_keys_document_round_trips_and_is_read_strictly(tmp_path: Path) -> None:
    signer = load_or_create_signer(_path(tmp_path))
    doc = keys_document([signer.public])
    assert doc == {"keys": [{"key_id": signer.public.key_id, "algorithm": "ed25519",
                             "public_key": signer.public.raw.hex()}]}  # fmt: skip
    assert parse_keys(doc, "doc") == {signer.public.key_id: signer.public}
    saved = tmp_path / "keys.json"
    saved.write_text(json.dumps(doc))
    assert read_keys_file(saved) == {signer.public.key_id: signer.public}
    entry = doc["keys"][0]
    bad: list[object] = [
        [],
        {"keys": []},
        {"keys": [entry], "extra": 1},
        {"keys": [{**entry, "algorithm": "rsa"}]},
        {"keys": [{**entry, "key_id": "0" * 64}]},
        {"keys": [{**entry, "public_key": entry["public_key"].upper()}]},
        {"keys": [{**entry, "comment": "x"}]},
        {"keys": [{k: v for k, v in entry.items() if k != "key_id"}]},
    ]
    for value in bad:
        with pytest.raises(InputError) as caught:
            parse_keys(value, "doc")
        assert caught.value.rule == "signing.keys_document"
    saved.write_text('{"keys": [], "keys": []}')
    with pytest.raises(InputError):
        read_keys_file(saved)
    with pytest.raises(InputError):
        read_keys_file(tmp_path / "absent.json")
