"""Example bodies for the OpenAPI document: one per request and response schema.

``body_examples()`` maps a component schema name to one consistent example
(the same teacher, identity, job and key throughout); the identity, its
fingerprint, digest and ``off_policy_manifest`` are computed from a real
``TeacherIdentity``, so the examples are what the server would send.  Tests
validate every example against its pydantic model.  ``error_example(code)``
is the envelope of one error code; ``ndjson_example()`` three lines of a
teacher-scoring corpus (manifest, one row, trailer) and ``METRICS_EXAMPLE``
an excerpt of ``/metrics``.  Built on first use, never at import time.
Imports ``identity`` only.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest

ALIAS = "qwen/qwen3-8b@vllm"
JOB_ID = "job-5f0c6a1e9b2d4c7a8e3f1b20"
KEY_ID = "39f713d0a644253f04529421b9f51b9b08979d08295959c4f3990ee617f5139f"
CREATED = "2026-12-01T16:20:05.123Z"
METRICS_EXAMPLE = (
    "# HELP kiln_teachers Registered teachers by status.\n"
    "# TYPE kiln_teachers gauge\n"
    'kiln_teachers{status="verified"} 1.0\n'
)


@cache
def _identity() -> TeacherIdentity:
    return TeacherIdentity(
        served_model_id="qwen3-8b",
        base_model_sha256="a3" * 32,
        tokenizer_vocab_sha256="b4" * 32,
        tokenizer_config_sha256="c5" * 32,
        adapter=None,
        vocab_size=151_936,
        max_top_k=20,
        max_model_len=32_768,
        max_prompt_logprob_candidates=688_128,
        implementation="vllm:0.32.0",
        inference_config_sha256="d6" * 32,
    )


def _entry() -> dict[str, Any]:
    identity = _identity()
    return {
        "spec": {
            "alias": ALIAS, "kind": "remote", "provider": "vllm", "model_id": "qwen3-8b",
            "max_top_k": 20, "vocab_size": 151_936, "supports_full_vocab": False,
            "tokenizer_hash": identity.tokenizer_vocab_sha256, "identity": identity.to_dict(),
            "url": "http://127.0.0.1:8000", "notes": "eval teacher", "adapter": None,
        },
        "capabilities": {
            "teacher_id": ALIAS, "vocab_size": 151_936, "max_top_k": 20,
            "supports_full_vocab": False, "supports_batched": True,
            "tokenizer_hash": identity.tokenizer_vocab_sha256,
        },
        "status": "verified",
        "usable": True,
        "identity_revision": identity.revision(),
        "off_policy_manifest": off_policy_manifest(identity),
    }  # fmt: skip


def _attempt(purpose: str, k: int, status: int) -> dict[str, Any]:
    identity = _identity()
    passed = status == 200
    return {
        "purpose": purpose, "k": k, "prompt_len": 4, "status_code": status,
        "elapsed_ms": 41.7, "bytes_read": 2_315 if passed else 187,
        "fingerprint": identity.fingerprint() if passed else None,
        "identity_digest": identity.digest() if passed else None,
        "row_widths": {"min": 1, "max": k + 1} if passed else None,
        "candidate_count": 4 * (k + 1) if passed else None,
    }  # fmt: skip


def _report() -> dict[str, Any]:
    identity = _identity()
    return {
        "url": "http://127.0.0.1:8000", "model_id": "qwen3-8b", "authenticated": False,
        "k_values": [1, 20, 21],
        "attempts": [_attempt("discover", 1, 200), _attempt("max_top_k", 20, 200),
                     _attempt("cap", 21, 400)],
        "outcome": "passed", "fingerprint": identity.fingerprint(),
        "identity_digest": identity.digest(), "failure": None, "elapsed_ms": 131.2,
    }  # fmt: skip


def _job() -> dict[str, Any]:
    return {
        "id": JOB_ID, "kind": "teacher_scoring", "status": "succeeded", "teacher": ALIAS,
        "identity_revision": _identity().revision(), "top_k": 8,
        "source": {"kind": "inline", "path": None, "sha256": None},
        "device": "cuda:0", "attempts": 1, "cancel_requested": False,
        "progress": {"total": 2, "done": 2, "scored": 1, "cache_hits": 1, "requests": 1,
                     "retries": 0},
        "timestamps": {
            "created_at": CREATED, "claimed_at": "2026-12-01T16:20:05.140Z",
            "spec_checked_at": "2026-12-01T16:20:05.141Z",
            "probed_at": "2026-12-01T16:20:05.402Z", "leased_at": "2026-12-01T16:20:05.403Z",
            "scoring_started_at": "2026-12-01T16:20:05.404Z",
            "finished_at": "2026-12-01T16:20:05.911Z", "updated_at": "2026-12-01T16:20:05.911Z",
        },
        "error": None,
        "result": {"bytes": 2_048, "sha256": "e7" * 32},
    }  # fmt: skip


@cache
def body_examples() -> dict[str, Any]:
    """Component schema name -> an example body of that schema."""
    entry, report, job = _entry(), _report(), _job()
    return {
        "RegisterTeacherRequest": {"alias": ALIAS, "kind": "remote", "provider": "vllm",
                                   "model_id": "qwen3-8b", "url": "http://127.0.0.1:8000"},
        "TeacherEntry": entry,
        "TeachersListResponse": {"teachers": [entry]},
        "DeleteTeacherResponse": {"status": "deleted", "alias": ALIAS},
        "ProbeReportPublic": report,
        "ReceiptsResponse": {"receipts": [{"id": 7, "alias": ALIAS, "created_at": CREATED,
                                           "outcome": "passed",
                                           "identity_revision": _identity().revision(),
                                           "report": report}]},
        "HealthResponse": {"status": "ok"},
        "ReadyResponse": {
            "status": "ready",
            "version": "0.1.0",
            "database_revision": "0012_ux2_worker_heartbeats",
            "teachers": 1,
            "workers": {"live": 1, "embedded": True, "queued": 0, "oldest_queued_age_s": None},
        },
        "JobCreate": {"kind": "teacher_scoring", "teacher": ALIAS, "top_k": 8,
                      "sequences": [[151644, 872, 198], [151644, 77091]]},
        "GenerationJobCreate": {"kind": "off_policy_generation", "teacher": ALIAS,
                                "max_tokens": 256, "top_k": 8,
                                "prompts": [{"id": "p-1", "messages": [
                                    {"role": "user", "content": "Explain LoRA in one line."}]}]},
        "JobPublic": job,
        "JobsListResponse": {"jobs": [job]},
        "DeleteJobResponse": {"status": "deleted", "id": JOB_ID},
        "KeysResponse": {"keys": [{"key_id": KEY_ID, "algorithm": "ed25519",
                                   "public_key": "3d4017c3e843895a92b70aa74d1b7ebc"
                                                 "9c982ccf2ec4968cc0cd55f12af4660c"}]},
        "AuditResponse": {"events": [{"id": 42, "at": CREATED, "token": "ci-runner",
                                      "action": "teacher.register", "target": ALIAS,
                                      "outcome": "ok", "status": 200}]},
        "ReleaseResponse": {"alias": ALIAS, "released": True},
    }  # fmt: skip


def error_example(code: str) -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": f"{code.replace('_', ' ')}: what was wrong, naming the field or rule",
            "hint": "what to do next",
        }
    }


@cache
def ndjson_example() -> str:
    """Three lines of a teacher-scoring corpus: the manifest, one row, the trailer."""
    identity = _identity()
    row = {
        "format": "kiln.teacher-scores.v1", "job_id": JOB_ID, "teacher": ALIAS,
        "identity_digest": identity.digest(), "top_k": 2, "id": "0",
        "token_ids_sha256": "f8" * 32, "token_ids": [151644, 872],
        "topk_ids": [[872, 198], [198, 77091]],
        "topk_logprobs": [[-0.25, -1.5], [-0.125, -2.25]], "token_logprobs": [-0.25],
    }  # fmt: skip
    trailer = {"kiln.corpus-trailer.v1": {"sha256": "a9" * 32, "key_id": KEY_ID,
                                          "signature": "0b" * 64}}  # fmt: skip
    lines = [off_policy_manifest(identity), *(json.dumps(v, separators=(",", ":"))
                                              for v in (row, trailer))]  # fmt: skip
    return "\n".join(lines) + "\n"
