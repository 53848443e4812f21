"""The per-row rules of a prompt-logprobs response, vectorized with numpy.

Owns ``verify_rows``: each row as Kiln's ``remote_teacher.rs`` reads it -- a
map in which the observed token may sit anywhere; K entries (observed token
selected, rank <= K) or K+1 (observed token extra); the other tokens ranked
exactly 1..K with non-increasing logprobs; an extra observed token ranked
inside the top K must tie that rank's logprob, one ranked below must not
exceed the K-th; probability mass <= 1 (all candidates on the JSON numbers,
and the top-K on their float32 values); ids below the vocabulary, no
repeated id, and the identity's candidate budget.  Comparisons use the
float64 numbers where rounding to float32 changed any
(``PromptLogprobColumns.sources``), as Kiln does.  The checks run over
zero-copy views of the parser's columns, so a 1M-candidate response stays
within a few tens of MB.  Failures raise ``ProbeFailed`` with
``rule="probe.<name>"``.

Imports numpy, ``kiln_registry.identity.document``, ``probe.parse`` and
``probe.candidate_scan`` (its duplicate finder); no sockets, httpx or database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.candidate_scan import first_duplicate
from kiln_registry.probe.parse import PromptLogprobColumns, fail

MASS_TOLERANCE = 32.0 * float(np.finfo(np.float32).eps)

IntArray = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F32 = npt.NDArray[np.float32]


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
