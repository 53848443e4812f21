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

Imports pydantic, ``kiln_registry.domain`` (aliases, limits, vocabulary), ``api.wire`` and
``api.all_errors``; the registration body's per-kind rules are the kinds'
(``teachers.kinds``, imported when a body is checked).
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

from kiln_registry.api.all_errors import validate_all
from kiln_registry.api.wire import Count as Count
from kiln_registry.api.wire import Sha256Hex as Sha256Hex
from kiln_registry.api.wire import Sha256Ref as Sha256Ref
from kiln_registry.api.wire import WireModel as WireModel
from kiln_registry.credentials.origin import trim_url
from kiln_registry.domain.aliases import ALIAS_JSON_PATTERN, MAX_ALIAS_CHARS, alias_problem
from kiln_registry.domain.limits import MAX_NOTES_CHARS, MAX_REPLICA_URLS, MAX_TEXT_CHARS
from kiln_registry.domain.vocabulary import TeacherKind as TeacherKind
from kiln_registry.domain.vocabulary import TeacherStatus as StoredStatus

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


# The published statuses (``vocabulary.PUBLISHED_TEACHER_STATUSES``): the stored
# statuses less the internal ``launching``, which a response shows as ``unavailable``.
# A class of its own so the OpenAPI enum lists these four only.
class TeacherStatus(StrEnum):
    verified = StoredStatus.verified.value
    configured = StoredStatus.configured.value
    legacy_unverified = StoredStatus.legacy_unverified.value
    unavailable = StoredStatus.unavailable.value


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


class AdapterIdentityPublic(WireModel):
    name: str = Field(min_length=1, description="The adapter's name as vLLM serves it.")
    weights_sha256: Sha256Hex = Field(description="SHA-256 of the adapter weights.")
    config_sha256: Sha256Hex = Field(description="SHA-256 of the adapter configuration.")


class TeacherIdentityV1(WireModel):
    """The canonical teacher identity, keys in normative order (bounds as Kiln's schema)."""

    schema_: Literal["kiln.teacher-identity.v1"] = Field(
        alias="schema", description="Always `kiln.teacher-identity.v1`."
    )
    protocol: Literal["vllm.prompt-logprobs.numeric-token-ids.causal.v1"] = Field(
        description="Always `vllm.prompt-logprobs.numeric-token-ids.causal.v1`."
    )
    served_model_id: str = Field(
        min_length=1, description="The model id vLLM serves (the `model` of completion requests)."
    )
    base_model_sha256: Sha256Hex = Field(description="Digest of the base model's weight files.")
    tokenizer_vocab_sha256: Sha256Hex = Field(
        description="Digest of the tokenizer vocabulary (must equal the student's)."
    )
    tokenizer_config_sha256: Sha256Hex = Field(description="Digest of the tokenizer configuration.")
    adapter: AdapterIdentityPublic | None = Field(
        description="The LoRA adapter served on top of the base model, else null."
    )
    vocab_size: int = Field(
        ge=1, le=16_777_216, description="Vocabulary size (must equal the student's model width)."
    )
    max_top_k: int = Field(
        ge=1, le=65_536, description="The largest K of `prompt_logprobs` the teacher answers."
    )
    max_model_len: int = Field(ge=1, le=16_777_216, description="Context length in tokens.")
    max_prompt_logprob_candidates: int = Field(
        ge=1,
        le=1_000_000,
        description="Bound on candidates in one response (prompt length x (K+1)).",
    )
    logprobs_mode: Literal["raw_logprobs"] = Field(description="Always `raw_logprobs`.")
    implementation: str = Field(
        min_length=1, description="The serving implementation and version, e.g. `vllm:0.32.0`."
    )
    inference_config_sha256: Sha256Hex = Field(
        description="Digest of every option that changes the numbers (dtype, seed, kernels ...)."
    )


class TeacherSpec(WireModel):
    alias: str = Field(min_length=1, description="The immutable registry alias.")
    kind: TeacherKind = Field(description="`remote`, `local` or `fixture`.")
    provider: RemoteProvider | None = Field(
        description="Remote protocol (`vllm`); null for other kinds."
    )
    model_id: str = Field(description="The served model id requests name.")
    max_top_k: int | None = Field(
        ge=0, description="Largest K the teacher answers (from the identity), else null."
    )
    vocab_size: int | None = Field(
        ge=1, description="Vocabulary size (from the identity), else null."
    )
    supports_full_vocab: bool | None = Field(
        description="Whether full-vocabulary logprobs are available (never, for vLLM teachers)."
    )
    tokenizer_hash: str | None = Field(
        min_length=1, description="The tokenizer vocabulary digest, else null."
    )
    identity: TeacherIdentityV1 | None = Field(
        default=None, description="The proven teacher identity; absent for unverified kinds."
    )
    url: str | None = Field(min_length=1, description="Teacher base URL (remote), else null.")
    credential_id: str | None = Field(
        default=None,
        min_length=1,
        description="The `[teachers.credentials.<id>]` used to authenticate; absent without one.",
    )
    notes: str | None = Field(description="Free text given at registration, else null.")
    adapter: str | None = Field(description="The adapter name (local), else null.")


class LogitSourceCaps(WireModel):
    teacher_id: str = Field(min_length=1, description="The alias, as Kiln's logit source names it.")
    vocab_size: int = Field(ge=1, description="Vocabulary size.")
    max_top_k: int = Field(ge=1, description="Largest K.")
    supports_full_vocab: bool = Field(description="Full-vocabulary logprobs available.")
    supports_batched: bool = Field(description="Batched requests accepted.")
    tokenizer_hash: str | None = Field(
        min_length=1, description="Tokenizer vocabulary digest, else null."
    )


class ReplicaStatus(StrEnum):
    verified = "verified"
    unavailable = "unavailable"


class TeacherReplica(WireModel):
    """One endpoint of a replica-set alias (registry extension)."""

    url: str = Field(min_length=1, description="The replica's base URL.")
    status: ReplicaStatus = Field(
        description="`verified` (its last probe proved the alias's identity) or `unavailable`."
    )
    status_message: str | None = Field(
        default=None, min_length=1, description="Why the replica is unavailable; absent if not."
    )
    checked_at: str = Field(description="When the replica was last probed (UTC, ISO-8601).")


class TeacherEntry(WireModel):
    spec: TeacherSpec = Field(description="What was registered and proven.")
    capabilities: LogitSourceCaps | None = Field(
        description="What Kiln may ask of the teacher; null while unusable."
    )
    status: TeacherStatus = Field(
        description="`verified`, `configured`, `legacy_unverified` or `unavailable` (checked live "
        "on every read)."
    )
    usable: bool = Field(description="Whether jobs and Kiln may use the alias now.")
    identity_revision: Sha256Ref | None = Field(
        default=None, description="`sha256:` + the identity digest; absent without an identity."
    )
    off_policy_manifest: str | None = Field(
        default=None,
        min_length=1,
        description="The exact first line of every corpus scored by this identity; absent without "
        "an identity.",
    )
    status_message: str | None = Field(
        default=None,
        min_length=1,
        description="Why the alias is not usable (rule and message); absent when it is.",
    )
    replicas: list[TeacherReplica] | None = Field(
        default=None,
        description="Registry extension: each endpoint of an alias registered with `urls`, in"
        " order; absent for a single-URL alias.",
    )


class TeachersListResponse(WireModel):
    teachers: list[TeacherEntry] = Field(description="Registered teachers, ordered by alias.")
    next_cursor: str | None = Field(
        default=None,
        description="Registry extension: pass as `cursor` for the next page; absent on the last.",
    )


class DeleteTeacherResponse(WireModel):
    status: Literal["deleted"] = Field(default="deleted", description="Always `deleted`.")
    alias: str = Field(
        min_length=1, description="The deleted alias (reserved until an admin releases it)."
    )


class RowWidths(WireModel):
    min: Count = Field(description="The fewest candidates in one row.")
    max: Count = Field(description="The most candidates in one row.")


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

    purpose: ProbePurpose = Field(
        description="Which probe: `discover` (K=1), `max_top_k` or `cap` (K=max_top_k+1, must be "
        "refused)."
    )
    k: int = Field(ge=1, description="The K asked for.")
    prompt_len: int = Field(ge=1, description="Tokens in the probe prompt.")
    status_code: int | None = Field(
        ge=100, le=599, description="The teacher's HTTP status, or null when none came."
    )
    elapsed_ms: float = Field(ge=0, description="Wall time of the request in milliseconds.")
    bytes_read: Count = Field(description="Response bytes read.")
    fingerprint: str | None = Field(
        description="The `system_fingerprint` the teacher answered, else null."
    )
    identity_digest: Sha256Hex | None = Field(
        description="The digest of the identity in that fingerprint, else null."
    )
    row_widths: RowWidths | None = Field(description="Candidates per row seen, else null.")
    candidate_count: Count | None = Field(
        description="Candidates in the whole response, else null."
    )


class ProbeFailurePublic(WireModel):
    code: str | None = Field(description="Error code of the failure.")
    rule: str | None = Field(description="The dotted rule that failed.")
    message: str | None = Field(description="What failed, in one line.")


class ProbeReportPublic(WireModel):
    """The outcome of the dual identity probe and the cap probe."""

    url: str = Field(description="The teacher's base URL probed.")
    model_id: str = Field(description="The served model id probed.")
    authenticated: bool = Field(description="Whether a credential's bearer secret was sent.")
    k_values: list[Annotated[int, Field(ge=1)]] = Field(
        description="The K of each probe, in order."
    )
    attempts: list[ProbeAttemptPublic] = Field(description="One entry per probe request.")
    outcome: ProbeOutcome = Field(description="`passed` or `failed`.")
    fingerprint: str | None = Field(description="The verified fingerprint, else null.")
    identity_digest: Sha256Hex | None = Field(
        description="The verified identity's digest, else null."
    )
    failure: ProbeFailurePublic | None = Field(description="Why the probe failed, else null.")
    elapsed_ms: float = Field(ge=0, description="Wall time of all probes in milliseconds.")


class ProbeReceipt(WireModel):
    """A stored probe report; never holds a secret."""

    id: int = Field(ge=1, description="Receipt number (ascending).")
    alias: str = Field(min_length=1, description="The alias probed.")
    created_at: str = Field(description="When the probe ran (UTC, RFC 3339).")
    outcome: ProbeOutcome = Field(description="`passed` or `failed`.")
    identity_revision: Sha256Ref | None = Field(
        description="The identity the probe proved, else null."
    )
    report: ProbeReportPublic = Field(description="The full probe report.")


class ReceiptsResponse(WireModel):
    receipts: list[ProbeReceipt] = Field(description="Probe receipts, newest first.")
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last."
    )


class ErrorDetail(WireModel):
    code: str = Field(min_length=1, description="Stable snake_case error code.")
    message: str = Field(
        description="What went wrong, in one line (never a secret or a submitted value)."
    )
    hint: str = Field(description="What to do next (always a string, possibly empty).")
    rule: str | None = Field(
        default=None, min_length=1, description="The dotted rule that failed, where one did."
    )


class ErrorResponse(WireModel):
    error: ErrorDetail = Field(
        description="The error: code, message, hint and (where one failed) rule."
    )


class HealthResponse(WireModel):
    status: Literal["ok"] = Field(default="ok", description="Always `ok` while the process serves.")


class LegacyRegistryReport(WireModel):
    """The last start-up import of ``[server] legacy_registry``; a refusal keeps the server up."""

    status: Literal["imported", "refused"] = Field(description="`imported` or `refused`.")
    path: str = Field(description="The legacy `teachers.json` read.")
    rule: str | None = Field(
        default=None, description="The rule that refused it; absent when imported."
    )
    message: str = Field(description="What happened, in one line.")


class ReadyResponse(WireModel):
    status: Literal["ready", "starting"] = Field(
        description="`ready`, or `starting` while start-up work runs."
    )
    database_revision: str | None = Field(description="The database's Alembic revision, else null.")
    teachers: Count = Field(description="Registered aliases.")
    legacy_registry: LegacyRegistryReport | None = Field(
        default=None, description="The last legacy registry import; absent when none is configured."
    )
