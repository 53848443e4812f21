"""The launch-environment policy: which variables may reach vLLM (pure).

Owns ``check_launch_environment``.  The child's environment is an identity
input, so variables that would load other code, redirect imports or native
libraries, change a JIT compiler, or point vLLM at shared files are refused
before any model work.  Decisions (each one is tested):

* Python: ``PYTHONPATH``, ``PYTHONHOME``, the safe-path and user-site
  overrides (``PYTHONSAFEPATH``, ``PYTHONNOUSERSITE``, ``PYTHONUSERBASE``) and
  variables that run or import code at start-up (``PYTHONSTARTUP``,
  ``PYTHONINSPECT``, ``PYTHONBREAKPOINT``, ``PYTHONWARNINGS``, whose category
  names are imported) or move interpreter files (``PYTHONEXECUTABLE``,
  ``PYTHONPLATLIBDIR``, ``PYTHONPYCACHEPREFIX``) are refused: the child must
  resolve imports exactly as the hashed runtime did.  ``PYTHONHASHSEED`` is
  accepted and identity-bound.
* Every ``LD_*`` and ``DYLD_*`` loader variable is refused (``LD_PRELOAD``,
  ``LD_LIBRARY_PATH``, ``LD_AUDIT`` ... can inject native code).
* Compiler and include variables are refused: Triton and Inductor compile
  code at run time, so they would change the kernels that compute logits.
* ``XDG_CACHE_HOME`` and an ambient ``VLLM_CACHE_ROOT`` are refused: every
  launch gets a fresh private cache.  ``VLLM_PLUGINS``,
  ``VLLM_SKIP_MODEL_NAME_VALIDATION`` (any value) and every ``VLLM_*LORA*``
  variable (the LoRA resolvers) are refused, except that
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` may be ``0`` or ``false``: it is forced
  to ``0`` in any case.
* In the inference namespaces (vLLM, CUDA, ROCm/HIP, NCCL/RCCL, torch,
  Triton, Hugging Face, OpenMP, MKL, oneAPI, Level Zero ...), a variable whose
  underscore-separated name parts include a path-like word (``PATH``,
  ``FILE``, ``DIR``, ``HOME``, ``ROOT``, ``CACHE``, ``PLUGIN`` ...) is refused,
  and so is one naming a secret (``TOKEN``, ``KEY`` ...): the environment is
  printed in the inference config, and secrets belong in ``--api-key``.
* Device-visibility variables (``CUDA_VISIBLE_DEVICES`` ...) are accepted
  and identity-bound.  ``KILN_*`` variables are the launcher's own: they are
  consumed and never passed to vLLM.

Messages name the variable and the rule, never the value.
Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kiln_registry.domain.errors import PolicyError

MAX_ENV_VARIABLES = 4096
MAX_ENV_VALUE_BYTES = 32768
FORCED_CHILD_ENVIRONMENT: Mapping[str, str] = MappingProxyType(
    {"PYTHONDONTWRITEBYTECODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"}
)
LAUNCHER_PREFIX = "KILN_"

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_PYTHON_REFUSED = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSAFEPATH",
        "PYTHONNOUSERSITE",
        "PYTHONUSERBASE",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
        "PYTHONBREAKPOINT",
        "PYTHONWARNINGS",
        "PYTHONEXECUTABLE",
        "PYTHONPLATLIBDIR",
        "PYTHONPYCACHEPREFIX",
    }
)
_LOADER_PREFIXES = ("LD_", "DYLD_")
_COMPILER_REFUSED = frozenset(
    {
        "CC",
        "CXX",
        "CPP",
        "LD",
        "AR",
        "AS",
        "CFLAGS",
        "CXXFLAGS",
        "CPPFLAGS",
        "LDFLAGS",
        "LDLIBS",
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "OBJC_INCLUDE_PATH",
        "LIBRARY_PATH",
        "CUDAHOSTCXX",
        "CUDACXX",
        "NVCC",
        "NVCC_PREPEND_FLAGS",
        "NVCC_APPEND_FLAGS",
        "NVCC_CCBIN",
    }
)
_SINGLE_RULES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "XDG_CACHE_HOME": ("env.cache", "would share caches between launches"),
        "VLLM_CACHE_ROOT": ("env.cache_root", "the launcher supplies a fresh private cache"),
        "VLLM_PLUGINS": ("env.plugins", "vLLM plugins load unreviewed code"),
        "VLLM_SKIP_MODEL_NAME_VALIDATION": (
            "env.model_name_validation",
            "the served model name must always be validated",
        ),
    }
)
# Kiln's SAFE_ENV_NAME_EXCEPTIONS: a mode switch (LAZY/EAGER), not a module path.
_SAFE_NAMES = frozenset({"CUDA_MODULE_LOADING"})
_RUNTIME_LORA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
_RUNTIME_LORA_OFF = frozenset({"0", "false"})
NAMESPACES: frozenset[str] = frozenset(
    {
        "VLLM", "CUDA", "CUBLAS", "CUBLASLT", "CUDNN", "CUPTI", "NVIDIA", "NV", "NVCC",
        "HIP", "HIPBLAS", "HIPBLASLT", "HIPCC", "ROCM", "ROCR", "ROCBLAS", "MIOPEN", "HSA",
        "RCCL", "NCCL", "TORCH", "TORCHINDUCTOR", "TORCHDYNAMO", "TORCHELASTIC", "PYTORCH",
        "INDUCTOR", "TRITON", "HF", "HUGGINGFACE", "HUGGING", "TRANSFORMERS", "TOKENIZERS",
        "SAFETENSORS", "OMP", "KMP", "MKL", "ONEAPI", "ZE", "SYCL", "ONEDNN", "DNNL", "XLA",
        "TPU", "NEURON", "AITER", "FLASHINFER", "XFORMERS", "GPU", "AMD",
    }
)  # fmt: skip
# CONFIG is deliberately absent: CUBLAS_WORKSPACE_CONFIG is a determinism
# input that the identity binds, and *_CONFIG_PATH names are caught by PATH.
_PATH_PARTS = frozenset(
    {
        "CACHE", "CLASS", "CLS", "CMD", "COMMAND", "DIR", "DIRS", "DIRECTORY",
        "EXE", "EXECUTABLE", "FILE", "FILES", "HOME", "MODULE", "MODULES", "PATH", "PATHS",
        "PLUGIN", "PLUGINS", "ROOT", "SCRIPT",
    }
)  # fmt: skip
_SECRET_PARTS = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIALS", "AUTH"})
DEVICE_VISIBILITY_VARIABLES: frozenset[str] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK",
        "ONEAPI_DEVICE_SELECTOR",
        "TPU_VISIBLE_CHIPS",
        "NEURON_RT_VISIBLE_CORES",
    }
)


@dataclass(frozen=True, slots=True)
class EnvironmentDecision:
    """The environment vLLM will receive, and what the policy did to get it.

    ``child_environment`` holds values (possibly secrets of unrelated tools),
    so it stays out of ``repr``.
    """

    child_environment: Mapping[str, str] = field(repr=False)
    consumed: tuple[str, ...]
    device_visibility: tuple[str, ...]
    forced: tuple[str, ...] = tuple(sorted(FORCED_CHILD_ENVIRONMENT))


def check_launch_environment(env: Mapping[str, str]) -> EnvironmentDecision:
    """Refuse unsafe variables and return the child environment to launch with."""
    if len(env) > MAX_ENV_VARIABLES:
        raise PolicyError(
            f"the environment has {len(env)} variables; at most {MAX_ENV_VARIABLES} are accepted",
            rule="env.too_many",
        )
    child: dict[str, str] = {}
    consumed: list[str] = []
    for name, value in env.items():
        _check_variable(name, value)
        if name.startswith(LAUNCHER_PREFIX):
            consumed.append(name)
        else:
            child[name] = value
    child.update(FORCED_CHILD_ENVIRONMENT)
    return EnvironmentDecision(
        child_environment=MappingProxyType(child),
        consumed=tuple(sorted(consumed)),
        device_visibility=tuple(sorted(DEVICE_VISIBILITY_VARIABLES.intersection(child))),
    )


def _check_variable(name: str, value: str) -> None:
    if not _NAME_RE.fullmatch(name):
        raise PolicyError(
            "an environment variable has an invalid name (letters, digits and '_' only)",
            rule="env.name",
        )
    if "\x00" in value or len(value.encode("utf-8", "surrogateescape")) > MAX_ENV_VALUE_BYTES:
        raise PolicyError(
            f"{name} has a value with a NUL byte or over {MAX_ENV_VALUE_BYTES} bytes",
            rule="env.value",
        )
    if name.startswith(LAUNCHER_PREFIX):
        return
    refusal = _refusal(name, value)
    if refusal is not None:
        rule, why = refusal
        raise PolicyError(f"environment variable {name} is refused: {why}", rule=rule)


def _refusal(name: str, value: str) -> tuple[str, str] | None:
    """The (rule, reason) that refuses ``name``, or None when it is accepted."""
    if name in _PYTHON_REFUSED:
        return "env.python", "it changes how the interpreter finds or runs code"
    if name.startswith(_LOADER_PREFIXES):
        return "env.loader", "dynamic-loader variables can inject native code"
    if name in _COMPILER_REFUSED:
        return "env.compiler", "compiler and include settings change JIT-compiled kernels"
    if name in _SINGLE_RULES:
        return _SINGLE_RULES[name]
    if name in _SAFE_NAMES:
        return None
    if name == _RUNTIME_LORA:
        if value.lower() in _RUNTIME_LORA_OFF:
            return None
        return "env.runtime_lora", "runtime LoRA updates are always disabled (it is forced to 0)"
    if name.startswith("VLLM_") and "LORA" in name:
        return "env.lora", "LoRA resolvers and runtime adapters are not accepted"
    return _namespace_refusal(name)


def _namespace_refusal(name: str) -> tuple[str, str] | None:
    parts = name.split("_")
    if parts[0] not in NAMESPACES:
        return None
    if not _SECRET_PARTS.isdisjoint(parts):
        return "env.secret", "secrets must not enter the launch environment; use --api-key"
    if not _PATH_PARTS.isdisjoint(parts):
        return (
            "env.path_valued",
            "file, path, directory, home, root, cache, plugin and executable inputs are not "
            "bound by their content",
        )
    return None
