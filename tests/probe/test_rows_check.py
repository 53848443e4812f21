"""``check_rows_array``, the check-only scan the teacher endpoint uses, never passes what
the strict parser refuses, and passes vLLM's rows in bulk.

Where the columns are not kept, a logprob needs only the strict parser's rule (a JSON
number ``<= 0`` whose float32 rounding is finite), not float32 exactness; so this path
passes more bodies alone than ``scan_completion``, and each one it passes must parse.
Real captured vLLM bodies, mutated byte by byte (hypothesis), and Kiln-shaped rows in
drawn layouts drive it; no mocks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.candidate_scan import FastPathDeferred, check_rows_array
from kiln_registry.probe.exact_numbers import valid_logprobs
from kiln_registry.probe.parse import parse_completion, parse_rows, strict_loads
from tests.probe.test_candidate_scan import (
    EDITS,
    SUCCESS,
    Args,
    Edit,
    captured,
    kiln_rows,
    mutated,
    one_row_body,
    row_args,
)

KEY = b'"prompt_logprobs":['


def rows_start(body: bytes) -> int:
    """Where the body's first rows array opens."""
    return body.find(KEY) + len(KEY) - 1


def rows_check(
    check: Callable[[bytes, int, int, int, int, int], int], body: bytes, args: Args
) -> int:
    """``check`` (``check_rows_array``'s signature) on the body's first rows array."""
    return check(
        body,
        rows_start(body),
        args["expected_prompt_len"],
        args["k"],
        args["vocab_size"],
        args["max_candidates"],
    )


def check_only(body: bytes, args: Args) -> bool:
    """True when the check-only scan passed the body's rows array alone; the array must then
    pass the strict parser's rows rules (``parse_rows`` over ``strict_loads``)."""
    if body.find(KEY) < 0:
        return False
    try:
        end = rows_check(check_rows_array, body, args)
    except FastPathDeferred:
        return False
    start = rows_start(body)
    assert body[end - 1 : end] == b"]"
    try:
        parse_rows(strict_loads(body[start:end]), **args)
    except ProbeFailed as exc:  # pragma: no cover - the failure this test exists for
        raise AssertionError(f"check-only scan passed rows the parser refuses: {exc}") from exc
    return True


def strict_refuses(body: bytes, args: Args) -> bool:
    try:
        parse_completion(body, **args)
    except ProbeFailed:
        return True
    return False


@pytest.mark.parametrize("name", SUCCESS)
def test_captured_vllm_bodies_pass(name: str) -> None:
    assert check_only(*captured(name))


# Logprob spellings passed in bulk (vLLM's forms, float32-exact or not), and ones the
# scan passes one by one (an unsigned zero, a positive exponent, near float32's edge).
BULK_NUMBERS = [
    ["-6.467060089111328", "-5.9470367431640625"],
    ["-9999.0", "-0.0", "-0"],
    ["-7.62939453125e-06", "-1e-5", "-1.5E-7", "-2e-0"],
    ["-0.00012345678901234567", "-1.0000000000000000000001"],  # not float32-exact
    ["-123456789012345678901234567.5"],
]
ONE_BY_ONE_NUMBERS = [
    ["0", "0.0", "0e5", "-1.5e+2", "-2E3"],
    ["-3.4028234e38", "-1e38"],
]
REFUSED_NUMBERS = [
    "1.5", "1e-100", "-1e400", "-1e39", "-3.4028235677973366e38", "NaN", "-Infinity",
    "-01.5", "-1.", "-.5", "+1", "-1.5e", "-1.5e-", "-1e--5", "-1.5.5", "--1", "-1e-5e-5",
    "-1ee-5", "-1.e-5", "-0x10", "-1" + "0" * 39, "- 1", "-1E+", '"-1.5"',
]  # fmt: skip


@pytest.mark.parametrize("numbers", BULK_NUMBERS + ONE_BY_ONE_NUMBERS)
def test_number_forms_pass(numbers: list[str]) -> None:
    assert check_only(one_row_body(numbers), row_args(len(numbers) - 1))


@pytest.mark.parametrize("number", REFUSED_NUMBERS)
def test_number_refusals_defer(number: str) -> None:
    body = one_row_body([number, "-0.5"])
    assert not check_only(body, row_args(1))
    assert strict_refuses(body, row_args(1))


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.floats(-1e15, 0.0, allow_nan=False, allow_infinity=False), min_size=2, max_size=6
    )
)
def test_python_spelled_negative_floats_pass_in_bulk(values: list[float]) -> None:
    """repr() of a negative float under 1e16 (vLLM's spelling) is decided in bulk."""
    texts = [repr(-abs(v)) if v != 0.0 else "-0.0" for v in values]
    texts = [t for t in texts if len(t) <= 31]
    width = 32
    number = np.zeros((len(texts), 40), dtype=np.uint8)
    for row, text in enumerate(texts):
        raw = text.encode()
        number[row, width - len(raw) : width] = np.frombuffer(raw, dtype=np.uint8)
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    if texts:
        assert valid_logprobs(number, lengths).size == 0, texts
        assert check_only(one_row_body(texts), row_args(len(texts) - 1))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["pl1", "pl32", "fp32_pl32_64tok"]), edits=EDITS)
def test_mutated_real_bodies_never_pass_what_the_parser_refuses(
    name: str, edits: list[Edit]
) -> None:
    body, args = captured(name)
    check_only(mutated(body, edits), args)


@settings(max_examples=400, deadline=None)
@given(case=kiln_rows())
def test_kiln_shaped_rows_agree(case: tuple[bytes, Args, bool]) -> None:
    body, args, _ = case
    check_only(body, args)
