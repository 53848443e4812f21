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
Comparisons use the float64 numbers where rounding to float32 changed any
(``PromptLogprobColumns.sources``), as Kiln does.  Row checks are vectorized
with numpy over zero-copy views of the parser's columns, so a 1M-candidate
response stays within a few tens of MB.

Student/identity disagreements raise ``IdentityMismatch`` (409); every other
failure raises ``ProbeFailed`` with ``rule="probe.<name>"``.  Imports: numpy,
``kiln_registry.domain.errors``, ``kiln_registry.identity``, ``probe.parse`` and
``probe.candidate_scan`` (its duplicate finder); no sockets or httpx.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kiln_registry.domain.errors import FingerprintError, IdentityMismatch
from kiln_registry.identity.diff import mismatch_detail
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.probe.candidate_scan import first_duplicate
from kiln_registry.probe.parse import (
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


def _check_duplicates(ids: I32, offsets: IntArray) -> None:
    found = first_duplicate(ids, offsets)
    if found is not None:
        fail("duplicate_id", f"prompt_logprobs[{found[0] + 1}] repeats token id {found[1]}")


@dataclass(frozen=True, slots=True, eq=False)
class _Rows:
    """The columns as numpy views, with the per-row facts the checks share."""

    ids: I32
    lps: F32
    ranks: I32
    values: npt.NDArray[np.floating]  # what Kiln compares: the float64 numbers (or exact f32)
    starts: IntArray
    widths: IntArray
    k: int


def _observed(rows: _Rows, prompt: IntArray) -> IntArray:
    """The index of each row's observed prompt token, which may sit anywhere in its row."""
    target = prompt[1:]
    if np.array_equal(rows.ids[rows.starts], target):  # vLLM lists it first
        return rows.starts
    hit = rows.ids == np.repeat(target.astype(np.int32), rows.widths)
    missing = np.add.reduceat(hit, rows.starts) == 0  # ids are distinct: 0 or 1 per row
    if np.any(missing):
        row = _first_bad(missing)
        fail(
            "actual_missing",
            f"prompt_logprobs[{row + 1}] does not contain the observed token {target[row]}",
        )
    return np.flatnonzero(hit)


def _check_widths(rows: _Rows, observed_rank: I32) -> npt.NDArray[np.bool_]:
    """K entries (observed token selected) or K+1 (extra); return selected-per-row."""
    k, widths = rows.k, rows.widths
    bad = (widths != k) & (widths != k + 1)
    if np.any(bad):
        row = _first_bad(bad)
        fail(
            "row_width",
            f"prompt_logprobs[{row + 1}] has {widths[row]} entries; K={k} needs K (observed"
            f" token selected) or K+1 (observed token extra)",
        )
    selected: npt.NDArray[np.bool_] = widths == k
    wrong = selected & (observed_rank > k)
    if np.any(wrong):
        row = _first_bad(wrong)
        fail(
            "actual_rank",
            f"prompt_logprobs[{row + 1}] has K={k} entries but the observed token's rank"
            f" {observed_rank[row]} is outside the top K (it needs K+1 entries)",
        )
    return selected


def _topk_slots(
    rows: _Rows, observed: IntArray, selected: npt.NDArray[np.bool_]
) -> tuple[IntArray, IntArray]:
    """(slot ``row * K + rank - 1``, index) of each top-K member; every slot filled once.

    Members are every candidate but an extra observed token; their ranks must
    be exactly 1..K in each row (as Kiln's by-rank map requires).
    """
    k, ranks = rows.k, rows.ranks
    member = np.ones(ranks.size, dtype=bool)
    member[observed[~selected]] = False
    outside = member & (ranks > k)
    if np.any(outside):
        at = _first_bad(outside)
        row = int(np.searchsorted(rows.starts, at, side="right")) - 1
        fail(
            "topk_ranks",
            f"prompt_logprobs[{row + 1}] lists token {rows.ids[at]} with rank {ranks[at]}"
            f" outside the top {k}, and it is not the observed token",
        )
    row_of = np.repeat(np.arange(rows.starts.size, dtype=np.int64), rows.widths)
    members: IntArray = np.flatnonzero(member)
    slots: IntArray = row_of[members] * k + ranks[members] - 1
    del row_of, member
    repeated = np.bincount(slots, minlength=rows.starts.size * k) != 1
    if np.any(repeated):
        row = _first_bad(repeated) // k
        fail("topk_ranks", f"prompt_logprobs[{row + 1}] top-K ranks are not exactly 1..{k}")
    return slots, members


def _scatter(
    values: npt.NDArray[np.generic], slots: IntArray, keep: IntArray, shape: int
) -> np.ndarray:
    out = np.empty(shape, dtype=values.dtype)
    out[slots] = values[keep]
    return out


def _check_order(rows: _Rows, matrix: npt.NDArray[np.floating]) -> None:
    increasing = matrix[:, 1:] > matrix[:, :-1]
    if np.any(increasing):
        row = _first_bad(increasing.any(axis=1))
        fail("topk_order", f"prompt_logprobs[{row + 1}] top-K logprobs increase with rank")


def _check_extra(
    rows: _Rows,
    matrix: npt.NDArray[np.floating],
    observed: IntArray,
    selected: npt.NDArray[np.bool_],
) -> None:
    """An extra observed token ranked inside the top K must tie that rank; else not exceed K-th."""
    k = rows.k
    extra = np.flatnonzero(~selected)
    rank = rows.ranks[observed[extra]].astype(np.int64)
    value = rows.values[observed[extra]]
    inside = rank <= k
    at_rank = matrix[extra, np.minimum(rank, k) - 1]
    untied = inside & (value != at_rank)
    if np.any(untied):
        i = _first_bad(untied)
        fail(
            "actual_tie",
            f"prompt_logprobs[{extra[i] + 1}] has K+1 entries and the observed token's rank"
            f" {rank[i]} is inside the top K, but its logprob does not tie rank {rank[i]}'s",
        )
    above = ~inside & (value > at_rank)
    if np.any(above):
        i = _first_bad(above)
        fail(
            "actual_rank_inconsistent",
            f"prompt_logprobs[{extra[i] + 1}] ranks the observed token below K but its logprob"
            " exceeds the K-th logprob",
        )


def _check_mass(rows: _Rows, top_lps: F32 | None) -> None:
    """Each row's mass on Kiln's numbers, and the top-K's float32 mass when rounding changed any."""
    if not rows.starts.size:
        return
    mass = np.add.reduceat(np.exp(rows.values, dtype=np.float64), rows.starts)
    if top_lps is not None:
        mass = np.maximum(mass, np.exp(top_lps, dtype=np.float64).sum(axis=1))
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
    if not rows.distinct_ids:
        _check_duplicates(ids, offsets)
    exact = rows.sources is None
    values = lps if exact else np.frombuffer(rows.sources, dtype=np.float64)  # type: ignore[arg-type]
    view = _Rows(ids, lps, ranks, values, starts, widths, k)
    observed = _observed(view, np.asarray(prompt, dtype=np.int64))
    selected = _check_widths(view, ranks[observed])
    slots, keep_at = _topk_slots(view, observed, selected)
    shape = (starts.size, k)
    top_ids = _scatter(ids, slots, keep_at, shape[0] * k).reshape(shape)
    top_lps = _scatter(lps, slots, keep_at, shape[0] * k).reshape(shape)
    matrix = top_lps if exact else _scatter(values, slots, keep_at, shape[0] * k).reshape(shape)
    del slots, keep_at
    _check_order(view, matrix)
    _check_extra(view, matrix, observed, selected)
    _check_mass(view, None if exact else top_lps)
    return ids[observed], lps[observed], ranks[observed], top_ids, top_lps


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
