"""Resolving a registration's URL and credential id into an endpoint and handle.

The rule: with a ``credential_id`` the teacher URL's canonical origin must
equal that credential's configured origin exactly, and the credential's
variable must be usable now; without one, the URL must be an exact loopback
URL and the registry server itself must be bound to a host Kiln counts as
loopback (``127.0.0.1``, ``localhost``, ``::1``).  The result
carries a ``SecretHandle`` (a variable name), never a secret value.

Imports: standard library, ``kiln_registry.domain`` (errors, text) and the sibling
credential modules; never ``kiln_registry.config.settings`` (credentials are passed
in as anything with ``origin`` and ``api_key_env``), httpx, the database or
FastAPI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kiln_registry.credentials.origin import (
    TeacherEndpoint,
    kiln_loopback_bind_host,
    parse_teacher_url,
)
from kiln_registry.credentials.secrets import SecretHandle
from kiln_registry.domain.errors import CredentialError, RegistrationInvalid
from kiln_registry.domain.text import shown


class CredentialSpec(Protocol):
    """What resolution needs from a configured credential (``config.CredentialConfig``)."""

    @property
    def origin(self) -> str: ...

    @property
    def api_key_env(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ResolvedTeacher:
    """A parsed endpoint and, for an authenticated teacher, its secret handle."""

    endpoint: TeacherEndpoint
    secret: SecretHandle | None


def _credential_handle(
    endpoint: TeacherEndpoint,
    credential_id: str,
    credentials: Mapping[str, CredentialSpec],
    environ: Mapping[str, str] | None,
) -> SecretHandle:
    spec = credentials.get(credential_id)
    if spec is None:
        known = ", ".join(sorted(credentials)) or "none"
        raise CredentialError(
            f"unknown credential id {shown(credential_id)} (configured: {known})",
            rule="credential.unknown",
            hint="add [teachers.credentials.<id>] to kiln.toml or use a configured id",
        )
    if endpoint.origin != spec.origin:
        raise CredentialError(
            f"credential {credential_id!r} is for origin {spec.origin} "
            f"but the URL's origin is {endpoint.origin}",
            rule="credential.origin_mismatch",
            hint="register the teacher at the credential's exact origin",
        )
    handle = SecretHandle(credential_id=credential_id, env_name=spec.api_key_env)
    handle.check(environ)
    return handle


def _check_credential_free(endpoint: TeacherEndpoint, server_host: str) -> None:
    if not endpoint.is_loopback:
        raise RegistrationInvalid(
            "a credential-free teacher must use a loopback URL "
            f"(localhost or 127.0.0.0/8, as in Kiln), not host {endpoint.host!r}",
            rule="credential.loopback_url_required",
            hint="configure [teachers.credentials.<id>] and pass credential_id for this teacher",
        )
    if not kiln_loopback_bind_host(server_host):
        raise RegistrationInvalid(
            f"the server is bound to {server_host}; credential-free teachers need a server"
            " bound to 127.0.0.1, localhost or ::1 (the hosts Kiln counts as loopback)",
            rule="credential.loopback_server_required",
            hint="bind [server] host to 127.0.0.1, localhost or ::1, or register with a"
            " credential_id",
        )


def resolve_teacher_endpoint(
    url: str,
    credential_id: str | None,
    *,
    credentials: Mapping[str, CredentialSpec],
    server_host: str,
    environ: Mapping[str, str] | None = None,
) -> ResolvedTeacher:
    """Parse ``url`` and apply the credential-origin rules.

    Raises ``RegistrationInvalid`` for a bad URL or a credential-free teacher
    that is not loopback-only, and ``CredentialError`` for an unknown id, an
    origin mismatch or an unusable secret variable (checked in ``environ``,
    default ``os.environ``; the value is not kept).
    """
    endpoint = parse_teacher_url(url)
    if credential_id is None:
        _check_credential_free(endpoint, server_host)
        return ResolvedTeacher(endpoint=endpoint, secret=None)
    handle = _credential_handle(endpoint, credential_id, credentials, environ)
    return ResolvedTeacher(endpoint=endpoint, secret=handle)
