"""compose_identity: from a precomputed input and launch options to the output document."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.compose import compose_identity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.identity.inference import inference_config_sha256
from kiln_registry.identity.input_manifest import load_teacher_input, parse_teacher_input

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "compose.json").read_text("utf-8")
)


def parsed(case: dict[str, Any]) -> Any:
    return parse_teacher_input(canonical_json(case["input"]), source=case["name"])


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["name"])
def test_vectors(case: dict[str, Any]) -> None:
    composed = compose_identity(parsed(case), **case["parameters"])
    output = composed.to_output()
    assert canonical_json(output) == canonical_json(case["output"])
    assert tuple(output) == ("identity", "identity_sha256", "fingerprint", "inference_config")
    assert verify_fingerprint(str(output["fingerprint"])) == composed.identity
    assert inference_config_sha256(composed.inference_config) == composed.inference_config_sha256
    assert composed.identity.inference_config_sha256 == composed.inference_config_sha256


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=lambda c: c["name"])
def test_invalid(case: dict[str, Any]) -> None:
    with pytest.raises(IdentityError) as info:
        compose_identity(parsed(case), **case["parameters"])
    assert info.value.rule == case["rule"]


def test_default_candidates_follow_section_6() -> None:
    case = VECTORS["cases"][0]
    composed = compose_identity(parsed(case), **case["parameters"])
    assert composed.identity.max_prompt_logprob_candidates == min(1_000_000, 32768 * 33)
    small = VECTORS["cases"][2]
    composed = compose_identity(parsed(small), **small["parameters"])
    assert composed.identity.max_prompt_logprob_candidates == 128 * 9


def test_port_and_option_order_keep_the_identity() -> None:
    case = VECTORS["cases"][1]
    params = copy.deepcopy(case["parameters"])
    first = compose_identity(parsed(case), **params).identity
    params["vllm_args"] = list(reversed(params["vllm_args"]))
    params["environment"] = dict(params["environment"], VLLM_CACHE_ROOT="/elsewhere")
    assert compose_identity(parsed(case), **params).identity == first
    params["vllm_args"] = ["--seed=1", "--dtype=float32"]
    assert compose_identity(parsed(case), **params).identity != first


def test_non_strict_allows_a_differing_adapter_name() -> None:
    case = VECTORS["cases"][1]
    params = dict(case["parameters"], served_model_id="other name")
    identity = compose_identity(parsed(case), launcher_strict=False, **params).identity
    assert identity.adapter is not None
    assert identity.adapter.name == "teacher-domain-v7"


def test_from_a_real_file(tmp_path: Path) -> None:
    case = VECTORS["cases"][0]
    path = tmp_path / "teacher-input.json"
    path.write_text(json.dumps(case["input"], indent=2), encoding="utf-8")
    output = compose_identity(load_teacher_input(path), **case["parameters"]).to_output()
    assert output == case["output"]
