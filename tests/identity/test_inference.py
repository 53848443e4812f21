"""Section 7: the inference config document, its selection rules and its digest."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.inference import (
    DETERMINISTIC_NAMES,
    INFERENCE_SCHEMA,
    deterministic_environment,
    inference_config_bytes,
    inference_config_document,
    inference_config_sha256,
    inference_environment,
)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "inference_config.json").read_text("utf-8")
)
KEY_ORDER = (
    "schema", "snapshot_content_sha256", "model_config_sha256", "max_top_k", "max_model_len",
    "max_prompt_logprob_candidates", "logprobs_mode", "generation_config", "load_format",
    "adapter_enabled", "adapter_max_rank", "runtime_lora_updates", "vllm_args", "environment",
    "deterministic_policy", "runtime_versions", "runtime_content_sha256", "accelerator",
    "runtime_cache_policy",
)  # fmt: skip


def arguments(change: dict[str, Any] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = copy.deepcopy(VECTORS["arguments"])
    result.update(copy.deepcopy(change or {}))
    return result


def test_golden_document() -> None:
    document = inference_config_document(**arguments())
    assert tuple(document) == KEY_ORDER
    assert document["schema"] == INFERENCE_SCHEMA
    data = inference_config_bytes(document)
    assert data == VECTORS["canonical"].encode("utf-8")
    assert inference_config_sha256(document) == VECTORS["sha256"]
    assert VECTORS["sha256"] == hashlib.sha256(data).hexdigest()


def test_golden_policy_fields() -> None:
    document = inference_config_document(**arguments())
    assert document["vllm_args"] == sorted(VECTORS["arguments"]["vllm_args"])
    policy = document["deterministic_policy"]
    assert isinstance(policy, dict)
    assert policy["seed"] == "0"  # the text of --seed, as Kiln writes it
    assert policy["enforce_eager"] is True
    assert tuple(policy["environment"]) == DETERMINISTIC_NAMES
    assert document["runtime_lora_updates"] is False
    assert document["runtime_cache_policy"] == "kiln.private-runtime-cache.v1"


@pytest.mark.parametrize("case", VECTORS["same_digest"], ids=lambda c: c["name"])
def test_changes_that_keep_the_digest(case: dict[str, Any]) -> None:
    document = inference_config_document(**arguments(case["change"]))
    assert inference_config_sha256(document) == VECTORS["sha256"]


@pytest.mark.parametrize("case", VECTORS["changes_digest"], ids=lambda c: c["name"])
def test_changes_that_alter_the_digest(case: dict[str, Any]) -> None:
    document = inference_config_document(**arguments(case["change"]))
    assert inference_config_sha256(document) != VECTORS["sha256"]


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=lambda c: c["name"])
def test_invalid(case: dict[str, Any]) -> None:
    with pytest.raises(IdentityError) as info:
        inference_config_document(**arguments(case["change"]))
    assert info.value.rule == case["rule"]
    for secret in ("s3cret", "hf_secret", "secret"):
        assert secret not in str(info.value).replace("secret_variable", "")


def test_environment_selection() -> None:
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": "/c",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0",
        "CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "1",
        "HSA_OVERRIDE_GFX_VERSION": "11.0.0", "NCCL_P2P_DISABLE": "1", "RCCL_X": "1",
        "TORCH_X": "1", "PYTORCH_X": "1", "TRITON_X": "1", "HF_HUB_OFFLINE": "1", "OMP_X": "1",
        "MKL_X": "1", "ONEAPI_X": "1", "ZE_X": "1", "ROCM_X": "1", "GPU_DEVICE_ORDINAL": "0",
        "PATH": "/bin", "HOME": "/h", "VLLMX": "1", "CUDA": "1", "HIPBLASLT_X": "1",
        "PYTHONHASHSEED": "0", "LD_PRELOAD": "x",
    }  # fmt: skip
    selected = inference_environment(env)
    assert list(selected) == sorted(selected)
    assert set(selected) == {
        "VLLM_CPU_KVCACHE_SPACE", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "NCCL_P2P_DISABLE", "RCCL_X",
        "TORCH_X", "PYTORCH_X", "TRITON_X", "HF_HUB_OFFLINE", "OMP_X", "MKL_X", "ONEAPI_X",
        "ZE_X", "ROCM_X", "GPU_DEVICE_ORDINAL", "PATH",
    }  # fmt: skip


def test_deterministic_environment_order_and_nulls() -> None:
    result = deterministic_environment({"PYTHONHASHSEED": "0", "OTHER": "1"})
    assert tuple(result) == DETERMINISTIC_NAMES
    assert result["PYTHONHASHSEED"] == "0"
    assert result["CUBLAS_WORKSPACE_CONFIG"] is None


def test_no_seed_is_null_and_plural_tokens_variable_is_not_a_secret() -> None:
    env = {"VLLM_MAX_TOKENS_PER_BATCH": "8", "PATH": "/bin"}
    document = inference_config_document(**arguments({"vllm_args": [], "environment": env}))
    policy = document["deterministic_policy"]
    assert isinstance(policy, dict)
    assert policy["seed"] is None
    assert policy["enforce_eager"] is False
    assert document["environment"] == {"PATH": "/bin", "VLLM_MAX_TOKENS_PER_BATCH": "8"}


def test_argument_limits() -> None:
    too_many = [f"--opt-{i}=1" for i in range(257)]
    with pytest.raises(IdentityError) as info:
        inference_config_document(**arguments({"vllm_args": too_many}))
    assert info.value.rule == "inference.arg_count"
    with pytest.raises(IdentityError) as info:
        inference_config_document(**arguments({"vllm_args": ["--x=" + "v" * 5000]}))
    assert info.value.rule == "inference.arg_size"
    with pytest.raises(IdentityError) as info:
        inference_config_document(**arguments({"vllm_args": "--dtype=float32"}))
    assert info.value.rule == "inference.arg_count"
