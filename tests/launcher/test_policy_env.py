"""The launch-environment policy: refusals, accepted variables, the child environment."""

from __future__ import annotations

import pytest

from kiln_registry.domain.errors import PolicyError
from kiln_registry.launcher.policy import (
    DEVICE_VISIBILITY_VARIABLES,
    FORCED_CHILD_ENVIRONMENT,
    check_launch_environment,
)
from kiln_registry.launcher.policy_env import MAX_ENV_VALUE_BYTES, MAX_ENV_VARIABLES

VALUE = "value-that-must-never-be-printed"
BASE = {"PATH": "/usr/bin:/bin", "HOME": "/home/teacher", "LANG": "C.UTF-8"}


def refusal(name: str, value: str = VALUE) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        check_launch_environment({**BASE, name: value})
    error = caught.value
    assert name in error.message
    assert value not in str(error) or not value
    assert value not in repr(error) or not value
    return error


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("PYTHONPATH", "env.python"),
        ("PYTHONHOME", "env.python"),
        ("PYTHONSAFEPATH", "env.python"),
        ("PYTHONNOUSERSITE", "env.python"),
        ("PYTHONUSERBASE", "env.python"),
        ("PYTHONSTARTUP", "env.python"),
        ("PYTHONINSPECT", "env.python"),
        ("PYTHONBREAKPOINT", "env.python"),
        ("PYTHONWARNINGS", "env.python"),
        ("PYTHONEXECUTABLE", "env.python"),
        ("PYTHONPLATLIBDIR", "env.python"),
        ("PYTHONPYCACHEPREFIX", "env.python"),
        ("LD_PRELOAD", "env.loader"),
        ("LD_LIBRARY_PATH", "env.loader"),
        ("LD_AUDIT", "env.loader"),
        ("DYLD_INSERT_LIBRARIES", "env.loader"),
        ("CC", "env.compiler"),
        ("CXX", "env.compiler"),
        ("CFLAGS", "env.compiler"),
        ("CXXFLAGS", "env.compiler"),
        ("CPPFLAGS", "env.compiler"),
        ("LDFLAGS", "env.compiler"),
        ("CPATH", "env.compiler"),
        ("C_INCLUDE_PATH", "env.compiler"),
        ("CPLUS_INCLUDE_PATH", "env.compiler"),
        ("LIBRARY_PATH", "env.compiler"),
        ("NVCC_PREPEND_FLAGS", "env.compiler"),
        ("XDG_CACHE_HOME", "env.cache"),
        ("VLLM_CACHE_ROOT", "env.cache_root"),
        ("VLLM_PLUGINS", "env.plugins"),
        ("VLLM_SKIP_MODEL_NAME_VALIDATION", "env.model_name_validation"),
        ("VLLM_LORA_RESOLVER_CACHE_DIR", "env.lora"),
        ("VLLM_LORA_RESOLVER_HF_REPO_LIST", "env.lora"),
        ("VLLM_ALLOW_RUNTIME_LORA_UPDATING_EXTRA", "env.lora"),
        ("HF_HOME", "env.path_valued"),
        ("HF_HUB_CACHE", "env.path_valued"),
        ("TRITON_CACHE_DIR", "env.path_valued"),
        ("TRITON_PTXAS_PATH", "env.path_valued"),
        ("TORCHINDUCTOR_CACHE_DIR", "env.path_valued"),
        ("TORCH_HOME", "env.path_valued"),
        ("TORCH_EXTENSIONS_DIR", "env.path_valued"),
        ("VLLM_LOGGING_CONFIG_PATH", "env.path_valued"),
        ("VLLM_CONFIG_ROOT", "env.path_valued"),
        ("VLLM_ASSETS_CACHE", "env.path_valued"),
        ("VLLM_WORKER_MULTIPROC_METHOD_MODULE", "env.path_valued"),
        ("VLLM_ATTENTION_BACKEND_CLASS", "env.path_valued"),
        ("HIPBLASLT_TUNING_OVERRIDE_FILE", "env.path_valued"),
        ("CUDA_HOME", "env.path_valued"),
        ("CUDA_PATH", "env.path_valued"),
        ("ROCM_PATH", "env.path_valued"),
        ("HIP_PATH", "env.path_valued"),
        ("NCCL_TOPO_FILE", "env.path_valued"),
        ("TRANSFORMERS_CACHE", "env.path_valued"),
        ("HUGGINGFACE_HUB_CACHE", "env.path_valued"),
        ("TRITON_HOME", "env.path_valued"),
        ("OMP_TOOL_LIBRARIES_PATH", "env.path_valued"),
        ("HF_TOKEN", "env.secret"),
        ("HUGGING_FACE_HUB_TOKEN", "env.secret"),
        ("VLLM_API_KEY", "env.secret"),
    ],
)
def test_refused_variables_name_the_variable_and_rule(name: str, rule: str) -> None:
    assert refusal(name).rule == rule


@pytest.mark.parametrize("value", ["1", "true", "yes", "", "no"])
def test_runtime_lora_updating_must_be_off(value: str) -> None:
    assert refusal("VLLM_ALLOW_RUNTIME_LORA_UPDATING", value).rule == "env.runtime_lora"


@pytest.mark.parametrize("value", ["0", "false", "False", "FALSE"])
def test_runtime_lora_off_is_accepted_and_forced_to_zero(value: str) -> None:
    decision = check_launch_environment({**BASE, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": value})
    assert decision.child_environment["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "0"


@pytest.mark.parametrize("value", ["0", "1", ""])
def test_model_name_validation_skip_is_refused_for_any_value(value: str) -> None:
    assert refusal("VLLM_SKIP_MODEL_NAME_VALIDATION", value).rule == "env.model_name_validation"


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "CUBLAS_WORKSPACE_CONFIG",
        "CUDNN_DETERMINISTIC",
        "NVIDIA_TF32_OVERRIDE",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
        "PYTORCH_CUDA_ALLOC_CONF",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_NO_USAGE_STATS",
        "VLLM_CONFIGURE_LOGGING",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TOKENIZERS_PARALLELISM",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NCCL_DEBUG",
        "DO_NOT_TRACK",
        "TERM",
        "http_proxy",
    ],
)
def test_accepted_variables_pass_through(name: str) -> None:
    decision = check_launch_environment({**BASE, name: ":4096:8"})
    assert decision.child_environment[name] == ":4096:8"


@pytest.mark.parametrize("name", sorted(DEVICE_VISIBILITY_VARIABLES))
def test_device_visibility_variables_are_accepted_and_reported(name: str) -> None:
    decision = check_launch_environment({**BASE, name: "0,1"})
    assert decision.child_environment[name] == "0,1"
    assert decision.device_visibility == (name,)


def test_child_environment_consumes_kiln_variables_and_forces_values() -> None:
    env = {
        **BASE,
        "KILN_VLLM_SNAPSHOT_ROOT": "/var/tmp/snapshots",
        "KILN_VLLM_API_KEY": VALUE,
        "PYTHONDONTWRITEBYTECODE": "",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    decision = check_launch_environment(env)
    child = dict(decision.child_environment)
    assert child == {
        **BASE,
        "CUDA_VISIBLE_DEVICES": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0",
    }
    assert decision.consumed == ("KILN_VLLM_API_KEY", "KILN_VLLM_SNAPSHOT_ROOT")
    assert decision.forced == tuple(sorted(FORCED_CHILD_ENVIRONMENT))
    assert VALUE not in repr(decision)
    assert "VLLM_CACHE_ROOT" not in child  # the launcher adds its private cache later
    assert env["PYTHONDONTWRITEBYTECODE"] == ""  # the input mapping is not modified


def test_child_environment_is_read_only() -> None:
    decision = check_launch_environment(BASE)
    with pytest.raises(TypeError):
        decision.child_environment["X"] = "1"  # type: ignore[index]


@pytest.mark.parametrize("name", ["A=B", "1ABC", "", "BAD NAME", "X\x00"])
def test_invalid_names_are_refused_without_echo(name: str) -> None:
    with pytest.raises(PolicyError) as caught:
        check_launch_environment({name: "1"})
    assert caught.value.rule == "env.name"


def test_values_are_bounded_and_free_of_nul() -> None:
    assert refusal("TERM", "a\x00b").rule == "env.value"
    assert refusal("TERM", "x" * (MAX_ENV_VALUE_BYTES + 1)).rule == "env.value"


def test_variable_count_is_bounded() -> None:
    env = {f"V{i}": "1" for i in range(MAX_ENV_VARIABLES + 1)}
    with pytest.raises(PolicyError) as caught:
        check_launch_environment(env)
    assert caught.value.rule == "env.too_many"
