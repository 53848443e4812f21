"""Composition of a TeacherIdentityV1 from measured inputs and launch options.

Owns the one function that turns a ``TeacherInput`` (measured by the
launcher, or read from a precomputed ``kiln.vllm-teacher-input.v2`` file)
plus the operator's served model id, limits, accepted extra vLLM options
and launch environment into the inference config document, its digest and
the identity.  ``kiln-teacher --manifest-only`` and the launcher call
``compose_identity``; they never assemble the documents themselves.

Imports: standard library, ``kiln_registry.domain.errors`` and
``kiln_registry.identity`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.bounds import default_max_candidates, validate_max_candidates
from kiln_registry.identity.document import (
    MAX_MODEL_LEN,
    MAX_TOP_K,
    AdapterIdentity,
    TeacherIdentity,
    check_int,
    show,
    validate_identity,
)
from kiln_registry.identity.inference import inference_config_document, inference_config_sha256
from kiln_registry.identity.input_manifest import TeacherInput


@dataclass(frozen=True, slots=True)
class ComposedIdentity:
    """An identity with the exact inference config document it hashes."""

    identity: TeacherIdentity
    inference_config: dict[str, object]
    inference_config_sha256: str

    def to_output(self) -> dict[str, object]:
        """The ``--manifest-only`` document: identity, digest, fingerprint, config."""
        return {
            "identity": self.identity.to_dict(),
            "identity_sha256": self.identity.digest(),
            "fingerprint": self.identity.fingerprint(),
            "inference_config": self.inference_config,
        }


def _adapter_for(
    inputs: TeacherInput, served_model_id: str, strict: bool
) -> AdapterIdentity | None:
    adapter = inputs.adapter
    if adapter is not None and strict and adapter.name != served_model_id:
        raise IdentityError(
            f"adapter name {show(adapter.name)} must equal the served model id"
            f" {show(served_model_id)}",
            rule="identity.adapter_name",
        )
    return adapter


def _limits(
    inputs: TeacherInput, max_top_k: int, max_model_len: int, candidates: int | None
) -> tuple[int, int, int]:
    """max_top_k, max_model_len and the candidate budget (section 6 default if None)."""
    top_k = check_int(max_top_k, "max_top_k", 1, MAX_TOP_K)
    model_len = check_int(max_model_len, "max_model_len", 1, MAX_MODEL_LEN)
    if candidates is None:
        return top_k, model_len, default_max_candidates(top_k, inputs.vocab_size, model_len)
    validate_max_candidates(
        candidates, max_top_k=top_k, vocab_size=inputs.vocab_size, max_model_len=model_len
    )
    return top_k, model_len, candidates


def compose_identity(
    inputs: TeacherInput,
    *,
    served_model_id: str,
    max_top_k: int,
    max_model_len: int,
    max_prompt_logprob_candidates: int | None,
    vllm_args: Sequence[str],
    environment: Mapping[str, str],
    launcher_strict: bool = True,
) -> ComposedIdentity:
    """Build and validate the identity a launch with these settings serves.

    ``max_prompt_logprob_candidates=None`` takes section 6's default.
    ``vllm_args`` are the accepted non-transport extra options as given;
    ``environment`` is the full launch environment (only the inference
    variables are selected from it).
    """
    top_k, model_len, candidates = _limits(
        inputs, max_top_k, max_model_len, max_prompt_logprob_candidates
    )
    adapter = _adapter_for(inputs, served_model_id, launcher_strict)
    document = inference_config_document(
        snapshot_content_sha256=inputs.snapshot_content_sha256,
        model_config_sha256=inputs.model_config_sha256,
        max_top_k=top_k,
        max_model_len=model_len,
        max_prompt_logprob_candidates=candidates,
        adapter_enabled=adapter is not None,
        adapter_max_rank=inputs.adapter_max_rank,
        vllm_args=vllm_args,
        environment=environment,
        runtime_versions=inputs.runtime_versions,
        runtime_content_sha256=inputs.runtime_content_sha256,
        accelerator=inputs.accelerator.to_dict(),
    )
    digest = inference_config_sha256(document)
    identity = TeacherIdentity(
        served_model_id=served_model_id,
        base_model_sha256=inputs.base_model_sha256,
        tokenizer_vocab_sha256=inputs.tokenizer_vocab_sha256,
        tokenizer_config_sha256=inputs.tokenizer_config_sha256,
        adapter=adapter,
        vocab_size=inputs.vocab_size,
        max_top_k=top_k,
        max_model_len=model_len,
        max_prompt_logprob_candidates=candidates,
        implementation=inputs.implementation,
        inference_config_sha256=digest,
    )
    if launcher_strict:
        validate_identity(identity, launcher_strict=True)
    return ComposedIdentity(identity, document, digest)
