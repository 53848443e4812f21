"""Secret handles: the only way kiln-registry reaches a teacher's API key.

A ``SecretHandle`` holds a credential id and the *name* of an environment
variable, never a value.  ``read()`` fetches the value at call time, right
before an outbound request, and fails closed (``CredentialError``) when the
variable is missing, not valid Unicode (``os.environ`` keeps undecodable
bytes as lone surrogates), blank, or not sendable as an HTTP header value.
Messages, reprs and exceptions name the variable and never its value.

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kiln_registry.domain.errors import CredentialError

MAX_ENV_NAME_LENGTH = 128
MAX_SECRET_LENGTH = 8192

ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
_ENV_NAME_RE = re.compile(ENV_NAME_PATTERN)
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# Printable ASCII without leading or trailing spaces: what an Authorization
# header can carry unchanged (httpx encodes header values as ASCII, and a
# peer strips surrounding white space).
_HEADER_SAFE_RE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_HINT = "export the variable in the registry server's environment and restart it"


def is_valid_env_name(name: str) -> bool:
    """True when ``name`` is 1..128 characters of ``[A-Za-z_][A-Za-z0-9_]*``."""
    return len(name) <= MAX_ENV_NAME_LENGTH and _ENV_NAME_RE.fullmatch(name) is not None


def secret_problem(value: str | None) -> tuple[str, str] | None:
    """``(rule, description)`` of what is wrong with a secret value, or None.

    The description never contains the value.
    """
    if value is None:
        return "secret.missing", "is not set"
    if len(value) > MAX_SECRET_LENGTH:
        return "secret.too_long", f"is longer than {MAX_SECRET_LENGTH} characters"
    if _SURROGATE_RE.search(value):
        return "secret.not_unicode", "is not valid Unicode (it holds undecodable bytes)"
    if not value.strip():
        return "secret.blank", "is empty or white space only"
    if not _HEADER_SAFE_RE.fullmatch(value):
        return (
            "secret.header_unsafe",
            "cannot be sent as a bearer token (only printable ASCII, "
            "no leading or trailing white space)",
        )
    return None


def check_environment_variable(name: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse (``CredentialError``) a variable that is badly named, unset or unusable.

    Used at server start-up and again whenever a handle is resolved.
    """
    if not is_valid_env_name(name):
        # The text may be a secret pasted in by mistake: never echo it.
        raise CredentialError(
            "api_key_env is not a valid environment variable name "
            f"({ENV_NAME_PATTERN}, at most {MAX_ENV_NAME_LENGTH} characters)",
            rule="secret.env_name",
            hint="api_key_env holds the NAME of a variable, never the secret itself",
        )
    env = os.environ if environ is None else environ
    problem = secret_problem(env.get(name))
    if problem is not None:
        rule, description = problem
        raise CredentialError(f"environment variable {name} {description}", rule=rule, hint=_HINT)


@dataclass(frozen=True)
class SecretHandle:
    """A credential id and the name of the variable that holds its secret.

    There is deliberately no attribute for the value: it exists only in the
    caller's frame between ``read()`` and the request that uses it.  (Not
    ``slots=True``: on Python 3.11 a slotted frozen dataclass answers an
    assignment to an unknown attribute with a TypeError instead of
    ``FrozenInstanceError``.)
    """

    credential_id: str
    env_name: str

    def __post_init__(self) -> None:
        if not is_valid_env_name(self.env_name):
            raise CredentialError(
                f"credential {self.credential_id!r} names an invalid environment variable",
                rule="secret.env_name",
            )

    def check(self, environ: Mapping[str, str] | None = None) -> None:
        """Fail closed now if ``read()`` would fail; reads nothing into state."""
        try:
            check_environment_variable(self.env_name, environ)
        except CredentialError as exc:
            raise self._error(exc.message, exc.rule) from None

    def read(self, environ: Mapping[str, str] | None = None) -> str:
        """The secret value, read from the environment at this moment."""
        env = os.environ if environ is None else environ
        value = env.get(self.env_name)
        problem = secret_problem(value)
        if problem is None and value is not None:
            return value
        del value  # keep the bad value out of the traceback's frame locals
        rule, description = problem or ("secret.missing", "is not set")
        raise self._error(f"environment variable {self.env_name} {description}", rule)

    def _error(self, message: str, rule: str | None) -> CredentialError:
        return CredentialError(
            f"credential {self.credential_id!r}: {message}", rule=rule, hint=_HINT
        )

    def __repr__(self) -> str:
        return f"SecretHandle(credential_id={self.credential_id!r}, env_name={self.env_name!r})"

    def __str__(self) -> str:
        return f"credential {self.credential_id!r} (${self.env_name})"
