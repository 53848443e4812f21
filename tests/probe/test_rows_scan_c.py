"""The one-pass C rows scan (``kiln_registry.probe._rowscan``) passes a strict subset of
what the numpy check-only scan passes, with the same end, and decides vLLM's rows alone.

Whatever the C scan passes, the numpy scan must pass at the same index and the strict
parser must accept (``check_only`` asserts the latter); where it returns -1 the numpy scan
decides as before.  Driven by real captured vLLM bodies, mutated byte by byte, by
Kiln-shaped rows in drawn layouts, by every prefix of a body and by random bytes (the C
code must never read past the buffer); no mocks.
"""

from __future__ import annotations

import shutil
import sysconfig

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln_registry.probe import candidate_scan
from kiln_registry.probe.candidate_scan import FastPathDeferred, numpy_check_rows_array
from kiln_registry.probe.parse import MAX_VOCAB_SIZE
from tests.probe.test_candidate_scan import (
    BAD_DECODED,
    EDITS,
    GOOD_DECODED,
    LONE_SURROGATES,
    PAIRED_SURROGATES,
    SUCCESS,
    Args,
    Edit,
    captured,
    kiln_rows,
    mutated,
    one_row_body,
    row_args,
)
from tests.probe.test_rows_check import (
    BULK_NUMBERS,
    KEY,
    ONE_BY_ONE_NUMBERS,
    REFUSED_NUMBERS,
    check_only,
    rows_check,
    rows_start,
)


def _compiler() -> str | None:
    cc = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def test_the_c_scan_is_built_where_a_compiler_exists() -> None:
    # The extension is optional (an install without a compiler works on numpy alone), so
    # this is the test that notices a silent build failure on a machine that has one.
    if _compiler() is None:
        assert not candidate_scan.compiled_check()
    else:
        assert candidate_scan.compiled_check(), "kiln_registry.probe._rowscan was not built"


def c_end(body: bytes, args: Args) -> int:
    """The C scan's verdict on the body's first rows array: its end, or -1."""
    from kiln_registry.probe import _rowscan

    return _rowscan.check(
        body,
        rows_start(body),
        args["expected_prompt_len"] - 1,
        args["k"],
        min(args["vocab_size"], MAX_VOCAB_SIZE),
        args["max_candidates"],
    )


def numpy_end(body: bytes, args: Args) -> int:
    try:
        return rows_check(numpy_check_rows_array, body, args)
    except FastPathDeferred:
        return -1


def subset(body: bytes, args: Args) -> bool:
    """True when the C scan passed the body; then numpy passed it at the same end and the
    strict parser accepts its rows."""
    end = c_end(body, args)
    if end < 0:
        return False
    assert numpy_end(body, args) == end, "the C scan passed what the numpy scan does not"
    assert check_only(body, args)
    return True


pytestmark = pytest.mark.skipif(
    not candidate_scan.compiled_check(), reason="no C compiler: the numpy scan decides alone"
)


@pytest.mark.parametrize("name", SUCCESS)
def test_captured_vllm_bodies_are_decided_by_the_c_scan(name: str) -> None:
    body, args = captured(name)
    assert subset(body, args)


@pytest.mark.parametrize(
    "numbers", [*BULK_NUMBERS, ["-" + "9" * 30], ["0", "0.0", "0.000e-3", "-0.0E-1"]]
)
def test_number_forms_the_c_scan_decides(numbers: list[str]) -> None:
    assert subset(one_row_body(numbers), row_args(len(numbers) - 1))


# Each holds a positive exponent: the numpy scan passes it one by one.
@pytest.mark.parametrize(
    "numbers",
    [*ONE_BY_ONE_NUMBERS, ["0e5", "-1.5e+2"], ["-2E3", "-0.5"], ["-3.4028234e38", "-0.5"]],
)
def test_forms_left_to_the_numpy_scan(numbers: list[str]) -> None:
    body, args = one_row_body(numbers), row_args(len(numbers) - 1)
    assert c_end(body, args) == -1
    assert check_only(body, args)  # through check_rows_array: numpy decides


@pytest.mark.parametrize("number", [*REFUSED_NUMBERS, "0.5", "0.0001", "-" + "9" * 31, "-1.5x", ""])
def test_bad_numbers_are_not_passed(number: str) -> None:
    assert c_end(one_row_body([number, "-0.5"]), row_args(1)) == -1


@pytest.mark.parametrize(
    "decoded",
    [
        *GOOD_DECODED,
        PAIRED_SURROGATES,
        '"caf\u00e9 \U0001f600 \u0800 \U00010000 \U0010ffff"',
        r'"\\u"',
        '""',
    ],
)
def test_decoded_tokens_the_c_scan_decides(decoded: str) -> None:
    assert subset(one_row_body(["-1.5", "-0.25"], decoded=decoded), row_args(1))


@pytest.mark.parametrize(
    "raw",
    [
        *(text.encode() for text in [*BAD_DECODED, r'"\ud800"', *LONE_SURROGATES]),
        b'"\x1f"',
        b'"a\xff"',
        b'"\xc0\xaf"',  # an overlong '/'
        b'"\xe0\x80\xaf"',  # an overlong '/', three bytes
        b'"\xed\xa0\x80"',  # an encoded surrogate
        b'"\xf4\x90\x80\x80"',  # past U+10FFFF
        b'"\xf5\x80\x80\x80"',
        b'"\xc3"',  # cut short by the closing quote
        b'"\xe2\x82"',
        b'"\x80"',
        b"null",
        b"1",
    ],
)
def test_bad_decoded_tokens_are_not_passed(raw: bytes) -> None:
    body = one_row_body(["-1.5", "-0.25"], decoded='"@@"').replace(b'"@@"', raw)
    assert c_end(body, row_args(1)) == -1


def test_ids_ranks_rows_widths_and_budget() -> None:
    body, args = captured("pl32")
    assert subset(body, args)
    for change in (
        {"max_candidates": 100},
        {"k": 8},
        {"expected_prompt_len": 13},
        {"expected_prompt_len": args["expected_prompt_len"] + 1},
        {"vocab_size": 2},
    ):
        assert c_end(body, {**args, **change}) == -1
        assert numpy_end(body, {**args, **change}) == -1
    for ids in (["10", "10"], ["010", "11"], ["512", "1"], ["-1", "2"], ["123456789", "1"]):
        assert c_end(one_row_body(["-1.5", "-0.5"], ids=ids), row_args(1)) == -1
    assert subset(one_row_body(["-1.5", "-0.5"], ids=["0", "511"]), row_args(1))
    ranks = one_row_body(["-1.5", "-0.5"]).replace(b'"rank":400', b'"rank":0', 1)
    assert c_end(ranks, row_args(1)) == -1
    ranks = one_row_body(["-1.5", "-0.5"]).replace(b'"rank":400', b'"rank":513', 1)
    assert c_end(ranks, row_args(1)) == -1


@pytest.mark.parametrize("width", [2, 8, 9, 40])
def test_a_repeated_id_in_a_row_is_not_passed(width: int) -> None:
    # The row's ids are marked in a bit set cleared as the row closes: a repeat at the
    # row's start, end and across it is caught; the same ids in the next row are not repeats.
    numbers = ["-0.5"] * width
    distinct = [str(i * 7) for i in range(width)]
    assert subset(one_row_body(numbers, ids=distinct), row_args(width))
    for a, b in ((0, 1), (0, width - 1), (width - 2, width - 1)):
        ids = list(distinct)
        ids[b] = ids[a]
        assert c_end(one_row_body(numbers, ids=ids), row_args(width)) == -1


def test_ids_at_the_vocabulary_s_edges_and_across_rows() -> None:
    top = str(MAX_VOCAB_SIZE - 1)
    args = {**row_args(2), "vocab_size": MAX_VOCAB_SIZE}
    assert subset(one_row_body(["-1.5", "-0.5", "-0.25"], ids=[top, "0", "63"]), args)
    body, args = captured("pl32")  # every row repeats ids of the row before it
    assert subset(body, args)


def test_an_empty_array_and_other_layouts() -> None:
    body, args = captured("pl1_single_token")
    assert subset(body, args)
    compact = one_row_body(["-1.5", "-0.5"])
    for old, new in (
        (b'"prompt_logprobs":[null,', b'"prompt_logprobs":[ null,'),
        (b'"prompt_logprobs":[null,', b'"prompt_logprobs":[null, '),
        (b'"rank":400,', b'"rank":400 ,'),
        (b'"logprob":-1.5,"rank":400', b'"rank":400,"logprob":-1.5'),
        (b'"decoded_token":""}', b'"decoded_token":"","x":1}'),
        (b"}}]", b"} }]"),
        (b"}}]", b"},{}]"),
        (b"}}]", b"},null]"),
    ):
        changed = compact.replace(old, new, 1)
        assert changed != compact
        assert c_end(changed, row_args(1)) == -1


def test_every_prefix_of_a_body_is_read_within_bounds() -> None:
    body, args = captured("pl32")
    whole = c_end(body, args)
    assert whole > 0
    for cut in range(len(body) - 1, body.find(KEY), -1):
        got = c_end(body[:cut], args)
        assert got == -1 or (got == whole and cut >= whole + 2)


def test_arguments_outside_the_scan_s_bounds_are_left_to_numpy() -> None:
    from kiln_registry.probe import _rowscan

    body, args = captured("pl32")
    start = body.find(KEY) + len(KEY) - 1
    rows = args["expected_prompt_len"] - 1
    assert _rowscan.check(body, start, rows, 1 << 20, 512, 10**6) == -1  # k past MAX_K
    assert _rowscan.check(body, len(body) + 5, rows, 32, 512, 10**6) == -1
    assert _rowscan.check(body, -3, rows, 32, 512, 10**6) == -1
    assert _rowscan.check(body, start, rows, 32, 0, 10**6) == -1
    assert _rowscan.check(body, start, rows, 32, MAX_VOCAB_SIZE + 1, 10**6) == -1
    assert _rowscan.check(body, start, rows, 32, MAX_VOCAB_SIZE, 10**6) > 0
    with pytest.raises(TypeError):
        _rowscan.check(bytearray(body), start, rows, 32, 512, 10**6)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["pl1", "pl32", "fp32_pl32_64tok"]), edits=EDITS)
def test_mutated_real_bodies_stay_a_subset(name: str, edits: list[Edit]) -> None:
    body, args = captured(name)
    subset(mutated(body, edits), args)


@settings(max_examples=400, deadline=None)
@given(case=kiln_rows())
def test_kiln_shaped_rows_stay_a_subset(case: tuple[bytes, Args, bool]) -> None:
    body, args, _ = case
    subset(body, args)


@settings(max_examples=300, deadline=None)
@given(tail=st.binary(max_size=300), rows=st.integers(0, 3), k=st.integers(0, 5))
def test_random_bytes_never_pass_wrongly(tail: bytes, rows: int, k: int) -> None:
    body = b'{"prompt_logprobs":[null,{"' + tail
    subset(body, {"expected_prompt_len": rows + 1, "k": k, "vocab_size": 512, "max_candidates": 50})
