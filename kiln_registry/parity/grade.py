"""Grading of a parity run: compare two teachers' verified rows, position by position.

Pure numpy over ``RowsCheck`` matrices; no network.  A row's difference is a
lower bound that ties cannot inflate (see ``kiln_registry.parity.run``).  Imports
numpy and ``kiln_registry.probe.verify`` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kiln_registry.probe.verify import RowsCheck

POSITION_CLASSES: tuple[str, ...] = ("first", "interior", "final")
SHOWN_IDS = 5

FloatArray = npt.NDArray[np.float64]


def _cross(
    ids: npt.NDArray[np.int32], lps: FloatArray, o_ids: npt.NDArray[np.int32], o_lps: FloatArray
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Per top-K entry of one side: its difference lower bound and whether the other lists it."""
    rows, k = ids.shape
    base = np.arange(rows, dtype=np.int64)[:, None] << 32
    keys = (base + ids).ravel()
    o_keys = (base + o_ids).ravel()
    order = np.argsort(o_keys, kind="stable")
    sorted_keys = o_keys[order]
    at = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    found = sorted_keys[at] == keys
    matched = o_lps.ravel()[order][at]
    kth = np.repeat(o_lps[:, k - 1], k)
    diff = np.where(found, np.abs(lps.ravel() - matched), np.maximum(0.0, lps.ravel() - kth))
    return diff.reshape(rows, k), found.reshape(rows, k)


@dataclass(frozen=True, slots=True)
class RowComparison:
    """Per-row results of one prompt (row r is position r + 1)."""

    max_diff: FloatArray
    overlap: FloatArray
    identical: npt.NDArray[np.bool_]


def compare_rows(a: RowsCheck, b: RowsCheck) -> RowComparison:
    """Compare two verified responses to the same prompt and K."""
    a_lps = a.topk_logprobs.astype(np.float64)
    b_lps = b.topk_logprobs.astype(np.float64)
    diff_a, found = _cross(a.topk_ids, a_lps, b.topk_ids, b_lps)
    diff_b, _ = _cross(b.topk_ids, b_lps, a.topk_ids, a_lps)
    actual = np.abs(a.actual_logprobs.astype(np.float64) - b.actual_logprobs.astype(np.float64))
    max_diff = np.maximum(np.maximum(diff_a.max(axis=1), diff_b.max(axis=1)), actual)
    identical = (
        np.all(a.topk_ids == b.topk_ids, axis=1)
        & np.all(a.topk_logprobs == b.topk_logprobs, axis=1)
        & (a.actual_logprobs == b.actual_logprobs)
        & (a.actual_ranks == b.actual_ranks)
    )
    return RowComparison(max_diff, found.mean(axis=1), identical)


def position_class(position: int, prompt_len: int) -> str:
    if position == 1:
        return "first"
    return "final" if position == prompt_len - 1 else "interior"


def _classes(rows: int, prompt_len: int) -> npt.NDArray[np.int64]:
    """Index into POSITION_CLASSES of each row (row r is position r + 1)."""
    positions = np.arange(1, rows + 1)
    return np.where(positions == 1, 0, np.where(positions == prompt_len - 1, 2, 1))


@dataclass(slots=True)
class _ClassStats:
    rows: int = 0
    identical_rows: int = 0
    max_abs_diff: float = 0.0
    min_topk_overlap: float = 1.0
    overlap_sum: float = 0.0

    def add(self, cmp: RowComparison, mask: npt.NDArray[np.bool_]) -> None:
        if not mask.any():
            return
        self.rows += int(mask.sum())
        self.identical_rows += int(cmp.identical[mask].sum())
        self.max_abs_diff = max(self.max_abs_diff, float(cmp.max_diff[mask].max()))
        self.min_topk_overlap = min(self.min_topk_overlap, float(cmp.overlap[mask].min()))
        self.overlap_sum += float(cmp.overlap[mask].sum())

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "overlap_sum"}


def _first_row(
    a: RowsCheck, b: RowsCheck, cmp: RowComparison, prompt: int, mask: npt.NDArray[np.bool_]
) -> dict[str, Any] | None:
    """The first row of ``mask``, described for the report; None when the mask is empty."""
    hits = np.flatnonzero(mask)
    if not hits.size:
        return None
    row = int(hits[0])
    return {
        "prompt": prompt,
        "position": row + 1,
        "class": position_class(row + 1, a.prompt_len),
        "token_id": int(a.actual_ids[row]),
        "max_abs_diff": float(cmp.max_diff[row]),
        "topk_overlap": float(cmp.overlap[row]),
        "a_top_ids": [int(x) for x in a.topk_ids[row, :SHOWN_IDS]],
        "b_top_ids": [int(x) for x in b.topk_ids[row, :SHOWN_IDS]],
        "a_logprob": float(a.actual_logprobs[row]),
        "b_logprob": float(b.actual_logprobs[row]),
    }


def _earliest(found: dict[str, Any] | None, other: dict[str, Any] | None) -> dict[str, Any] | None:
    """The lower position (then the lower prompt index) of two row descriptions."""
    if found is None or other is None:
        return found or other
    return min(found, other, key=lambda d: (d["position"], d["prompt"]))


class Grader:
    """Accumulates the comparison of each prompt (kept small: no rows are retained)."""

    def __init__(self, positions: Sequence[str], atol: float) -> None:
        self.atol = atol
        self.stats = {c: _ClassStats() for c in positions}
        self.wanted = [POSITION_CLASSES.index(c) for c in positions]
        self.first_difference: dict[str, Any] | None = None
        self.first_divergence: dict[str, Any] | None = None

    def add(self, index: int, a: RowsCheck, b: RowsCheck) -> None:
        cmp = compare_rows(a, b)
        classes = _classes(a.row_count, a.prompt_len)
        for name, s in self.stats.items():
            s.add(cmp, classes == POSITION_CLASSES.index(name))
        chosen = np.isin(classes, self.wanted)
        differs = _first_row(a, b, cmp, index, chosen & ~cmp.identical)
        self.first_difference = _earliest(self.first_difference, differs)
        diverges = _first_row(a, b, cmp, index, chosen & (cmp.max_diff > self.atol))
        self.first_divergence = _earliest(self.first_divergence, diverges)

    def result(self) -> dict[str, Any]:
        stats = self.stats.values()
        rows = sum(s.rows for s in stats)
        identical = sum(s.identical_rows for s in stats)
        verdict = "mismatch" if self.first_divergence else "within_tolerance"
        return {
            "grade": "identical" if identical == rows else verdict,
            "compared_rows": rows,
            "identical_rows": identical,
            "max_abs_diff": max(s.max_abs_diff for s in stats),
            "min_topk_overlap": min(s.min_topk_overlap for s in stats),
            "mean_topk_overlap": sum(s.overlap_sum for s in stats) / max(rows, 1),
            "by_position": {name: s.public() for name, s in self.stats.items()},
            "first_difference": self.first_difference,
            "first_divergence": self.first_divergence,
        }


def grade(
    pairs: Sequence[tuple[RowsCheck, RowsCheck]], positions: Sequence[str], atol: float
) -> dict[str, Any]:
    """The graded part of the report for the rows whose position class was asked for."""
    grader = Grader(positions, atol)
    for index, (a, b) in enumerate(pairs):
        grader.add(index, a, b)
    return grader.result()
