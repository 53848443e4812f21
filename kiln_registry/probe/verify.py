"""Semantic validation of a parsed prompt-logprobs completion against an identity.

Owns every rule that relates a ``ParsedCompletion`` to the request, the teacher
identity carried in ``system_fingerprint``, an optionally pinned identity and
the loaded student: canonical Kiln fingerprint (stock ``vllm-*`` refused),
``object``, request/response/served model ids (closing the LoRA base-alias
bypass), ``usage.prompt_tokens``, the single choice, and each row as Kiln's
``remote_teacher.rs`` reads it: a map in which the observed token may sit
anywhere; K entries (observed token selected, rank <= K) or K+1 (observed token
extra); the other tokens ranked exactly 1..K with non-increasing logprobs; an
extra observed token ranked inside the top K must tie that rank's logprob, one
ranked below must not exceed the K-th; probability mass <= 1 (all candidates on
the JSON numbers, and the top-K on their float32 values); the candidate budget.
The row rules themselves are ``probe.row_checks.verify_rows`` (vectorized
over the parser's columns).

Student/identity disagreements raise ``IdentityMismatch`` (409); every other
failure raises ``ProbeFailed`` with ``rule="probe.<name>"``.  Imports: numpy,
``kiln_registry.domain.errors``, ``kiln_registry.identity``, ``probe.parse`` and
``probe.row_checks``; no sockets or httpx.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kiln_registry.domain.errors import FingerprintError, IdentityMismatch
from kiln_registry.identity.diff import mismatch_detail
from kiln_registry.identity.document import TeacherIdentity, same_identity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.probe.parse import ParsedCompletion, fail, shown
from kiln_registry.probe.row_checks import verify_rows

STOCK_PREFIX = "vllm-"


@dataclass(frozen=True, slots=True)
class StudentView:
    """What the loaded student says about its numeric vocabulary."""

    tokenizer_vocab_sha256: str
    model_width: int
    tokenizer_size: int | None = None  # with added tokens; None where only the width is known


@dataclass(frozen=True, slots=True, eq=False)
class RowsCheck:
    """A verified response: its identity and its rows as top-K matrices.

    ``topk_ids``/``topk_logprobs`` are ``(rows, k)`` in rank order 1..k;
    ``actual_*`` describe the observed prompt token of each row.
    """

    identity: TeacherIdentity
    fingerprint: str
    k: int
    prompt_len: int
    row_count: int
    candidate_count: int
    min_row_width: int
    max_row_width: int
    actual_ids: npt.NDArray[np.int32]
    actual_logprobs: npt.NDArray[np.float32]
    actual_ranks: npt.NDArray[np.int32]
    topk_ids: npt.NDArray[np.int32]
    topk_logprobs: npt.NDArray[np.float32]


def identity_from_fingerprint(text: str | None) -> TeacherIdentity:
    """The identity of a response fingerprint; stock and non-canonical values refused."""
    if text is None:
        fail("fingerprint_missing", "response has no system_fingerprint")
    if text.startswith(STOCK_PREFIX):
        fail(
            "fingerprint_stock",
            f"system_fingerprint {shown(text, 60)!r} is vLLM's stock value,"
            " not a Kiln teacher fingerprint (launch with --fingerprint-mode=custom)",
        )
    return _verified_identity(text)


@functools.lru_cache(maxsize=64)
def _verified_identity(text: str) -> TeacherIdentity:
    """Memoized: a fingerprint string that verified once verifies again (refusals are not kept)."""
    try:
        identity = verify_fingerprint(text)
    except FingerprintError as exc:
        # The verifier's message may quote decoded identity values: response text.
        detail = str(exc) if shown("") == "" else f"{exc.rule}: {shown(str(exc))}"
        fail("fingerprint", f"system_fingerprint is not a valid Kiln fingerprint ({detail})")
    if identity.fingerprint() != text:
        fail("fingerprint_noncanonical", "system_fingerprint is not in canonical form")
    return identity


def check_student(identity: TeacherIdentity, student: StudentView) -> None:
    if identity.tokenizer_vocab_sha256 != student.tokenizer_vocab_sha256:
        raise IdentityMismatch(
            f"teacher tokenizer_vocab_sha256 {identity.tokenizer_vocab_sha256} differs from the"
            f" student's {student.tokenizer_vocab_sha256}",
            rule="probe.student_vocab",
        )
    if identity.vocab_size != student.model_width:
        raise IdentityMismatch(
            f"teacher vocab_size {identity.vocab_size} differs from the student's model width"
            f" {student.model_width}",
            rule="probe.student_width",
        )
    if student.tokenizer_size is not None and identity.vocab_size != student.tokenizer_size:
        # Kiln (api/teachers.rs) requires vocab_size to equal the model width AND the
        # loaded tokenizer's size (added tokens included).
        raise IdentityMismatch(
            f"teacher vocab_size {identity.vocab_size} must match both the student's"
            f" tokenizer ({student.tokenizer_size}) and model width ({student.model_width})",
            rule="probe.student_tokenizer_size",
        )


def _check_envelope(
    parsed: ParsedCompletion, request_model: str, prompt_len: int, identity: TeacherIdentity
) -> None:
    if parsed.object != "text_completion":
        fail("object", f"response object is {shown(parsed.object, 60)!r}")
    served = identity.served_model_id
    if not request_model == parsed.model == served:
        fail(
            "model",
            f"request model {shown(request_model, 80)!r}, response model"
            f" {shown(parsed.model, 80)!r} and served_model_id"
            f" {shown(served, 80)!r} must all be equal",
        )
    if parsed.prompt_tokens != prompt_len:
        fail("usage", f"usage.prompt_tokens is {parsed.prompt_tokens}, sent {prompt_len} tokens")
    if parsed.choice_count != 1:
        fail("choice_count", f"response has {parsed.choice_count} choices, expected one")
    if parsed.choice_index != 0:
        fail("choice_index", f"choices[0].index is {parsed.choice_index}, expected 0")
    if parsed.rows.row_count != prompt_len - 1:
        fail("prompt_logprobs_length", f"{parsed.rows.row_count} rows for {prompt_len} tokens")


def verify_completion(
    parsed: ParsedCompletion,
    *,
    request_model: str,
    prompt: Sequence[int],
    k: int,
    identity: TeacherIdentity,
    pinned: TeacherIdentity | None,
    student: StudentView | None,
) -> RowsCheck:
    """Enforce every probe rule on ``parsed``; see the module docstring."""
    seen = identity_from_fingerprint(parsed.system_fingerprint)
    if not same_identity(seen, identity):
        fail("fingerprint_changed", "system_fingerprint differs from the teacher's identity")
    if pinned is not None and not same_identity(seen, pinned):
        fail(
            "fingerprint_pinned",
            f"system_fingerprint identity {seen.revision()} is not the pinned {pinned.revision()}"
            f"; {mismatch_detail(pinned, seen)}",
        )
    if student is not None:
        check_student(identity, student)
    if not 1 <= k <= identity.max_top_k:
        fail("k_range", f"K={k} is outside 1..={identity.max_top_k}")
    _check_envelope(parsed, request_model, len(prompt), identity)
    a_ids, a_lps, a_ranks, top_ids, top_lps = verify_rows(
        parsed.rows, prompt=prompt, k=k, identity=identity
    )
    widths = np.diff(np.frombuffer(parsed.rows.offsets, dtype=np.int64))
    return RowsCheck(
        identity=identity,
        fingerprint=seen.fingerprint(),
        k=k,
        prompt_len=len(prompt),
        row_count=parsed.rows.row_count,
        candidate_count=parsed.rows.candidate_count,
        min_row_width=int(widths.min()) if widths.size else 0,
        max_row_width=int(widths.max()) if widths.size else 0,
        actual_ids=a_ids,
        actual_logprobs=a_lps,
        actual_ranks=a_ranks,
        topk_ids=top_ids,
        topk_logprobs=top_lps,
    )
