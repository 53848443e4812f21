"""Section 6 response-allocation bounds, from tests/vectors/bounds.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.bounds import (
    MAX_CANDIDATES,
    default_max_candidates,
    row_width,
    validate_max_candidates,
)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "bounds.json").read_text("utf-8")
)


@pytest.mark.parametrize("case", VECTORS["defaults"], ids=str)
def test_row_width_and_default(case: dict[str, Any]) -> None:
    k, v, n = case["max_top_k"], case["vocab_size"], case["max_model_len"]
    assert row_width(k, v) == case["row_width"] == min(k + 1, v)
    assert default_max_candidates(k, v, n) == case["default"]
    assert case["default"] == min(MAX_CANDIDATES, n * case["row_width"])
    assert validate_max_candidates(case["default"], max_top_k=k, vocab_size=v, max_model_len=n)


@pytest.mark.parametrize("case", VECTORS["validate"], ids=str)
def test_validate(case: dict[str, Any]) -> None:
    kwargs = {k: case[k] for k in ("max_top_k", "vocab_size", "max_model_len")}
    if case.get("ok"):
        assert validate_max_candidates(case["value"], **kwargs) == case["value"]
    else:
        with pytest.raises(IdentityError) as info:
            validate_max_candidates(case["value"], **kwargs)
        assert info.value.rule == case["rule"]
        assert "max_prompt_logprob_candidates" in str(info.value)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0])
def test_inputs_must_be_positive_integers(bad: Any) -> None:
    with pytest.raises(IdentityError) as info:
        row_width(bad, 10)
    assert info.value.rule in {"bounds.type", "bounds.range"}
    with pytest.raises(IdentityError):
        default_max_candidates(1, 10, bad)
