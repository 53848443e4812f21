"""The check every teacher answer passes before a byte of it is relayed.

An HTTP 200 body must be strict JSON (first ``endpoint.answer_scan``: the rows arrays
scanned over the bytes and the rest parsed strictly; where that path cannot decide,
``endpoint.fast_rows.fast_tree`` when orjson's tree is provably the strict one, else
``probe.parse.strict_loads``) that

* carries the pinned ``system_fingerprint`` exactly (else the rule is
  ``endpoint.fingerprint`` and the error type ``teacher_identity_changed``);
* names the pinned model and has exactly one choice per prompt times ``n``,
  indexed ``0..N-1``;
* for ``prompt_logprobs``: each choice's rows pass ``probe.parse.parse_rows``
  (the first entry null, one row per prompt token, at most K+1 candidates a
  row, the pin's candidate budget, ids below ``vocab_size``, logprobs and
  ranks as Kiln reads them); none when none were asked for;
* for ``logprobs``: at most ``max_tokens`` positions of at most K+1 finite
  logprobs <= 0; none when none were asked for.

A failure raises ``AnswerRefused`` (its rule, and whether the identity
changed).  Messages never quote the answer: a teacher behind a credential
could reflect the key.  Imports the standard library, ``probe.parse`` and
the endpoint's admission types; pure (no sockets).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.endpoint.admission import Admitted, Pin
from kiln_registry.endpoint.answer_scan import Scanned, rows_at_marker, scan_envelope
from kiln_registry.endpoint.fast_rows import KeyCount, check_rows_fast, envelope_keys, fast_tree
from kiln_registry.probe.candidate_scan import FastPathDeferred
from kiln_registry.probe.parse import check_logprob, parse_rows, strict_loads

RowsCheck = Callable[..., object]


class AnswerRefused(Exception):
    """A teacher answer that is never relayed; ``identity_changed`` for a new fingerprint."""

    def __init__(self, message: str, rule: str, *, identity_changed: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule
        self.identity_changed = identity_changed


def check_answer(body: bytes, admitted: Admitted, pin: Pin, fingerprint: str) -> Scanned | None:
    """Refuse ``body`` unless it is an answer of the pinned teacher to ``admitted``.

    Returns where the byte scan found the rows arrays, or None when another path checked it.
    """
    try:
        scanned = scan_envelope(body, admitted, pin)  # the rows scanned over the bytes
        _check_tree(scanned.tree, admitted, pin, fingerprint, rows_at_marker)
        return scanned
    except FastPathDeferred:
        pass  # the whole answer is checked below, which accepts or refuses with its rule
    try:
        fast = fast_tree(body)  # orjson, kept only when no object repeated a key
        if fast is not None:
            seen = KeyCount()
            _check_tree(fast[0], admitted, pin, fingerprint, partial(check_rows_fast, seen=seen))
            if envelope_keys(fast[0]) + seen.keys == fast[1]:
                return None
        top = strict_loads(body, what="the teacher's answer")
        _check_tree(top, admitted, pin, fingerprint, parse_rows)
        return None
    except ProbeFailed as exc:
        raise AnswerRefused(exc.message, exc.rule or "probe.shape") from None


def _check_tree(
    top: object, admitted: Admitted, pin: Pin, fingerprint: str, rows_check: RowsCheck
) -> None:
    _check_envelope(top, pin, fingerprint)
    assert isinstance(top, dict)
    for choice in _choices(top.get("choices"), admitted.choices):
        _check_choice(choice, admitted, pin, rows_check)


def _check_envelope(top: object, pin: Pin, fingerprint: str) -> None:
    if not isinstance(top, dict):
        raise AnswerRefused("the teacher's answer is not a JSON object", "endpoint.answer_shape")
    if top.get("system_fingerprint") != fingerprint:
        raise AnswerRefused(
            "the teacher answered with a system_fingerprint that is not the pinned one:"
            " the teacher behind this alias changed",
            "endpoint.fingerprint",
            identity_changed=True,
        )
    if top.get("model") != pin.served_model_id:
        raise AnswerRefused("the answer names another model", "endpoint.answer_model")


def _choices(value: object, expected: int) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) != expected:
        count = len(value) if isinstance(value, list) else "no"
        raise AnswerRefused(
            f"the answer has {count} choices, expected {expected} (one per prompt times n)",
            "endpoint.choice_count",
        )
    indices = []
    for choice in value:
        index = choice.get("index") if isinstance(choice, dict) else None
        if type(index) is not int:
            raise AnswerRefused("a choice has no integer index", "endpoint.choice_index")
        indices.append(index)
    if sorted(indices) != list(range(expected)):
        raise AnswerRefused("the choices' indices are not 0..N-1", "endpoint.choice_index")
    return value


def _check_choice(
    choice: dict[str, Any], admitted: Admitted, pin: Pin, rows_check: RowsCheck
) -> None:
    prompt = admitted.prompts[choice["index"] // admitted.n]
    rows = choice.get("prompt_logprobs")
    k = admitted.prompt_logprobs
    if k is None:
        if rows is not None:
            raise AnswerRefused("prompt_logprobs came unasked", "endpoint.prompt_logprobs")
    else:
        if prompt is None:  # a text prompt: the teacher tokenized it, within max_model_len
            expected = len(rows) if isinstance(rows, list) else 0
            if not 0 < expected <= pin.max_model_len:
                raise AnswerRefused("a text prompt's rows are out of bounds", "endpoint.rows")
        else:
            expected = len(prompt)
        rows_check(
            rows,
            expected_prompt_len=expected,
            k=k,
            vocab_size=pin.vocab_size,
            max_candidates=pin.max_candidates,
        )
    _check_generated(choice.get("logprobs"), admitted)


def _check_generated(value: object, admitted: Admitted) -> None:
    k = admitted.logprobs
    if k is None:
        if value is not None:
            raise AnswerRefused("logprobs came unasked", "endpoint.logprobs")
        return
    top = value.get("top_logprobs") if isinstance(value, dict) else None
    if not isinstance(top, list) or len(top) > admitted.max_tokens:
        raise AnswerRefused(
            "the generated logprobs are missing or longer than max_tokens", "endpoint.logprobs"
        )
    for position, entry in enumerate(top):
        if entry is None:
            continue
        if not isinstance(entry, dict) or len(entry) > k + 1:
            raise AnswerRefused(
                f"generated position {position} has more than K+1={k + 1} entries",
                "endpoint.logprobs_width",
            )
        for number in entry.values():
            check_logprob(number, f"logprobs.top_logprobs[{position}]")
