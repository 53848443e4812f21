"""The fast validation path agrees with the strict parser on every body.

The property: when ``scan_completion`` accepts a body, ``parse_completion``
accepts it with byte-identical columns and fields; otherwise the fast path
defers, so ``parse_completion_fast`` refuses with the strict parser's rule and
message.  Real vLLM bodies are mutated byte by byte (hypothesis), and the
number conversion is driven with logprob texts near float64 rounding
boundaries.  No mocks: ``CHUNK_BYTES`` is lowered with monkeypatch (a plain
setting) so small bodies cross chunk boundaries.
"""

from __future__ import annotations

import json
import struct
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe import candidate_scan
from kiln_registry.probe.candidate_scan import (
    FastPathDeferred,
    first_duplicate,
    parse_completion_fast,
    scan_completion,
    sparse_positions,
)
from kiln_registry.probe.parse import ParsedCompletion, parse_completion

DATA = Path(__file__).resolve().parent.parent / "data" / "vllm_responses"
SUCCESS = ["pl0", "pl1", "pl32", "fp32_pl32_64tok", "pl1_greedy_tail", "pl1_single_token"]
Args = dict[str, int]


def captured(name: str) -> tuple[bytes, Args]:
    req = json.loads((DATA / f"{name}.meta.json").read_text())["request"]["body"]
    args = {
        "expected_prompt_len": len(req["prompt"]),
        "k": int(req["prompt_logprobs"]),
        "vocab_size": 512,
        "max_candidates": 1_000_000,
    }
    return (DATA / f"{name}.json").read_bytes(), args


def outcome(parse: Any, body: bytes, args: Args) -> tuple[object, ...]:
    """Everything a caller can observe: the parsed fields and columns, or the refusal."""
    try:
        parsed: ParsedCompletion = parse(body, **args)
    except ProbeFailed as exc:
        return ("refused", exc.rule, exc.message)
    rows = parsed.rows
    columns = tuple((c.typecode, c.tobytes()) for c in (rows.ids, rows.logprobs, rows.ranks))
    fields = (parsed.object, parsed.model, parsed.system_fingerprint, parsed.prompt_tokens)
    sources = None if rows.sources is None else rows.sources.tobytes()
    extra = (sources, rows.distinct_ids)
    return ("parsed", fields, parsed.choice_index, columns, rows.offsets.tobytes(), extra)


def fast_taken(body: bytes, args: Args) -> bool:
    """True when the fast path decided alone; then it must equal the strict parser."""
    try:
        fast = outcome(scan_completion, body, args)
    except FastPathDeferred:
        assert outcome(parse_completion_fast, body, args) == outcome(parse_completion, body, args)
        return False
    assert fast == outcome(parse_completion, body, args)
    return True


def one_row_body(numbers: list[str], *, decoded: str = '""', ids: list[str] | None = None) -> bytes:
    """A 2-token prompt whose single row carries ``numbers`` as logprob texts."""
    ids = ids or [str(10 + i) for i in range(len(numbers))]
    ranks = [400, *range(1, len(numbers))]
    cells = ",".join(
        f'"{i}":{{"logprob":{n},"rank":{r},"decoded_token":{decoded}}}'
        for i, n, r in zip(ids, numbers, ranks, strict=True)
    )
    return (
        '{"id":"cmpl-x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        f'"text":"","logprobs":null,"prompt_logprobs":[null,{{{cells}}}],"prompt_token_ids":null}}],'
        '"system_fingerprint":"fp","usage":{"prompt_tokens":2,"total_tokens":3}}'
    ).encode()


def row_args(width: int) -> Args:
    return {"expected_prompt_len": 2, "k": width, "vocab_size": 512, "max_candidates": 1000}


@pytest.mark.parametrize("name", SUCCESS)
def test_captured_bodies_take_the_fast_path(name: str) -> None:
    body, args = captured(name)
    assert fast_taken(body, args)


def test_small_chunks_cross_candidates_and_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    body, args = captured("fp32_pl32_64tok")
    for size in (97, 1000, 4096):
        monkeypatch.setattr(candidate_scan, "CHUNK_BYTES", size)
        assert fast_taken(body, args)


# Decoded-token strings every scan passes, and ones that are not JSON strings (the
# strict parser refuses them); tests/probe/test_rows_scan_c.py holds the C scan to both.
GOOD_DECODED = [
    r'"\u0010"',
    r'"a\"b"',
    r'"\\"',
    r'"\\\""',
    r'"x\/\b\f\n\r\t"',
    '"caf\u00e9 \U0001f600"',
    r'"\ud7ff\ue000"',
    '"},\\"1\\":{"',
]
BAD_DECODED = [r'"\x"', r'"\u12G4"', '"\x01"', r'"\"', '"\\u00"']
LONE_SURROGATES = [r'"\udc00"', r'"\ud83d\u0041"', r'"\ud83d\ud83d\ude00"']
PAIRED_SURROGATES = r'"a\ud83d\ude00\uDBFF\uDFFFb"'


@pytest.mark.parametrize("decoded", GOOD_DECODED)
@pytest.mark.parametrize("shift", range(8))
def test_decoded_token_strings_with_escapes_and_utf8(decoded: str, shift: int) -> None:
    # ``shift`` moves the token across the 8-byte words that sparse_positions reads.
    body = one_row_body(["-1.5", str(-(2.0 ** -(1 + shift)))], decoded=decoded)
    assert fast_taken(body, row_args(1))


@pytest.mark.parametrize("decoded", BAD_DECODED)
@pytest.mark.parametrize("shift", range(8))
def test_bad_decoded_token_strings_defer_and_are_refused(decoded: str, shift: int) -> None:
    body = one_row_body(["-1.5", str(-(2.0 ** -(1 + shift)))], decoded=decoded)
    assert not fast_taken(body, row_args(1))
    with pytest.raises(ProbeFailed) as info:
        parse_completion_fast(body, **row_args(1))
    assert info.value.rule == "probe.json"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40), st.integers(0, 320))
def test_sparse_positions_are_flatnonzero(hits: list[int], size: int) -> None:
    # Any size (whole 8-byte words and a tail), any density, at any offset of a buffer.
    backing = np.zeros(size + 3, dtype=bool)
    mask = backing[3:]
    mask[[h for h in hits if h < size]] = True
    assert np.array_equal(sparse_positions(mask), np.flatnonzero(mask))


def test_surrogate_escapes_defer_and_serde_rules_decide() -> None:
    body = one_row_body(["-1.5", "-0.5"], decoded=r'"\ud800"')
    assert not fast_taken(body, row_args(1))
    with pytest.raises(ProbeFailed) as info:
        parse_completion_fast(body, **row_args(1))
    assert info.value.rule == "probe.json_surrogate"
    for lone in LONE_SURROGATES:
        assert not fast_taken(one_row_body(["-1.5", "-0.5"], decoded=lone), row_args(1))
    paired = one_row_body(["-1.5", "-0.5"], decoded=PAIRED_SURROGATES)
    assert fast_taken(paired, row_args(1))


def test_invalid_utf8_in_a_decoded_token_is_refused() -> None:
    body = one_row_body(["-1.5", "-0.5"], decoded='"ab"').replace(b'"ab"', b'"a\xff"', 1)
    assert not fast_taken(body, row_args(1))
    with pytest.raises(ProbeFailed) as info:
        parse_completion_fast(body, **row_args(1))
    assert info.value.rule == "probe.json_utf8"


@pytest.mark.parametrize(
    ("numbers", "fast"),
    [
        (["-6.467060089111328", "-5.9470367431640625"], True),
        (["-9999.0", "-0.0"], True),
        (["-0", "0"], True),
        (["0.0", "-16777216"], True),
        (["-7.62939453125e-06", "-1.234375E+2"], True),
        (["-0.0001220703125000000", "-0.5"], True),
        (["-0.00012345678901234567", "-0.5"], False),
        (["-1.0000000000000000000001", "-0.5"], True),
        (["-5.94703674316406250000", "-0.5"], True),
    ],
)
def test_number_forms(numbers: list[str], fast: bool) -> None:
    body = one_row_body(numbers)
    assert fast_taken(body, row_args(1)) is fast


@pytest.mark.parametrize(
    ("numbers", "rule"),
    [
        (["1.5", "-0.5"], "probe.logprob_positive"),
        (["1e-100", "-0.5"], "probe.logprob_positive"),
        (["-1e400", "-0.5"], "probe.json_number_range"),  # serde_json: out of range
        (["-1e39", "-0.5"], "probe.logprob_float32"),
        (["-3.4028235677973366e38", "-0.5"], "probe.logprob_float32"),
        (["NaN", "-0.5"], "probe.json_constant"),
        (["-Infinity", "-0.5"], "probe.json_constant"),
        (["-01.5", "-0.5"], "probe.json"),
        (["-1.", "-0.5"], "probe.json"),
        (["-.5", "-0.5"], "probe.json"),
        (["+1", "-0.5"], "probe.json"),
        (["-1.5e", "-0.5"], "probe.json"),
        (['"-1.5"', "-0.5"], "probe.logprob_type"),
        (["-1" + "0" * 39, "-0.5"], "probe.logprob_float32"),
    ],
)
def test_number_refusals_come_from_the_strict_parser(numbers: list[str], rule: str) -> None:
    body = one_row_body(numbers)
    assert not fast_taken(body, row_args(1))
    with pytest.raises(ProbeFailed) as info:
        parse_completion_fast(body, **row_args(1))
    assert info.value.rule == rule


@pytest.mark.parametrize(
    ("ids", "rule"),
    [
        (["07", "8"], "probe.token_id"),
        (["7", "7"], "probe.json_duplicate_key"),
        (["7", "512"], "probe.token_id_range"),
        (["", "8"], "probe.token_id"),
        (["123456789", "8"], "probe.token_id"),
    ],
)
def test_id_refusals_come_from_the_strict_parser(ids: list[str], rule: str) -> None:
    body = one_row_body(["-1.5", "-0.5"], ids=ids)
    assert not fast_taken(body, row_args(1))
    with pytest.raises(ProbeFailed) as info:
        parse_completion_fast(body, **row_args(1))
    assert info.value.rule == rule


@pytest.mark.parametrize(
    "edit",
    [
        (b'"rank":1,', b'"rank": 1,'),
        (b'{"logprob":-0.5,"rank":1,', b'{"rank":1,"logprob":-0.5,'),
        (b',"decoded_token":""}}', b',"decoded_token":"","extra":[1]}}'),
        (b',"decoded_token":""}}', b"}}"),
        (b'"prompt_token_ids":null', b'"prompt_token_ids":null,"vllm_0_33":{"a":[1.5]}'),
        (b'"text":""', b'"text":"\\"prompt_logprobs\\":[null]"'),
        (b"[null,{", b"[null, {"),
        (b'"rank":1,', b'"rank":1.0,'),
        (b'"rank":1,', b'"rank":01,'),
    ],
)
def test_layout_variations_agree(edit: tuple[bytes, bytes]) -> None:
    body = one_row_body(["-1.5", "-0.5"])
    assert edit[0] in body
    fast_taken(body.replace(edit[0], edit[1], 1), row_args(1))


def test_an_array_key_inside_a_string_or_another_object_is_not_trusted() -> None:
    inner = b'[null,{"10":{"logprob":-1.5,"rank":400,"decoded_token":""}}]'
    decoy = b'"x":{"prompt_logprobs":' + inner + b"},"
    body = one_row_body(["-1.5", "-0.5"]).replace(b'"text":""', decoy + b'"text":""', 1)
    assert not fast_taken(body, row_args(1))
    body2 = body.replace(b'"prompt_logprobs":[null,{"10"', b'"prompt_logprobs":[null,{"11"', 1)
    fast_taken(body2, row_args(1))


def test_the_cut_literal_in_the_envelope_defers() -> None:
    text = json.dumps(candidate_scan._CUT_TEXT).encode()
    body = one_row_body(["-1.5", "-0.5"]).replace(b'"text":""', b'"text":' + text, 1)
    assert not fast_taken(body, row_args(1))
    body = one_row_body(["-1.5", "-0.5"]).replace(b'"created":1', b'"created":-0.0e-7777777', 1)
    assert not fast_taken(body, row_args(1))


def test_rows_count_width_and_budget_defer_to_the_strict_rules() -> None:
    body, args = captured("pl32")
    for change, rule in [
        ({"max_candidates": 100}, "probe.candidate_budget"),
        ({"k": 8}, "probe.row_width"),
        ({"expected_prompt_len": 13}, "probe.prompt_logprobs_length"),
    ]:
        assert not fast_taken(body, {**args, **change})
        with pytest.raises(ProbeFailed) as info:
            parse_completion_fast(body, **{**args, **change})
        assert info.value.rule == rule


def test_single_token_prompt_and_oversized_body() -> None:
    body, args = captured("pl1_single_token")
    assert fast_taken(body, args)
    with pytest.raises(ProbeFailed) as info:
        parse_completion_fast(b" " * ((1 << 20) + 1), **args)
    assert info.value.rule == "probe.body_too_large"


def near_boundary(value: float, offset: Fraction, digits: int) -> str:
    """``value`` plus ``offset`` float64 ulps, printed with ``digits`` significant digits."""
    ulp = Fraction(abs(np.spacing(np.float64(value))))
    exact = Fraction(value) + offset * ulp
    return f"{Decimal(exact.numerator) / Decimal(exact.denominator):.{digits - 1}e}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bits=st.integers(0x80000001, 0xC2000000),
    offset=st.fractions(Fraction(-3, 4), Fraction(3, 4), max_denominator=64),
    digits=st.integers(15, 21),
    fixed=st.booleans(),
)
def test_logprob_conversion_matches_python_float(
    bits: int, offset: Fraction, digits: int, fixed: bool
) -> None:
    value = struct.unpack("<f", struct.pack("<I", bits))[0]
    text = near_boundary(value, offset, digits)
    if fixed:
        text = format(Decimal(text), "f")
    assume(len(text) <= 31)
    body = one_row_body([text, "-20.0"])
    fast_taken(body, row_args(1))


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(-40.0, 0.0, width=32, allow_subnormal=False), min_size=2, max_size=6)
)
def test_vllm_style_logprobs_are_decided_on_the_fast_path(values: list[float]) -> None:
    texts = [repr(v) for v in values]
    assert fast_taken(one_row_body(texts), row_args(len(texts) - 1))


Edit = tuple[float, str, int]
EDITS = st.lists(
    st.tuples(
        st.floats(0.0, 1.0, allow_nan=False),
        st.sampled_from(["replace", "insert", "delete"]),
        st.sampled_from(list(b'0123456789-.eE+"\\{}[],: nul\x00\x1f\xc3\xa9\xff')),
    ),
    min_size=1,
    max_size=3,
)


def mutated(body: bytes, edits: list[Edit]) -> bytes:
    """``body`` with ``edits`` applied from its rows array on (each at a fraction of the rest)."""
    start = body.index(b'"prompt_logprobs":[')
    data = bytearray(body)
    for where, kind, byte in edits:
        at = start + int(where * (len(data) - start - 1))
        if kind == "replace":
            data[at] = byte
        elif kind == "insert":
            data.insert(at, byte)
        else:
            del data[at]
    return bytes(data)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["pl1", "pl32", "fp32_pl32_64tok"]), edits=EDITS)
def test_mutated_real_bodies_agree(name: str, edits: list[Edit]) -> None:
    body, args = captured(name)
    fast_taken(mutated(body, edits), args)


def test_first_duplicate_reports_the_first_row_and_smallest_id() -> None:
    ids = np.array([5, 1, 2, 9, 3, 9, 3, 4], dtype=np.int32)
    offsets = np.array([0, 3, 8], dtype=np.int64)
    assert first_duplicate(ids, offsets) == (1, 3)
    assert first_duplicate(ids[:3], offsets[:2]) is None
    # one very wide row among many narrow ones takes the sorting branch
    wide = np.concatenate([np.arange(5000), np.zeros(3000)]).astype(np.int32)
    wide[4000] = 17
    wide_offsets = np.concatenate([[0], 5000 + np.arange(3001)]).astype(np.int64)
    assert first_duplicate(wide, wide_offsets) == (0, 17)
    wide[4000] = 4000
    assert first_duplicate(wide, wide_offsets) is None


# --- the forms Kiln's remote_teacher.rs accepts (rows are maps, ties, any finite
# logprob <= 0 rounded to float32, decoded_token of any JSON type): both paths agree.

_DECODED = st.one_of(
    st.text(max_size=6).map(json.dumps),
    st.sampled_from(["null", "1", "-2.5", "true", "[]", '["a",1]', "{}", '{"logprob":1,"rank":2}']),
)
_NUMBER = st.one_of(
    st.floats(-40.0, 0.0, width=32).map(repr),  # vLLM's own spelling: float32-exact
    st.decimals(-40, 0, places=3).map(lambda d: format(d, "f")),  # -0.1: rounded
    st.integers(-40, 0).map(str),
    st.sampled_from(["-1e-50", "-0.0", "-0", "-2.00000001", "-1.5E+1", "-16777217"]),
)


@st.composite
def kiln_rows(draw: st.DrawFn) -> tuple[bytes, Args, bool]:
    """A one-row body Kiln's parser accepts at the value level, in a drawn layout.

    Returns the body, the parse arguments and whether it is in vLLM's compact
    layout with float32-exact numbers and string tokens (then the fast path decides).
    """
    k = draw(st.integers(1, 6))
    width = draw(st.sampled_from([k, k + 1]))
    ids = draw(st.lists(st.integers(0, 511), min_size=width, max_size=width, unique=True))
    numbers = draw(st.lists(_NUMBER, min_size=width, max_size=width))
    ranks = draw(st.lists(st.integers(1, 600), min_size=width, max_size=width))
    decoded = draw(st.lists(_DECODED, min_size=width, max_size=width))
    compact = draw(st.booleans())
    sep = "" if compact else draw(st.sampled_from([" ", "\n", "\t "]))
    cells = []
    for i, n, r, d in zip(ids, numbers, ranks, decoded, strict=True):
        order = [f'"logprob":{sep}{n}', f'"rank":{sep}{r}', f'"decoded_token":{sep}{d}']
        if not compact:
            order = draw(st.permutations(order))
        cells.append(f'"{i}":{sep}{{{",".join(order)}}}')
    body = (
        '{"object":"text_completion","model":"m","choices":[{"index":0,'
        f'"prompt_logprobs":[null,{sep}{{{",".join(cells)}}}]}}],'
        '"system_fingerprint":"fp","usage":{"prompt_tokens":2}}'
    ).encode()
    exact = all(float(np.float32(float(n))) == float(n) for n in numbers)
    strings = all(d.startswith('"') for d in decoded)
    args = {"expected_prompt_len": 2, "k": k, "vocab_size": 512, "max_candidates": 100}
    return body, args, compact and exact and strings


@settings(max_examples=400, deadline=None)
@given(case=kiln_rows())
def test_kiln_accepted_forms_agree_and_vllm_layout_stays_fast(
    case: tuple[bytes, Args, bool],
) -> None:
    body, args, vllm_layout = case
    taken = fast_taken(body, args)
    strict = outcome(parse_completion, body, args)
    if strict[0] == "parsed":
        assert taken == vllm_layout
