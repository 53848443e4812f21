"""The line schemas of a result corpus (``GET /v1/jobs/{id}/result``, NDJSON), for OpenAPI.

The server writes corpora byte by byte (``jobs.scoring.corpus``) and checks them with
``jobs.scoring.corpus_verify``; these models only *describe* each line for the
OpenAPI document (``api.openapi`` puts them in ``components`` and names them
from the result's ``application/x-ndjson`` media type), so a generated client
can parse each line with a typed model.  Imports pydantic, ``wire.base`` and
``wire.teachers`` only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kiln_registry.wire.base import Sha256Hex
from kiln_registry.wire.teachers import TeacherIdentityV1

NDJSON = "application/x-ndjson"  # the result corpus's media type
LINE_MODELS_DESCRIPTION = (
    "Newline-delimited JSON, one line per record: line 1 is an `OffPolicyManifestLine` (the"
    " alias's exact `off_policy_manifest`), then one `TeacherScoresRow` per sequence, and last"
    " a `CorpusTrailerLine` signing the SHA-256 of every byte before it (`kiln corpus verify`"
    " checks all three; `GET /v1/keys` has the key). An off_policy_generation job's lines are"
    " Kiln `OffPolicyDistillationExample`s after the manifest, signed by a detached trailer."
)


class OffPolicyManifestLine(BaseModel):
    """Line 1: Kiln's off-policy distillation manifest (exact bytes: never reformatted)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["kiln.off-policy-distillation-manifest.v1"] = Field(
        alias="schema", description="Always `kiln.off-policy-distillation-manifest.v1`."
    )
    teacher_identity: TeacherIdentityV1 = Field(description="The teacher identity scored with.")


class TeacherScoresRow(BaseModel):
    """One sequence's teacher scores (keys in exactly this order)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["kiln.teacher-scores.v1"] = Field(description="The row format.")
    job_id: str = Field(description="The job that wrote the corpus.")
    teacher: str = Field(description="The teacher alias.")
    identity_digest: Sha256Hex = Field(description="Digest of the manifest's identity.")
    top_k: int = Field(ge=1, description="K: the width of every `topk_*` row.")
    id: str = Field(description='The sequence id (`"i"` for inline sequence i).')
    token_ids_sha256: Sha256Hex = Field(
        description="SHA-256 of `token_ids` as 4-byte little-endian unsigned integers."
    )
    token_ids: list[int] = Field(description="The sequence's n token ids.")
    topk_ids: list[list[int]] = Field(
        description="n rows of K distinct token ids, best first: row i is the teacher's"
        " distribution over the token after position i."
    )
    topk_logprobs: list[list[float]] = Field(
        description="n rows of K non-increasing, non-positive float32 logprobs for `topk_ids`."
    )
    token_logprobs: list[float] = Field(
        description="The n - 1 logprobs of the sequence's own next tokens."
    )


class TrailerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: Sha256Hex = Field(description="SHA-256 of every byte before the trailer line.")
    key_id: Sha256Hex = Field(description="The signing key's id (`GET /v1/keys`).")
    signature: str = Field(
        pattern=r"^[0-9a-f]{128}$",
        description="Hex Ed25519 signature over `kiln.corpus-trailer.v1`, NUL, the digest.",
    )


class CorpusTrailerLine(BaseModel):
    """The last line: the registry's signature over the corpus."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    trailer: TrailerBody = Field(
        alias="kiln.corpus-trailer.v1", description="The signature trailer."
    )


LINE_MODELS: tuple[type[BaseModel], ...] = (
    OffPolicyManifestLine,
    TeacherScoresRow,
    CorpusTrailerLine,
)
