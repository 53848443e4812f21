"""canonical_json and strict_json_loads: byte form and every json.* refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.canonical import JSON_RULES, canonical_json, strict_json_loads

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "json_strict.json").read_text("utf-8")
)


def test_compact_raw_utf8_unescaped_slash_and_order_kept() -> None:
    value = {"z": "teacher/model", "a": "é日本\u2028", "m": [1, True, None, -2]}
    assert canonical_json(value) == (
        '{"z":"teacher/model","a":"é日本\u2028","m":[1,true,null,-2]}'.encode()
    )


def test_escapes_quotes_backslashes_and_controls() -> None:
    assert canonical_json('a"b\\c\n\x01') == b'"a\\"b\\\\c\\n\\u0001"'


@pytest.mark.parametrize("value", [float("nan"), float("inf"), [float("-inf")]])
def test_non_finite_refused(value: object) -> None:
    with pytest.raises(IdentityError) as info:
        canonical_json(value)
    assert info.value.rule == "json.non_finite"


def test_lone_surrogate_refused() -> None:
    with pytest.raises(IdentityError) as info:
        canonical_json({"a": "\ud800"})
    assert info.value.rule == "json.surrogate"


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["name"])
def test_strict_vectors(case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["data_hex"])
    if "rule" in case:
        with pytest.raises(IdentityError) as info:
            strict_json_loads(data, what="vector file", max_bytes=case["max_bytes"])
        assert info.value.rule == case["rule"]
        assert info.value.rule in JSON_RULES
        assert "vector file" in str(info.value)
    else:
        assert strict_json_loads(data, what="v", max_bytes=case["max_bytes"]) == case["value"]


def test_every_rule_has_a_vector() -> None:
    covered = {case.get("rule") for case in VECTORS["cases"]} | {"json.depth"}
    assert set(JSON_RULES) <= covered


def test_deep_nesting_refused() -> None:
    data = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(IdentityError) as info:
        strict_json_loads(data, what="deep", max_bytes=len(data))
    assert info.value.rule == "json.depth"


def test_size_checked_on_str_input_too() -> None:
    with pytest.raises(IdentityError) as info:
        strict_json_loads('"é"', what="text", max_bytes=3)  # 4 UTF-8 bytes
    assert info.value.rule == "json.too_large"
    assert strict_json_loads('"é"', what="text", max_bytes=4) == "é"


def test_message_does_not_echo_a_long_key() -> None:
    key = "k" * 10_000
    data = json.dumps({key: 1, "x": 2}).replace('"x"', json.dumps(key)).encode()
    with pytest.raises(IdentityError) as info:
        strict_json_loads(data, what="doc", max_bytes=len(data))
    assert info.value.rule == "json.duplicate_key"
    assert len(str(info.value)) < 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_canonical_round_trip(value: object) -> None:
    try:
        data = canonical_json(value)
    except IdentityError as exc:  # text() can draw lone surrogates
        assert exc.rule == "json.surrogate"
        return
    assert strict_json_loads(data, what="v", max_bytes=len(data)) == value
    assert canonical_json(json.loads(data)) == data
