"""Wire schemas of the registry API (Kiln's Artifact Lifecycle contract).

Input and output models are separate classes so a private field can never
leak into a response.  Inputs forbid unknown fields; the fields that a
registration may never carry (identity, bounds, secret names) get their own
refusal message.  This module imports pydantic and the identity constants
only.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ALIAS_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:+=-]{0,127}$")
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
KNOWN_REMOTE_PROVIDERS: tuple[str, ...] = (
    "vllm",
    "sglang",
    "llama_cpp",
    "open_router",
    "together",
    "fireworks",
    "deep_infra",
    "tgi",
)


class TeacherKind(StrEnum):
    fixture = "fixture"
    local = "local"
    remote = "remote"


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
    return value


class RegisterTeacherRequest(BaseModel):
    """Caller-controlled registration fields; everything else is server-controlled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alias: str = Field(description="Immutable registry alias, e.g. `teacher-large@vllm`.")
    kind: TeacherKind
    provider: str | None = Field(default=None, description="Remote protocol; only `vllm`.")
    model_id: str | None = Field(
        default=None,
        description="Served model id (remote), or the `[teachers.local.<profile>]` name (local).",
    )
    url: str | None = Field(default=None, description="Teacher base URL (remote only).")
    credential_id: str | None = Field(
        default=None, description="A `[teachers.credentials.<id>]` entry bound to the URL's origin."
    )
    notes: str | None = None
    adapter: str | None = Field(default=None, description="Static adapter name (local only).")

    @model_validator(mode="before")
    @classmethod
    def _refuse_server_controlled(cls, data: Any) -> Any:
        if isinstance(data, dict):
            sent = [name for name in SERVER_CONTROLLED_FIELDS if name in data]
            if sent:
                raise ValueError(
                    f"field(s) {', '.join(sent)} cannot be supplied at registration: identity,"
                    " bounds and secret variable names are server-controlled (use credential_id"
                    " for an authenticated teacher)"
                )
        return data

    @field_validator("alias")
    @classmethod
    def _alias(cls, value: str) -> str:
        if not ALIAS_PATTERN.fullmatch(value):
            raise ValueError(
                "alias must be 1..128 characters of [A-Za-z0-9._@:+=-] starting with a letter"
                " or digit"
            )
        return value

    @field_validator("model_id", "url", "credential_id", "adapter", "provider")
    @classmethod
    def _short_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty or blank")
        return _bounded_text(value, "value", MAX_TEXT_CHARS)

    @field_validator("notes")
    @classmethod
    def _notes(cls, value: str | None) -> str | None:
        return _bounded_text(value, "notes", MAX_NOTES_CHARS)

    @model_validator(mode="after")
    def _kind_rules(self) -> RegisterTeacherRequest:
        if self.kind is TeacherKind.remote:
            self._remote_rules()
        else:
            for name in ("url", "credential_id"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only allowed for kind 'remote'")
            if self.model_id is None:
                raise ValueError(f"model_id is required for kind '{self.kind.value}'")
            if self.kind is TeacherKind.fixture and self.adapter is not None:
                raise ValueError("adapter must be null for kind 'fixture'")
            if self.kind is TeacherKind.fixture and self.provider is not None:
                raise ValueError("provider must be null for kind 'fixture'")
            if self.kind is TeacherKind.local and self.provider not in (None, "vllm"):
                raise ValueError("provider must be 'vllm' (or omitted) for kind 'local'")
        return self

    def _remote_rules(self) -> None:
        if self.provider is None:
            raise ValueError("provider is required for kind 'remote' (use 'vllm')")
        if self.provider != "vllm":
            known = "a known provider" if self.provider in KNOWN_REMOTE_PROVIDERS else "unknown"
            raise ValueError(
                f"provider {self.provider[:64]!r} ({known}) is not supported for registration:"
                " only 'vllm' teachers can prove a Kiln identity"
            )
        for name in ("model_id", "url"):
            if getattr(self, name) is None:
                raise ValueError(f"{name} is required for kind 'remote'")
        if self.adapter is not None:
            raise ValueError("adapter must be null for kind 'remote' (the identity binds it)")


class AdapterIdentityPublic(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    weights_sha256: str
    config_sha256: str


class TeacherIdentityV1(BaseModel):
    """The canonical teacher identity, keys in normative order."""

    model_config = ConfigDict(frozen=True)

    schema_: Literal["kiln.teacher-identity.v1"] = Field(alias="schema")
    protocol: Literal["vllm.prompt-logprobs.numeric-token-ids.causal.v1"]
    served_model_id: str
    base_model_sha256: str
    tokenizer_vocab_sha256: str
    tokenizer_config_sha256: str
    adapter: AdapterIdentityPublic | None
    vocab_size: int
    max_top_k: int
    max_model_len: int
    max_prompt_logprob_candidates: int
    logprobs_mode: Literal["raw_logprobs"]
    implementation: str
    inference_config_sha256: str


class TeacherSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    alias: str
    kind: TeacherKind
    provider: str | None
    model_id: str
    max_top_k: int | None
    vocab_size: int | None
    supports_full_vocab: bool | None
    tokenizer_hash: str | None
    identity: TeacherIdentityV1 | None = None
    url: str | None
    credential_id: str | None = None
    notes: str | None
    adapter: str | None


class LogitSourceCaps(BaseModel):
    model_config = ConfigDict(frozen=True)

    teacher_id: str
    vocab_size: int
    max_top_k: int
    supports_full_vocab: bool
    supports_batched: bool
    tokenizer_hash: str | None


class TeacherEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    spec: TeacherSpec
    capabilities: LogitSourceCaps | None
    status: TeacherStatus
    usable: bool
    identity_revision: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    off_policy_manifest: str | None = None
    status_message: str | None = None


class TeachersListResponse(BaseModel):
    teachers: list[TeacherEntry]


class DeleteTeacherResponse(BaseModel):
    status: Literal["deleted"] = "deleted"
    alias: str


class RowWidths(BaseModel):
    min: int
    max: int


class ProbeAttemptPublic(BaseModel):
    """One probe request: K, what came back and how long it took (no body, no header)."""

    purpose: str = Field(description="`discover` (K=1), `max_top_k`, `cap` (K=max_top_k+1).")
    k: int
    prompt_len: int
    status_code: int | None
    elapsed_ms: float
    bytes_read: int
    fingerprint: str | None
    identity_digest: str | None
    row_widths: RowWidths | None
    candidate_count: int | None


class ProbeFailurePublic(BaseModel):
    code: str | None
    rule: str | None
    message: str | None


class ProbeReportPublic(BaseModel):
    """The outcome of the dual identity probe and the cap probe."""

    url: str
    model_id: str
    authenticated: bool
    k_values: list[int]
    attempts: list[ProbeAttemptPublic]
    outcome: Literal["passed", "failed"]
    fingerprint: str | None
    identity_digest: str | None
    failure: ProbeFailurePublic | None
    elapsed_ms: float


class ProbeReceipt(BaseModel):
    """A stored probe report; never holds a secret."""

    id: int
    alias: str
    created_at: str
    outcome: Literal["passed", "failed"]
    identity_revision: str | None
    report: ProbeReportPublic


class ReceiptsResponse(BaseModel):
    receipts: list[ProbeReceipt]


class ErrorDetail(BaseModel):
    code: str
    message: str
    hint: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(BaseModel):
    status: Literal["ready", "starting"]
    database_revision: str | None
    teachers: int
