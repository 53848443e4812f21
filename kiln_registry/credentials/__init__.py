"""Credentials for off-host teachers: canonical origins, secret handles, redaction.

The TOML names an origin and an environment variable; this package checks
the origin's canonical form, binds a teacher URL to it, and reads the secret
only through a ``SecretHandle`` immediately before a request.  Nothing here
imports httpx, the database, FastAPI or ``kiln_registry.config.settings``.
"""

from kiln_registry.credentials.origin import (
    TeacherEndpoint,
    canonical_origin,
    is_loopback_host,
    kiln_loopback_host,
    parse_teacher_url,
)
from kiln_registry.credentials.redaction import (
    REDACTED,
    SecretRedactionFilter,
    install_redaction,
    redact_text,
)
from kiln_registry.credentials.resolve import (
    CredentialSpec,
    ResolvedTeacher,
    resolve_teacher_endpoint,
)
from kiln_registry.credentials.secrets import (
    SecretHandle,
    check_environment_variable,
    is_valid_env_name,
    secret_problem,
)

__all__ = [
    "REDACTED",
    "CredentialSpec",
    "ResolvedTeacher",
    "SecretHandle",
    "SecretRedactionFilter",
    "TeacherEndpoint",
    "canonical_origin",
    "check_environment_variable",
    "install_redaction",
    "is_loopback_host",
    "is_valid_env_name",
    "kiln_loopback_host",
    "parse_teacher_url",
    "redact_text",
    "resolve_teacher_endpoint",
    "secret_problem",
]
