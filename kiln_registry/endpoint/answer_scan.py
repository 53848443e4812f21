"""The cheap path of the answer check: every rows array scanned over the raw bytes.

``scan_envelope`` finds each choice's ``"prompt_logprobs":[`` array in document order and
checks it with ``probe.candidate_scan.check_rows_array`` (vectorized numpy over the
bytes: no Python object per row or candidate; ``probe.parse.parse_rows``'s rules, each
logprob checked but not converted, no repeated id in a row).  The arrays are then cut
out and each replaced by one float literal (``CUT_TEXT``), and the small rest, the
envelope, is parsed by the strict parser,
whose float hook turns the i-th literal into the i-th ``ScannedRows`` marker.  The answer
check then walks the envelope as it walks a whole answer, and ``rows_at_marker`` accepts a
choice's rows only where they are a marker, used once, scanned for exactly that choice's
prompt length.  So every byte of the answer is checked: the arrays by the scan, the rest
by the strict parser, and the cuts are exactly the choices' ``prompt_logprobs`` values.

Anything this path cannot decide (another layout, a text prompt, a cut that is not a
choice's rows, a literal already in the envelope, any broken rule) is
``FastPathDeferred``: the caller checks the whole answer the slower way, which accepts or
refuses with its own rule.  This path never refuses on its own.

Imports ``probe.candidate_scan``, ``probe.parse`` and the endpoint's admission types; pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.endpoint.admission import Admitted, Pin
from kiln_registry.probe.candidate_scan import FastPathDeferred, check_rows_array
from kiln_registry.probe.parse import strict_loads

ARRAY_KEY: Final = b'"prompt_logprobs":['
CUT_TEXT: Final = "-0.0e-7777777"


@dataclass(eq=False, slots=True)
class ScannedRows:
    """Stands in the envelope for one scanned rows array of ``prompt_len`` entries."""

    prompt_len: int
    used: bool = False


@dataclass(frozen=True, slots=True)
class Scanned:
    """An answer checked on this path: ``envelope`` holds ``CUT_TEXT`` where ``body`` holds
    each rows array, ``spans`` the arrays' places in ``body`` (document order)."""

    envelope: bytes
    spans: tuple[tuple[int, int], ...]
    tree: object


def scan_envelope(body: bytes, admitted: Admitted, pin: Pin) -> Scanned:
    """The answer's envelope, each rows array scanned and cut out (see the module).

    ``tree`` is the envelope parsed strictly, each cut a ``ScannedRows`` marker.
    """
    k = admitted.prompt_logprobs
    if k is None or any(prompt is None for prompt in admitted.prompts):
        raise FastPathDeferred
    lengths = [len(prompt) for prompt in admitted.prompts if prompt is not None]
    pieces: list[bytes] = []
    markers: list[ScannedRows] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    for index in range(admitted.choices):  # bounded by the admitted prompts times n
        at = body.find(ARRAY_KEY, pos)
        if at < 0:
            raise FastPathDeferred
        start = at + len(ARRAY_KEY) - 1
        prompt_len = lengths[index // admitted.n]
        end = check_rows_array(body, start, prompt_len, k, pin.vocab_size, pin.max_candidates)
        pieces += [body[pos:start], CUT_TEXT.encode()]
        markers.append(ScannedRows(prompt_len))
        spans.append((start, end))
        pos = end
    pieces.append(body[pos:])
    envelope = b"".join(pieces)
    if envelope.count(CUT_TEXT.encode()) != len(markers):
        raise FastPathDeferred
    return Scanned(envelope, tuple(spans), _parse_envelope(envelope, markers))


def _parse_envelope(envelope: bytes, markers: list[ScannedRows]) -> object:
    pending = iter(markers)

    def marker_or_float(text: str) -> object:
        if text != CUT_TEXT:
            return float(text)
        return next(pending, None)

    try:
        return strict_loads(envelope, what="the teacher's answer", parse_float=marker_or_float)
    except ProbeFailed as exc:
        raise FastPathDeferred from exc


def rows_at_marker(entries: object, *, expected_prompt_len: int, **_: int) -> None:
    """A choice's rows on this path: its own marker, used once, scanned for its length."""
    if (
        type(entries) is not ScannedRows
        or entries.used
        or entries.prompt_len != expected_prompt_len
    ):
        raise FastPathDeferred
    entries.used = True
