"""The per-answer check on real reference-teacher answers and on their tampered copies.

A real answer of the reference teacher (batched, two prompts, prompt_logprobs 4) passes,
on the byte scan (``endpoint.answer_scan``); each tampered copy is refused with its rule,
whichever path decides (the byte scan defers anything it cannot decide): another
fingerprint, a repeated key (which the fast path's key count sends to the strict parser),
a missing or extra choice, a row wider than K+1, an id past the vocabulary, a positive
logprob, rows that were not asked for, rows swapped between prompts of other lengths.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from kiln_registry.endpoint.admission import Limits, Pin, admit
from kiln_registry.endpoint.answers import AnswerRefused, check_answer
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.model import ReferenceTeacher
from tests.endpoint.support import tokens

PROMPTS = [tokens(6), tokens(9, start=4)]


@pytest.fixture(scope="module")
def real(teacher_url: str, reference: tuple[ReferenceTeacher, TeacherIdentity]) -> Any:
    body = {"model": "teacher-tiny", "prompt": PROMPTS, "max_tokens": 1, "prompt_logprobs": 4}
    answer = httpx.post(teacher_url + "/v1/completions", json=body, trust_env=False)
    assert answer.status_code == 200
    ident = reference[1]
    pin = Pin("teacher-tiny", ident.vocab_size, ident.max_top_k, ident.max_model_len,
              ident.max_prompt_logprob_candidates)  # fmt: skip
    return answer.content, admit(json.dumps(body).encode(), pin, Limits()), pin, ident.fingerprint()


def _refused(body: bytes, real: Any) -> AnswerRefused:
    _, admitted, pin, fingerprint = real
    with pytest.raises(AnswerRefused) as caught:
        check_answer(body, admitted, pin, fingerprint)
    return caught.value


def test_a_real_answer_passes_and_tampered_ones_are_refused(real: Any) -> None:
    body, admitted, pin, fingerprint = real
    check_answer(body, admitted, pin, fingerprint)
    tree = json.loads(body)

    def dumped(change: Any) -> bytes:
        copy = json.loads(body)
        change(copy)
        return json.dumps(copy).encode()

    flipped = _refused(dumped(lambda t: t.update(system_fingerprint="fp-other")), real)
    assert flipped.identity_changed and flipped.rule == "endpoint.fingerprint"
    assert _refused(dumped(lambda t: t["choices"].pop()), real).rule == "endpoint.choice_count"
    extra = dumped(lambda t: t["choices"].append(dict(t["choices"][0], index=2)))
    assert _refused(extra, real).rule == "endpoint.choice_count"
    row = tree["choices"][0]["prompt_logprobs"][2]
    wide = {**row, **{str(400 + i): {"logprob": -9.0, "rank": 50 + i} for i in range(5)}}
    widened = dumped(lambda t: t["choices"][0]["prompt_logprobs"].__setitem__(2, wide))
    assert _refused(widened, real).rule == "probe.row_width"
    past = {"999999": {"logprob": -1.0, "rank": 1}}
    outside = dumped(lambda t: t["choices"][1]["prompt_logprobs"].__setitem__(1, past))
    assert _refused(outside, real).rule in ("probe.token_id", "probe.token_id_range")
    positive = {"5": {"logprob": 0.5, "rank": 1}}
    plus = dumped(lambda t: t["choices"][1]["prompt_logprobs"].__setitem__(3, positive))
    assert _refused(plus, real).rule == "probe.logprob_positive"
    unasked = dumped(lambda t: t["choices"][0].update(logprobs={"top_logprobs": []}))
    assert _refused(unasked, real).rule == "endpoint.logprobs"


def test_a_repeated_key_goes_the_strict_way_and_is_refused(real: Any) -> None:
    body, *_ = real
    fingerprint = json.loads(body)["system_fingerprint"]
    # A body whose last fingerprint is the pinned one, with another before it.
    doubled = body.replace(
        b'"system_fingerprint":', b'"system_fingerprint":"fp-other","system_fingerprint":', 1
    )
    assert json.loads(doubled)["system_fingerprint"] == fingerprint  # what a client sees
    assert _refused(doubled, real).rule == "probe.json_duplicate_key"


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1,"b":{"c":[1,{"d":"e"}]}}',
        '{"decoded_token":":","x":"\\":","y":"\\\\","z":"\\\\\\":"}',
        '{ "a" : 1 , "b" :\n {"c" :\t"{\\"k\\": 2}"}}',
        '{"":"","a":[":",":\\"",{"b":":"}]}',
    ],
)
def test_key_endings_counts_exactly_the_keys(text: str) -> None:
    from kiln_registry.endpoint.fast_rows import key_endings

    pairs: list[int] = []
    json.loads(text, object_pairs_hook=lambda items: pairs.append(len(items)) or dict(items))
    assert key_endings(text.encode()) == sum(pairs)


def _arrays(body: bytes) -> list[tuple[int, int]]:
    """Where each choice's rows array starts and ends in a compact answer."""
    from kiln_registry.endpoint.answer_scan import ARRAY_KEY

    spans, pos = [], 0
    while (at := body.find(ARRAY_KEY, pos)) >= 0:
        start = at + len(ARRAY_KEY) - 1
        end = body.index(b"}}]", start) + 3
        spans.append((start, end))
        pos = end
    return spans


def test_the_real_answer_takes_the_byte_scan(real: Any) -> None:
    from kiln_registry.endpoint.answer_scan import ScannedRows, scan_envelope

    body, admitted, pin, _ = real
    top = scan_envelope(body, admitted, pin).tree
    assert isinstance(top, dict)
    rows = [choice["prompt_logprobs"] for choice in top["choices"]]
    assert [type(r) for r in rows] == [ScannedRows, ScannedRows]
    assert [r.prompt_len for r in rows] == [len(p) for p in PROMPTS]


def test_tampered_compact_answers_are_refused_after_the_byte_scan(real: Any) -> None:
    body, *_ = real
    (a0, a1), (b0, b1) = _arrays(body)
    swapped = body[:a0] + body[b0:b1] + body[a1:b0] + body[a0:a1] + body[b1:]
    assert _refused(swapped, real).rule == "probe.prompt_logprobs_length"
    positive = body.replace(b'"logprob":-', b'"logprob":', 1)
    assert _refused(positive, real).rule == "probe.logprob_positive"
    row_at = body.index(b"{", body.index(b"[null,", a0)) + 1
    first = body[row_at : body.index(b"}", row_at) + 1]
    repeated = body[:row_at] + first + b"," + body[row_at:]
    assert _refused(repeated, real).rule == "probe.json_duplicate_key"
    fingerprint = json.loads(body)["system_fingerprint"].encode()
    other = body.replace(fingerprint, b"fp-other" + fingerprint[8:])
    assert _refused(other, real).identity_changed


def test_a_cut_literal_or_rows_key_in_the_envelope_leaves_the_verdict_to_the_strict_path(
    real: Any,
) -> None:
    from kiln_registry.endpoint.answer_scan import CUT_TEXT, scan_envelope
    from kiln_registry.probe.candidate_scan import FastPathDeferred

    body, admitted, pin, fingerprint = real
    literal = body.replace(b'"created":', b'"x":' + CUT_TEXT.encode() + b',"created":', 1)
    with pytest.raises(FastPathDeferred):
        scan_envelope(literal, admitted, pin)
    check_answer(literal, admitted, pin, fingerprint)  # the strict path accepts it
    (a0, a1), _ = _arrays(body)
    decoy = body[:a1] + b',"logprobs_of_rows":{"prompt_logprobs":' + body[a0:a1] + b"}" + body[a1:]
    with pytest.raises(FastPathDeferred):
        scan_envelope(decoy, admitted, pin)  # the second cut is not the second choice's rows
    check_answer(decoy, admitted, pin, fingerprint)  # an unknown key: the strict path's verdict
