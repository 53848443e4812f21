"""API tokens: generation, digests, scopes and the caller identity.

A token is ``kiln_`` followed by ``secrets.token_urlsafe(32)`` (256 bits of
randomness, URL-safe base64).  Only ``token_digest`` (SHA-256 of the whole
token, hex) is ever stored; the raw token exists once, in the output of
``kiln tokens create``.  Lookups compare digests with ``hmac.compare_digest``.

Scopes: ``read`` (GET routes, receipts, job status), ``register`` (register,
delete, probe and launch teachers), ``jobs`` (submit, cancel, fetch results)
and ``admin`` (everything, including the audit log and alias release).

``TokenIdentity`` is the caller an authenticated request carries in its ASGI
scope (``scope["state"]["kiln_token"]``); its repr names the token, never the
secret.  Imports the standard library, ``domain.errors`` and the token shape
and its redaction from ``credentials.redaction``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Final

from kiln_registry.credentials.redaction import TOKEN_PATTERN as TOKEN_PATTERN
from kiln_registry.credentials.redaction import TOKEN_PREFIX as TOKEN_PREFIX
from kiln_registry.credentials.redaction import redact_tokens as redact_tokens
from kiln_registry.domain.errors import InputError

TOKEN_RANDOM_BYTES: Final = 32
MAX_TOKEN_CHARS: Final = 256
SCOPES: Final = ("read", "register", "jobs", "admin")
MAX_NAME_CHARS: Final = 64
MAX_EXPIRES_DAYS: Final = 3650
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TOKEN: Final = re.compile(r"^kiln_[A-Za-z0-9_-]{43,251}$")
_URL_SAFE: Final = re.compile(r"[A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class TokenIdentity:
    """The authenticated caller: the token's name and scopes (never the token)."""

    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


def generate_token() -> str:
    """A fresh token: ``kiln_`` + 256 random bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_RANDOM_BYTES)


def well_formed(token: str) -> bool:
    """True for text shaped like a token (prefix, alphabet, length); says nothing of validity."""
    return len(token) <= MAX_TOKEN_CHARS and _TOKEN.fullmatch(token) is not None


def token_problem(token: str) -> str | None:
    """What makes ``token`` malformed (prefix, length, alphabet), never quoting it; None if fine."""
    if token[:1] in ("'", '"') or token.lower().startswith("bearer"):
        return "it carries quotes or a 'Bearer' word: give the token alone"
    if not token.startswith(TOKEN_PREFIX):
        return f"it does not start with {TOKEN_PREFIX!r}"
    body = token[len(TOKEN_PREFIX) :]
    bad = next((i for i, ch in enumerate(body) if not _URL_SAFE.fullmatch(ch)), None)
    if bad is not None:
        return (
            f"character {bad + len(TOKEN_PREFIX) + 1} is not URL-safe base64 (A-Z a-z 0-9 - _):"
            " was it cut, wrapped or pasted with white space?"
        )
    if not 43 <= len(body) <= MAX_TOKEN_CHARS - len(TOKEN_PREFIX):
        return (
            f"it is {len(token)} characters long; a token is {TOKEN_PREFIX!r} plus 43 to"
            f" {MAX_TOKEN_CHARS - len(TOKEN_PREFIX)} characters (was it cut short?)"
        )
    return None if well_formed(token) else "it is not shaped like a kiln token"


def token_digest(token: str) -> str:
    """SHA-256 of the whole token, lower-case hex (what the tokens table stores)."""
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def check_name(name: str) -> str:
    """A token name: 1-64 of letters, digits, ``.``, ``_``, ``-`` (starting alphanumeric)."""
    if _NAME.fullmatch(name) is None:
        raise InputError(
            "token name must be 1-64 letters, digits, '.', '_' or '-', starting with a"
            " letter or digit",
            rule="tokens.name",
        )
    return name


def check_scopes(scopes: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The scopes as a set; an empty list or an unknown scope is refused."""
    if not scopes:
        raise InputError("give at least one --scope", rule="tokens.scope")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise InputError(
            f"unknown scope(s) {', '.join(repr(s[:32]) for s in unknown[:4])};"
            f" use {', '.join(SCOPES)}",
            rule="tokens.scope",
        )
    return frozenset(scopes)
