"""Semantic validation of a parsed prompt-logprobs completion against an identity.

Owns every rule that relates a ``ParsedCompletion`` to the request, the teacher
identity carried in ``system_fingerprint``, an optionally pinned identity and
the loaded student: canonical Kiln fingerprint (stock ``vllm-*`` refused),
``object``, request/response/served model ids (closing the LoRA base-alias
bypass), ``usage.prompt_tokens``, the single choice, the observed token first
in every row, the K / K+1 rank structure, non-increasing top-K logprobs, the
observed token's rank against the top-K, probability mass and the candidate
budget.  Row checks are vectorized with numpy over zero-copy views of the
parser's columns, in int32/float32 where that is exact, so a 1M-candidate
response stays within a few tens of MB.

Student/identity disagreements raise ``IdentityMismatch`` (409); every other
failure raises ``ProbeFailed`` with ``rule="probe.<name>"``.  Imports: numpy,
``kiln_registry.errors``, ``kiln_registry.identity``, ``probe.parse`` and
``probe.fastscan`` (its duplicate finder); no sockets or httpx.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kiln_registry.errors import FingerprintError, IdentityMismatch
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.probe.fastscan import first_duplicate
from kiln_registry.probe.parse import (
    NEG_INF_SENTINEL,
    ParsedCompletion,
    PromptLogprobColumns,
    fail,
    shown,
)

MASS_TOLERANCE = 32.0 * float(np.finfo(np.float32).eps)
STOCK_PREFIX = "vllm-"

IntArray = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class StudentView:
    """What the loaded student says about its numeric vocabulary."""

    tokenizer_vocab_sha256: str
    model_width: int


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


def _columns(rows: PromptLogprobColumns) -> tuple[I32, F32, I32, IntArray]:
    """Zero-copy views of the parser's columns (``'i'``/``'f'`` are 4 bytes, ``'q'`` 8)."""
    ids = np.frombuffer(rows.ids, dtype=np.int32)
    lps = np.frombuffer(rows.logprobs, dtype=np.float32)
    ranks = np.frombuffer(rows.ranks, dtype=np.int32)
    offsets = np.frombuffer(rows.offsets, dtype=np.int64)
    return ids, lps, ranks, offsets


def _first_bad(mask: npt.ArrayLike) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_values(ids: I32, lps: F32, ranks: I32, vocab: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        fail("token_id_range", f"a token id is not below vocab_size {vocab}")
    if ranks.size and (ranks.min() < 1 or ranks.max() > vocab):
        fail("rank_range", f"a rank is outside 1..={vocab}")
    if lps.size and (not np.all(np.isfinite(lps)) or lps.max() > 0.0):
        fail("logprob_positive", "a logprob is positive or not finite")


def _check_actual(ids: I32, starts: IntArray, widths: IntArray, prompt: IntArray) -> None:
    first = ids[starts]
    bad = first != prompt[1:]
    if np.any(bad):
        row = _first_bad(bad)
        row_ids = ids[starts[row] : starts[row] + widths[row]]
        where = f"prompt_logprobs[{row + 1}]"
        if np.any(row_ids == prompt[row + 1]):
            fail(
                "actual_not_first",
                f"{where} lists the prompt token {prompt[row + 1]} but not first",
            )
        fail("actual_missing", f"{where} lacks the prompt token {prompt[row + 1]}")


def _check_duplicates(ids: I32, offsets: IntArray) -> None:
    found = first_duplicate(ids, offsets)
    if found is not None:
        fail("duplicate_id", f"prompt_logprobs[{found[0] + 1}] repeats token id {found[1]}")


def _rank_layout(
    ranks: I32, widths: IntArray, starts: IntArray, row_of: I32, k: int
) -> tuple[npt.NDArray[np.bool_], IntArray]:
    """Check the K / K+1 structure; return (inside-per-row, top-K slot per candidate or -1)."""
    if np.any((widths != k) & (widths != k + 1)):
        row = _first_bad((widths != k) & (widths != k + 1))
        fail(
            "row_width",
            f"prompt_logprobs[{row + 1}] has {widths[row]} entries; K={k} needs K or K+1",
        )
    inside = widths == k
    actual_rank = ranks[starts]
    wrong = np.where(inside, actual_rank > k, actual_rank <= k)
    if np.any(wrong):
        row = _first_bad(wrong)
        fail(
            "actual_rank",
            f"prompt_logprobs[{row + 1}] has {widths[row]} entries but the prompt token's rank is"
            f" {actual_rank[row]} (K={k}: K entries need rank <= K, K+1 entries rank > K)",
        )
    pos = np.arange(ranks.size, dtype=np.int32) - starts.astype(np.int32)[row_of]
    expected = pos + (inside[row_of] & (pos >= actual_rank[row_of]))
    bad = (pos >= 1) & (ranks != expected)
    del expected
    if np.any(bad):
        at = _first_bad(bad)
        fail("topk_ranks", f"prompt_logprobs[{row_of[at] + 1}] top-K ranks are not exactly 1..{k}")
    in_topk = (pos >= 1) | inside[row_of]
    del pos
    slots = row_of.astype(np.int64) * k + ranks - 1
    slots[~in_topk] = -1
    return inside, slots


def _check_order(
    lps: F32, ids: I32, slots: IntArray, inside: npt.NDArray[np.bool_], starts: IntArray, k: int
) -> tuple[npt.NDArray[np.int32], F32]:
    rows = starts.size
    top_lp = np.full(rows * k, NEG_INF_SENTINEL, dtype=np.float32)
    top_id = np.zeros(rows * k, dtype=np.int32)
    keep = slots >= 0
    top_lp[slots[keep]] = lps[keep]
    top_id[slots[keep]] = ids[keep]
    matrix = top_lp.reshape(rows, k)
    increasing = matrix[:, 1:] > matrix[:, :-1]
    if np.any(increasing):
        row = _first_bad(increasing.any(axis=1))
        fail("topk_order", f"prompt_logprobs[{row + 1}] top-K logprobs increase with rank")
    outside = ~inside
    above = outside & (lps[starts] > matrix[:, k - 1])
    if np.any(above):
        row = _first_bad(above)
        fail(
            "actual_rank_inconsistent",
            f"prompt_logprobs[{row + 1}] ranks the prompt token below K but its logprob"
            " exceeds the K-th logprob",
        )
    return top_id.reshape(rows, k), matrix


def _check_mass(lps: F32, starts: IntArray) -> None:
    if not starts.size:
        return
    mass = np.add.reduceat(np.exp(lps, dtype=np.float64), starts)
    over = mass > 1.0 + MASS_TOLERANCE
    if np.any(over):
        row = _first_bad(over)
        fail(
            "probability_mass",
            f"prompt_logprobs[{row + 1}] probabilities sum to {mass[row]:.9f} > 1",
        )


def verify_rows(
    rows: PromptLogprobColumns, *, prompt: Sequence[int], k: int, identity: TeacherIdentity
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Check every row rule; return actual ids/logprobs/ranks and the top-K matrices."""
    if rows.candidate_count > identity.max_prompt_logprob_candidates:
        fail("candidate_budget", f"{rows.candidate_count} candidates exceed the identity's budget")
    ids, lps, ranks, offsets = _columns(rows)
    starts, widths = offsets[:-1], np.diff(offsets)
    if np.any(widths < 1):
        fail("row_width", "a prompt_logprobs row is empty")
    _check_values(ids, lps, ranks, identity.vocab_size)
    _check_actual(ids, starts, widths, np.asarray(prompt, dtype=np.int64))
    _check_duplicates(ids, offsets)
    row_of = np.repeat(np.arange(starts.size, dtype=np.int32), widths)
    inside, slots = _rank_layout(ranks, widths, starts, row_of, k)
    del row_of
    top_ids, top_lps = _check_order(lps, ids, slots, inside, starts, k)
    del slots
    _check_mass(lps, starts)
    return ids[starts].copy(), lps[starts].copy(), ranks[starts].copy(), top_ids, top_lps


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
    if seen.fingerprint() != identity.fingerprint():
        fail("fingerprint_changed", "system_fingerprint differs from the teacher's identity")
    if pinned is not None and seen.fingerprint() != pinned.fingerprint():
        fail(
            "fingerprint_pinned",
            f"system_fingerprint identity {seen.revision()} is not the pinned {pinned.revision()}",
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
