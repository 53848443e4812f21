"""The registration request (``POST /v1/teachers``) and its server-side rules.

The response shapes the client shares live in ``kiln_registry.wire``; this
module keeps the one input whose validation needs the server's rules
(``_registration_problems``, the credential origin's URL trimming).  Inputs
forbid unknown fields; the fields that a registration may never carry
(identity, bounds, secret names) get their own refusal message.

Imports pydantic, ``kiln_registry.domain`` (aliases, limits, vocabulary),
``credentials.origin``, ``wire.teachers`` and ``api.all_errors``; the
registration body's per-kind rules are the kinds' (``teachers.kinds``,
imported when a body is checked).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from kiln_registry.api.all_errors import validate_all
from kiln_registry.credentials.origin import trim_url
from kiln_registry.domain.aliases import ALIAS_JSON_PATTERN, MAX_ALIAS_CHARS, alias_problem
from kiln_registry.domain.limits import MAX_NOTES_CHARS, MAX_REPLICA_URLS, MAX_TEXT_CHARS
from kiln_registry.domain.vocabulary import TeacherKind
from kiln_registry.wire.teachers import RemoteProvider

# The alias rule as a regular expression (ECMA-262 and Python ``re`` agree on it).
ALIAS_PATTERN = re.compile(ALIAS_JSON_PATTERN)

# Registration can never supply identity, bounds or secret names.
SERVER_CONTROLLED_FIELDS: tuple[str, ...] = (
    "api_key_env",
    "identity",
    "max_top_k",
    "vocab_size",
    "supports_full_vocab",
    "tokenizer_hash",
    "capabilities",
    "status",
)


def _bounded_text(value: str | None, field: str, limit: int) -> str | None:
    if value is None:
        return None
    if len(value) > limit:
        raise ValueError(f"{field} is longer than {limit} characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value if ch not in "\t\n"):
        raise ValueError(f"{field} contains a control character")
    if not value.isascii() and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise ValueError(f"{field} contains a lone surrogate (not valid UTF-8)")
    return value


class RegisterTeacherRequest(BaseModel):
    """Caller-controlled registration fields; everything else is server-controlled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alias: str = Field(
        min_length=1,
        max_length=MAX_ALIAS_CHARS,
        json_schema_extra={"pattern": ALIAS_JSON_PATTERN},
        description="Immutable registry alias, e.g. `qwen/qwen3-8b@vllm`: not blank, at most"
        f" {MAX_ALIAS_CHARS} characters, no control characters; an alias containing `/` may"
        " not end in `/probe`, `/receipts` or `/launch`.",
    )
    kind: TeacherKind = Field(
        description="`remote` (a vLLM server at `url`), `local` (the loaded student, launched by "
        "the registry) or `fixture` (a test double)."
    )
    provider: RemoteProvider | None = Field(
        default=None, description="Remote protocol; registration accepts only `vllm`."
    )
    model_id: str | None = Field(
        default=None,
        description="Served model id (remote, fixture); ignored for kind `local` (as in Kiln).",
    )
    url: str | None = Field(
        default=None,
        description="Teacher base URL (remote only); surrounding white space is trimmed, as Kiln"
        " trims it.",
    )
    urls: tuple[str, ...] | None = Field(
        default=None,
        max_length=MAX_REPLICA_URLS,
        description="Registry extension (remote only), instead of `url`: 2 to"
        f" {MAX_REPLICA_URLS} distinct base URLs of one teacher's replicas; every replica"
        " must prove the same identity.",
    )
    credential_id: str | None = Field(
        default=None, description="A `[teachers.credentials.<id>]` entry bound to the URL's origin."
    )
    notes: str | None = Field(
        default=None, description="Free text kept with the alias (at most 4096 characters)."
    )
    adapter: str | None = Field(
        default=None,
        description="Local only: a LoRA adapter directory name under the student's adapter"
        " directory (Kiln's shape), or the profile's served model id (launch_profile form).",
    )
    launch_profile: str | None = Field(
        default=None,
        description="Local only (registry extension): a `[teachers.local.<profile>]` to launch"
        " instead of the loaded student.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler: Any) -> Any:
        """Field errors and the kind rules, all in one refusal (``api.all_errors``)."""
        problems = _registration_problems(data) if isinstance(data, dict) else []
        return validate_all(cls.__name__, data, handler, problems, SERVER_CONTROLLED_FIELDS)

    @field_validator("alias", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        problem = alias_problem(value) if isinstance(value, str) else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("url", mode="before")
    @classmethod
    def _trim_url(cls, value: Any) -> Any:
        """Kiln parses ``url.trim()``: surrounding white space is not part of the URL."""
        return trim_url(value) if isinstance(value, str) else value

    @field_validator("urls", mode="before")
    @classmethod
    def _trim_urls(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [trim_url(url) if isinstance(url, str) else url for url in value]
        return value

    @field_validator("model_id", "url", "credential_id", "adapter", "launch_profile")
    @classmethod
    def _short_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty or blank")
        return _bounded_text(value, "value", MAX_TEXT_CHARS)

    @field_validator("urls")
    @classmethod
    def _urls(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        for url in value:
            if not url.strip():
                raise ValueError("a replica URL must not be empty or blank")
            _bounded_text(url, "a replica URL", MAX_TEXT_CHARS)
        return value

    @field_validator("notes")
    @classmethod
    def _notes(cls, value: str | None) -> str | None:
        return _bounded_text(value, "notes", MAX_NOTES_CHARS)


def _registration_problems(data: dict[str, Any]) -> list[str]:
    """Every cross-field rule a registration body breaks (from the raw body)."""
    problems: list[str] = []
    sent = [name for name in SERVER_CONTROLLED_FIELDS if name in data]
    if sent:
        problems.append(
            f"field(s) {', '.join(sent)} cannot be supplied at registration: identity,"
            " bounds and secret variable names are server-controlled (use credential_id"
            " for an authenticated teacher)"
        )
    # The kinds are server code: imported when a body is checked, so importing these
    # schemas (the client does) does not load the teachers layer.
    from kiln_registry.teachers.kinds import KINDS

    kind = data.get("kind")
    given = {name for name, value in data.items() if value is not None}
    strategy = KINDS.get(kind) if isinstance(kind, str) else None
    if strategy is not None:  # an unknown kind is the field's own error
        problems += strategy.request_problems(data, given)
    return problems
