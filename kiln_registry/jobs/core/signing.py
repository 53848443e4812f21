"""The registry's corpus-signing key: an Ed25519 key pair beside the database.

The private key lives in ``corpus-signing.key`` in the database's directory
(PKCS#8 PEM, unencrypted, mode 0600).  ``load_or_create_signer`` creates it
on the first start: a temp file opened ``O_EXCL`` with mode 0600, written,
fsynced, then published with ``link`` (atomic, and unlike ``rename`` it never
replaces a key another process just created), the temp name removed and the
directory fsynced.  An existing key file is refused when it is a symlink, not
a regular file, not owned by this user, or readable or writable by anyone
else.  The key never appears in a log, repr, error, the database or a
response: only its public half leaves this module.

The public half is published as ``{"keys": [{"key_id", "algorithm",
"public_key"}]}``: ``key_id`` is the lowercase hex SHA-256 of the 32 raw
public-key bytes, ``algorithm`` is ``"ed25519"``, ``public_key`` the raw
bytes as lowercase hex.  ``parse_keys`` reads that document back strictly
(``GET /v1/keys``, ``kiln keys show --json`` and ``--public-key FILE`` all
use it).  What is signed is ``signed_message(sha256)``: the bytes
``kiln.corpus-trailer.v1``, one NUL byte, then the 32-byte SHA-256 digest of
the corpus before its trailer (layout in ``jobs.scoring.corpus``).

Imports: standard library, ``cryptography``, ``kiln_registry.domain.errors`` and
``jobs.scoring.sources`` (strict JSON).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kiln_registry.domain.errors import ConfigError, InputError
from kiln_registry.identity.strict_read import FileProblem, Problem, loads_strict, read_regular_file

KEY_FILE_NAME: Final = "corpus-signing.key"
ALGORITHM: Final = "ed25519"
TRAILER_SCHEMA: Final = "kiln.corpus-trailer.v1"
MAX_KEY_FILE_BYTES: Final = 4096
MAX_KEYS: Final = 16
MAX_KEYS_FILE_BYTES: Final = 64 * 1024
KEY_FIELDS: Final = ("key_id", "algorithm", "public_key")
SIGNATURE_SUFFIX: Final = ".sig"  # a detached corpus signature: <corpus>.jsonl.sig
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def key_path(state_dir: Path) -> Path:
    """Where the signing key lives in a registry's ``[server]`` state directory."""
    return state_dir / KEY_FILE_NAME


def signature_path(corpus: Path) -> Path:
    """Where a corpus's detached signature lives (off-policy generation corpora have one)."""
    return corpus.with_name(corpus.name + SIGNATURE_SUFFIX)


def signed_message(sha256_hex: str) -> bytes:
    """The bytes an Ed25519 corpus signature covers (see the module docstring)."""
    return TRAILER_SCHEMA.encode("ascii") + b"\x00" + bytes.fromhex(sha256_hex)


@dataclass(frozen=True, slots=True)
class PublicKey:
    """One registry public key and its id."""

    key_id: str
    raw: bytes

    @classmethod
    def from_raw(cls, raw: bytes) -> PublicKey:
        return cls(key_id=hashlib.sha256(raw).hexdigest(), raw=raw)

    def document(self) -> dict[str, str]:
        return {"key_id": self.key_id, "algorithm": ALGORITHM, "public_key": self.raw.hex()}

    def verifies(self, sha256_hex: str, signature: bytes) -> bool:
        """Whether ``signature`` is this key's signature over ``signed_message(sha256_hex)``."""
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(
                signature, signed_message(sha256_hex)
            )
        except (InvalidSignature, ValueError):
            return False
        return True


class CorpusSigner:
    """Signs corpus digests with the registry's private key (never shown in ``repr``)."""

    __slots__ = ("_key", "public")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        raw = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public = PublicKey.from_raw(raw)

    def __repr__(self) -> str:
        return f"CorpusSigner(key_id={self.public.key_id!r})"

    def sign(self, sha256_hex: str) -> bytes:
        return self._key.sign(signed_message(sha256_hex))


def keys_document(keys: list[PublicKey]) -> dict[str, list[dict[str, str]]]:
    """The ``GET /v1/keys`` body for ``keys``."""
    return {"keys": [key.document() for key in keys]}


# -- the private key file ------------------------------------------------------


def _key_error(path: Path, problem: str, rule: str) -> ConfigError:
    return ConfigError(
        f"corpus signing key {path}: {problem}",
        rule=f"signing.{rule}",
        hint="fix or move the file away; the registry refuses to sign with a key others can"
        " read or replace (a new key is created when none exists)",
    )


def _check_key_stat(path: Path, info: os.stat_result) -> None:
    if info.st_uid != os.geteuid():
        raise _key_error(path, "is owned by another user", "owner")
    if info.st_mode & 0o077:
        mode = oct(stat.S_IMODE(info.st_mode))
        raise _key_error(path, f"has mode {mode}; it must be 0600", "mode")


def _read_key_file(path: Path) -> bytes:
    def refuse(problem: FileProblem) -> ConfigError:
        if problem.kind is Problem.SYMLINK:
            return _key_error(path, "is a symbolic link", "symlink")
        if problem.kind is Problem.NOT_REGULAR:
            return _key_error(path, "is not a regular file", "file")
        if problem.kind in (Problem.TOO_LARGE, Problem.GREW):
            return _key_error(path, "is too large to be a key", "format")
        return _key_error(path, f"cannot be opened ({problem.detail})", "open")

    data, _ = read_regular_file(
        path,
        limit=MAX_KEY_FILE_BYTES,
        refuse=refuse,
        check=lambda info: _check_key_stat(path, info),
    )
    return data


def load_signer(path: Path) -> CorpusSigner:
    """The signer for the existing key file at ``path`` (refusals: see the module docstring)."""
    if not os.path.lexists(path):
        raise _key_error(path, "does not exist", "missing")
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise _key_error(path, "is not an unencrypted PKCS#8 PEM private key", "format") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise _key_error(path, "is not an Ed25519 key", "format")
    return CorpusSigner(key)


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_key_file(path: Path) -> None:
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(pem)
            handle.flush()
            os.fsync(handle.fileno())
        # When another start created it first, that key is the registry's key.
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def load_or_create_signer(path: Path) -> CorpusSigner:
    """The registry's signer, creating the key file at ``path`` on the first start."""
    if not os.path.lexists(path):
        try:
            _create_key_file(path)
        except OSError as exc:
            raise _key_error(path, f"cannot be created ({exc.strerror})", "create") from None
    return load_signer(path)


# -- reading published public keys ---------------------------------------------


def _keys_error(where: str, problem: str) -> InputError:
    return InputError(
        f"{where}: {problem}",
        rule="signing.keys_document",
        hint='expected the GET /v1/keys document: {"keys":[{"key_id":...,"algorithm":'
        '"ed25519","public_key":<64 hex>}]}',
    )


def _parse_key(value: object, where: str) -> PublicKey:
    if not isinstance(value, dict) or sorted(value) != sorted(KEY_FIELDS):
        raise _keys_error(where, f"a key must have exactly the fields {', '.join(KEY_FIELDS)}")
    if value["algorithm"] != ALGORITHM:
        raise _keys_error(where, f"algorithm must be {ALGORITHM!r}")
    for name in ("key_id", "public_key"):
        if not isinstance(value[name], str) or not _HEX64.fullmatch(value[name]):
            raise _keys_error(where, f"{name} must be 64 lowercase hex digits")
    key = PublicKey.from_raw(bytes.fromhex(value["public_key"]))
    if key.key_id != value["key_id"]:
        raise _keys_error(where, "key_id is not the SHA-256 of public_key")
    try:
        Ed25519PublicKey.from_public_bytes(key.raw)
    except ValueError:
        raise _keys_error(where, "public_key is not an Ed25519 public key") from None
    return key


def parse_keys(value: object, where: str) -> dict[str, PublicKey]:
    """The keys of a ``GET /v1/keys`` document, by key id (strict)."""
    if not isinstance(value, dict) or list(value) != ["keys"]:
        raise _keys_error(where, 'the document must be an object with exactly the field "keys"')
    items = value["keys"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_KEYS:
        raise _keys_error(where, f"keys must be a list of 1..={MAX_KEYS} keys")
    keys = [_parse_key(item, f"{where} keys[{i}]") for i, item in enumerate(items)]
    return {key.key_id: key for key in keys}


def read_keys_file(path: Path) -> dict[str, PublicKey]:
    """The keys of a saved ``GET /v1/keys`` document (``kiln keys show --json`` output)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_KEYS_FILE_BYTES + 1)
    except OSError as exc:
        raise _keys_error(str(path), f"cannot be read ({exc.strerror})") from None
    if len(data) > MAX_KEYS_FILE_BYTES:
        raise _keys_error(str(path), f"is larger than {MAX_KEYS_FILE_BYTES} bytes")
    try:
        value = loads_strict(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _keys_error(str(path), f"is not strict JSON ({exc})") from None
    return parse_keys(value, str(path))
