"""Wire shapes of the teacher routes: entries, the identity, probe reports and receipts.

Kiln's Artifact Lifecycle contract as the server sends it and the client parses it.
Every model is a ``WireModel`` (``wire.base``): optional fields without a value are
omitted, never ``null``, as in Kiln's artifact schema (``spec.identity``,
``spec.credential_id``, ``identity_revision``, ``off_policy_manifest``,
``status_message``); ``capabilities`` and the other spec fields are required and
nullable; the identity keeps ``"adapter": null``.  The registration request, whose
rules need the server, is ``api.schemas.RegisterTeacherRequest``.

Imports pydantic, ``kiln_registry.domain`` and ``wire.base`` only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from kiln_registry.domain.vocabulary import TeacherKind as TeacherKind
from kiln_registry.domain.vocabulary import TeacherStatus as StoredStatus
from kiln_registry.wire.base import Count, Sha256Hex, Sha256Ref, WireModel


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
