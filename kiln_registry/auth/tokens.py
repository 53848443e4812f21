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
secret.  Whether text has a token's shape is ``credentials.redaction.well_formed``
(the client checks it too).  Imports the standard library, ``domain.errors`` and
the token shape and its redaction from ``credentials.redaction``.
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
SCOPES: Final = ("read", "register", "jobs", "admin")
MAX_NAME_CHARS: Final = 64
MAX_EXPIRES_DAYS: Final = 3650
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


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
