"""Wire schemas of the registry API (Kiln's Artifact Lifecycle contract).

Input and output models are separate classes so a private field can never
leak into a response.  Inputs forbid unknown fields; the fields that a
registration may never carry (identity, bounds, secret names) get their own
refusal message.

Every response model is a ``WireModel`` (``api.wire``): optional fields
without a value are omitted, never ``null``, as in Kiln's artifact schema
(``spec.identity``, ``spec.credential_id``, ``identity_revision``,
``off_policy_manifest``, ``status_message``); ``capabilities`` and the other
spec fields are required and nullable; the identity keeps ``"adapter": null``.

Imports pydantic, ``kiln_registry.aliases`` and ``api.wire`` only.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from kiln_registry.aliases import ALIAS_JSON_PATTERN, MAX_ALIAS_CHARS, alias_problem
from kiln_registry.api.all_errors import validate_all
from kiln_registry.api.wire import Count as Count
from kiln_registry.api.wire import Sha256Hex as Sha256Hex
from kiln_registry.api.wire import Sha256Ref as Sha256Ref
from kiln_registry.api.wire import WireModel as WireModel

# The alias rule as a regular expression (ECMA-262 and Python ``re`` agree on it).
ALIAS_PATTERN = re.compile(ALIAS_JSON_PATTERN)
MAX_NOTES_CHARS = 4096
MAX_TEXT_CHARS = 2048

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


class TeacherKind(StrEnum):
    fixture = "fixture"
    local = "local"
    remote = "remote"


class RemoteProvider(StrEnum):
    """Kiln's remote protocols (``kiln_train::RemoteProvider``); registration takes `vllm`."""

    vllm = "vllm"
    sglang = "sglang"
    llama_cpp = "llama_cpp"
    open_router = "open_router"
    together = "together"
    fireworks = "fireworks"
    deep_infra = "deep_infra"
    tgi = "tgi"


class TeacherStatus(StrEnum):
    verified = "verified"
    configured = "configured"
    legacy_unverified = "legacy_unverified"
    unavailable = "unavailable"


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
    kind: TeacherKind
    provider: RemoteProvider | None = Field(
        default=None, description="Remote protocol; registration accepts only `vllm`."
    )
    model_id: str | None = Field(
        default=None,
        description="Served model id (remote, fixture); ignored for kind `local` (as in Kiln).",
    )
    url: str | None = Field(default=None, description="Teacher base URL (remote only).")
    credential_id: str | None = Field(
        default=None, description="A `[teachers.credentials.<id>]` entry bound to the URL's origin."
    )
    notes: str | None = None
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

    @field_validator("model_id", "url", "credential_id", "adapter", "launch_profile")
    @classmethod
    def _short_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty or blank")
        return _bounded_text(value, "value", MAX_TEXT_CHARS)

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
    kind = data.get("kind")
    given = {name for name, value in data.items() if value is not None}
    if kind == "remote":
        problems += _remote_problems(data.get("provider"), given)
    elif kind in ("local", "fixture"):
        # Kiln (api/teachers.rs): provider, url and credential_id are remote-only; a
        # local teacher's model_id is ignored (the loaded student is the model).
        problems += [
            "`provider`, `url`, and `credential_id` are only valid on kind=remote"
            f" teachers ({name} was given for kind '{kind}')"
            for name in ("provider", "url", "credential_id")
            if name in given
        ]
        if kind == "fixture" and "model_id" not in given:
            problems.append("model_id is required for kind 'fixture'")
        if kind == "fixture" and "adapter" in given:
            problems.append("`adapter` is only valid on kind=local teachers")
    if kind in ("remote", "fixture") and "launch_profile" in given:
        problems.append("launch_profile is only valid on kind=local teachers")
    return problems


def _remote_problems(provider: object, given: set[str]) -> list[str]:
    problems: list[str] = []
    if provider is None:
        problems.append("provider is required for kind 'remote' (use 'vllm')")
    elif provider in RemoteProvider.__members__ and provider != RemoteProvider.vllm:
        problems.append(
            f"provider {provider!r} is not supported for registration:"
            " only 'vllm' teachers can prove a Kiln identity"
        )
    problems += [f"{name} is required for kind 'remote'" for name in ("model_id", "url")
                 if name not in given]  # fmt: skip
    if "adapter" in given:
        problems.append("adapter must be null for kind 'remote' (the identity binds it)")
    return problems


class AdapterIdentityPublic(WireModel):
    name: str = Field(min_length=1)
    weights_sha256: Sha256Hex
    config_sha256: Sha256Hex


class TeacherIdentityV1(WireModel):
    """The canonical teacher identity, keys in normative order (bounds as Kiln's schema)."""

    schema_: Literal["kiln.teacher-identity.v1"] = Field(alias="schema")
    protocol: Literal["vllm.prompt-logprobs.numeric-token-ids.causal.v1"]
    served_model_id: str = Field(min_length=1)
    base_model_sha256: Sha256Hex
    tokenizer_vocab_sha256: Sha256Hex
    tokenizer_config_sha256: Sha256Hex
    adapter: AdapterIdentityPublic | None
    vocab_size: int = Field(ge=1, le=16_777_216)
    max_top_k: int = Field(ge=1, le=65_536)
    max_model_len: int = Field(ge=1, le=16_777_216)
    max_prompt_logprob_candidates: int = Field(ge=1, le=1_000_000)
    logprobs_mode: Literal["raw_logprobs"]
    implementation: str = Field(min_length=1)
    inference_config_sha256: Sha256Hex


class TeacherSpec(WireModel):
    alias: str = Field(min_length=1)
    kind: TeacherKind
    provider: RemoteProvider | None
    model_id: str
    max_top_k: int | None = Field(ge=0)
    vocab_size: int | None = Field(ge=1)
    supports_full_vocab: bool | None
    tokenizer_hash: str | None = Field(min_length=1)
    identity: TeacherIdentityV1 | None = None
    url: str | None = Field(min_length=1)
    credential_id: str | None = Field(default=None, min_length=1)
    notes: str | None
    adapter: str | None


class LogitSourceCaps(WireModel):
    teacher_id: str = Field(min_length=1)
    vocab_size: int = Field(ge=1)
    max_top_k: int = Field(ge=1)
    supports_full_vocab: bool
    supports_batched: bool
    tokenizer_hash: str | None = Field(min_length=1)


class TeacherEntry(WireModel):
    spec: TeacherSpec
    capabilities: LogitSourceCaps | None
    status: TeacherStatus
    usable: bool
    identity_revision: Sha256Ref | None = None
    off_policy_manifest: str | None = Field(default=None, min_length=1)
    status_message: str | None = Field(default=None, min_length=1)


class TeachersListResponse(WireModel):
    teachers: list[TeacherEntry]
    next_cursor: str | None = Field(
        default=None,
        description="Registry extension: pass as `cursor` for the next page; absent on the last.",
    )


class DeleteTeacherResponse(WireModel):
    status: Literal["deleted"] = "deleted"
    alias: str = Field(min_length=1)


class RowWidths(WireModel):
    min: Count
    max: Count


class ProbePurpose(StrEnum):
    """`discover` (K=1), `max_top_k`, `cap` (K=max_top_k+1)."""

    discover = "discover"
    max_top_k = "max_top_k"
    cap = "cap"


class ProbeOutcome(StrEnum):
    passed = "passed"
    failed = "failed"


class ProbeAttemptPublic(WireModel):
    """One probe request: K, what came back and how long it took (no body, no header)."""

    purpose: ProbePurpose
    k: int = Field(ge=1)
    prompt_len: int = Field(ge=1)
    status_code: int | None = Field(ge=100, le=599)
    elapsed_ms: float = Field(ge=0)
    bytes_read: Count
    fingerprint: str | None
    identity_digest: Sha256Hex | None
    row_widths: RowWidths | None
    candidate_count: Count | None


class ProbeFailurePublic(WireModel):
    code: str | None
    rule: str | None
    message: str | None


class ProbeReportPublic(WireModel):
    """The outcome of the dual identity probe and the cap probe."""

    url: str
    model_id: str
    authenticated: bool
    k_values: list[Annotated[int, Field(ge=1)]]
    attempts: list[ProbeAttemptPublic]
    outcome: ProbeOutcome
    fingerprint: str | None
    identity_digest: Sha256Hex | None
    failure: ProbeFailurePublic | None
    elapsed_ms: float = Field(ge=0)


class ProbeReceipt(WireModel):
    """A stored probe report; never holds a secret."""

    id: int = Field(ge=1)
    alias: str = Field(min_length=1)
    created_at: str
    outcome: ProbeOutcome
    identity_revision: Sha256Ref | None
    report: ProbeReportPublic


class ReceiptsResponse(WireModel):
    receipts: list[ProbeReceipt]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last."
    )


class ErrorDetail(WireModel):
    code: str = Field(min_length=1, description="Stable snake_case error code.")
    message: str
    hint: str = Field(description="What to do next (always a string, possibly empty).")
    rule: str | None = Field(
        default=None, min_length=1, description="The dotted rule that failed, where one did."
    )


class ErrorResponse(WireModel):
    error: ErrorDetail


class HealthResponse(WireModel):
    status: Literal["ok"] = "ok"


class LegacyRegistryReport(WireModel):
    """The last start-up import of ``[server] legacy_registry``; a refusal keeps the server up."""

    status: Literal["imported", "refused"]
    path: str
    rule: str | None = None
    message: str


class ReadyResponse(WireModel):
    status: Literal["ready", "starting"]
    database_revision: str | None
    teachers: Count
    legacy_registry: LegacyRegistryReport | None = None
