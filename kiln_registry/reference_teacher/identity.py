"""The reference teacher's TeacherIdentityV1 and how a teacher is loaded with it.

Owns the reference teacher's ``kiln.reference-teacher-inference.v1`` document
(its digest is the identity's ``inference_config_sha256``), the identity built
from ``kiln_registry.model.inspect.inspect_model`` digests with
``implementation = "transformers:" + version``, and ``load_reference_teacher``,
which inspects the model directory, composes the identity and loads the model
stamped with the identity's fingerprint.

The reference teacher serves base models only (no adapter).  Imports:
standard library, ``kiln_registry.identity``, ``kiln_registry.model`` and
``reference_teacher.model`` (torch); transformers/tokenizers only for their
versions, inside functions.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

from kiln_registry.identity.bounds import default_max_candidates
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.model.inspect import ModelInspection, inspect_model
from kiln_registry.reference_teacher.model import ReferenceTeacher

INFERENCE_SCHEMA = "kiln.reference-teacher-inference.v1"


@dataclass(frozen=True, slots=True)
class RuntimeVersions:
    torch: str
    transformers: str
    tokenizers: str
    python: str

    @classmethod
    def current(cls) -> RuntimeVersions:
        import tokenizers
        import torch
        import transformers

        return cls(
            torch=str(torch.__version__),
            transformers=str(transformers.__version__),
            tokenizers=str(tokenizers.__version__),
            python=platform.python_version(),
        )


def inference_config_sha256(
    inspection: ModelInspection,
    *,
    max_top_k: int,
    max_model_len: int,
    max_prompt_logprob_candidates: int,
    versions: RuntimeVersions,
) -> str:
    """Digest of the canonical reference-teacher inference document."""
    document = {
        "schema": INFERENCE_SCHEMA,
        "snapshot_content_sha256": inspection.snapshot_content_sha256,
        "model_config_sha256": inspection.model_config_sha256,
        "max_top_k": max_top_k,
        "max_model_len": max_model_len,
        "max_prompt_logprob_candidates": max_prompt_logprob_candidates,
        "dtype": "float32",
        "device": "cpu",
        "torch": versions.torch,
        "transformers": versions.transformers,
        "tokenizers": versions.tokenizers,
        "python": versions.python,
    }
    return hashlib.sha256(canonical_json(document)).hexdigest()


def reference_identity(
    inspection: ModelInspection,
    *,
    served_model_id: str,
    max_top_k: int,
    max_model_len: int,
    versions: RuntimeVersions,
) -> TeacherIdentity:
    """The identity the reference teacher serves (validated by TeacherIdentity)."""
    candidates = default_max_candidates(max_top_k, inspection.vocab_size, max_model_len)
    return TeacherIdentity(
        served_model_id=served_model_id,
        base_model_sha256=inspection.base_model_sha256,
        tokenizer_vocab_sha256=inspection.tokenizer_vocab_sha256,
        tokenizer_config_sha256=inspection.tokenizer_config_sha256,
        adapter=None,
        vocab_size=inspection.vocab_size,
        max_top_k=max_top_k,
        max_model_len=max_model_len,
        max_prompt_logprob_candidates=candidates,
        implementation=f"transformers:{versions.transformers}",
        inference_config_sha256=inference_config_sha256(
            inspection,
            max_top_k=max_top_k,
            max_model_len=max_model_len,
            max_prompt_logprob_candidates=candidates,
            versions=versions,
        ),
    )


def load_reference_teacher(
    model_path: Path | str,
    *,
    served_model_id: str,
    max_top_k: int,
    max_model_len: int,
    limiter: ReadRateLimiter | None = None,
) -> tuple[ReferenceTeacher, TeacherIdentity]:
    """Inspect ``model_path``, compose its identity, and load it stamped with it."""
    inspection = inspect_model(
        model_path, limiter=limiter or ReadRateLimiter(None), use_transformers=True
    )
    identity = reference_identity(
        inspection,
        served_model_id=served_model_id,
        max_top_k=max_top_k,
        max_model_len=max_model_len,
        versions=RuntimeVersions.current(),
    )
    teacher = ReferenceTeacher.load(
        model_path,
        served_model_id=served_model_id,
        max_top_k=max_top_k,
        max_model_len=max_model_len,
        system_fingerprint=identity.fingerprint(),
        version=identity.implementation,
    )
    return teacher, identity
