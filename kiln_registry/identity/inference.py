"""The inference configuration document and its digest (docs/identity.md section 7).

Owns ``kiln.vllm-inference-config.v2``: which launch variables enter the
identity, the deterministic policy, and the exact key order of the document
``C`` whose ``hex(sha256(C))`` is ``inference_config_sha256``.

Which extra vLLM options are *accepted* is the option policy's decision
(``vllm_options/options.py``); this module receives the accepted non-transport
options and only refuses what would make the document ambiguous or leak a
transport secret.  Refusals are ``IdentityError`` with
``rule="inference.<name>"``.  Imports: standard library,
``kiln_registry.domain.errors`` and ``kiln_registry.identity`` only.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.bounds import MAX_CANDIDATES
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.digests import ADAPTER_RANK_CAPS
from kiln_registry.identity.document import (
    LOGPROBS_MODE,
    MAX_MODEL_LEN,
    MAX_TOP_K,
    check_hex,
    check_int,
    show,
)
from kiln_registry.identity.input_manifest import parse_accelerator, parse_runtime_versions

INFERENCE_SCHEMA = "kiln.vllm-inference-config.v2"
RUNTIME_CACHE_POLICY = "kiln.private-runtime-cache.v1"
ENVIRONMENT_PREFIXES: tuple[str, ...] = (
    "VLLM_",
    "CUDA_",
    "HIP_",
    "ROCM_",
    "ROCR_",
    "HSA_",
    "NCCL_",
    "RCCL_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
    "HF_",
    "OMP_",
    "MKL_",
    "ONEAPI_",
    "ZE_",
)
ENVIRONMENT_NAMES: frozenset[str] = frozenset({"GPU_DEVICE_ORDINAL", "PATH"})
ENVIRONMENT_EXCLUDED: frozenset[str] = frozenset(
    {"VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_CACHE_ROOT"}
)
DETERMINISTIC_NAMES: tuple[str, ...] = (
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDNN_DETERMINISTIC",
    "HIPBLASLT_TUNING_OVERRIDE_FILE",
    "NVIDIA_TF32_OVERRIDE",
    "PYTHONHASHSEED",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
)
# A backstop only: vllm_options/options.py classifies transport options.  These must
# never reach a hashed (and printed) document, above all the API key.
TRANSPORT_OPTIONS: frozenset[str] = frozenset(
    {"--host", "--port", "--uds", "--api-key", "--root-path", "--allowed-origins"}
)
MAX_VLLM_ARGS = 256
MAX_VLLM_ARG_BYTES = 4096
# Also a backstop: a credential in a selected variable would be hashed and printed.
SECRET_NAME_PARTS: frozenset[str] = frozenset(
    {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
)
_OPTION = re.compile(r"--[a-z0-9][a-z0-9-]*(?:=.*)?", re.DOTALL)
_SEED = re.compile(r"-?[0-9]{1,20}")


def _is_inference_variable(name: str) -> bool:
    if name in ENVIRONMENT_EXCLUDED:
        return False
    return name in ENVIRONMENT_NAMES or name.startswith(ENVIRONMENT_PREFIXES)


def _looks_secret(name: str) -> bool:
    parts = name.split("_")
    pairs = {a + b for a, b in itertools.pairwise(parts)}
    return bool(SECRET_NAME_PARTS.intersection(parts) or "APIKEY" in pairs)


def inference_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The inference-affecting launch variables, keys sorted.

    A selected variable whose name says it holds a credential (``HF_TOKEN``,
    ``VLLM_API_KEY``) is refused, naming the variable and never its value.
    """
    selected = {name: value for name, value in env.items() if _is_inference_variable(name)}
    for name, value in selected.items():
        if _looks_secret(name):
            raise IdentityError(
                f"environment variable {name} looks like a credential; it must not be bound"
                " into (and printed with) the identity",
                rule="inference.secret_variable",
                hint="unset it for the launch; the API key goes to vLLM as a transport option",
            )
        if not isinstance(value, str):
            raise IdentityError(
                f"environment variable {name} has a non-text value", rule="inference.env_value"
            )
    return dict(sorted(selected.items()))


def deterministic_environment(env: Mapping[str, str]) -> dict[str, str | None]:
    """The six determinism variables in the spec's order, each its value or null."""
    result: dict[str, str | None] = {}
    for name in DETERMINISTIC_NAMES:
        value = env.get(name)
        if value is not None and not isinstance(value, str):
            raise IdentityError(
                f"environment variable {name} has a non-text value", rule="inference.env_value"
            )
        result[name] = value
    return result


def _option_name(arg: object, index: int) -> str:
    if not isinstance(arg, str) or _OPTION.fullmatch(arg) is None:
        raise IdentityError(
            f"vllm_args[{index}] is not a '--key=value' or '--switch' string",
            rule="inference.arg_format",
        )
    if len(arg.encode("utf-8", "surrogatepass")) > MAX_VLLM_ARG_BYTES:
        raise IdentityError(
            f"vllm_args[{index}] is over {MAX_VLLM_ARG_BYTES} bytes", rule="inference.arg_size"
        )
    name = arg.split("=", 1)[0]
    if name in TRANSPORT_OPTIONS or name.startswith("--ssl-"):
        # Name the option only: its value may be a secret.
        raise IdentityError(
            f"vllm_args holds the transport option {name}; transport never enters the identity",
            rule="inference.transport_option",
        )
    return name


def _checked_args(vllm_args: Sequence[str]) -> list[str]:
    if isinstance(vllm_args, str) or len(vllm_args) > MAX_VLLM_ARGS:
        raise IdentityError(
            f"vllm_args must be a list of at most {MAX_VLLM_ARGS} options",
            rule="inference.arg_count",
        )
    seen: set[str] = set()
    for index, arg in enumerate(vllm_args):
        name = _option_name(arg, index)
        if name in seen:
            raise IdentityError(
                f"vllm_args gives {name} more than once", rule="inference.duplicate_option"
            )
        seen.add(name)
    return sorted(vllm_args)


def _seed(args: Sequence[str]) -> str | None:
    """The text of ``--seed=`` exactly as given (Kiln writes the string, not a number)."""
    for arg in args:
        if arg == "--seed" or arg.startswith("--seed="):
            value = arg[len("--seed=") :]
            if _SEED.fullmatch(value) is None:
                raise IdentityError(
                    f"--seed needs an integer value, got {show(value)}", rule="inference.seed"
                )
            return value
    return None


def _adapter_rank(adapter_enabled: object, adapter_max_rank: object) -> int | None:
    if not isinstance(adapter_enabled, bool):
        raise IdentityError("adapter_enabled must be a boolean", rule="inference.adapter")
    if not adapter_enabled:
        if adapter_max_rank is not None:
            raise IdentityError(
                "adapter_max_rank must be null without an adapter", rule="inference.adapter"
            )
        return None
    if (
        not isinstance(adapter_max_rank, int)
        or isinstance(adapter_max_rank, bool)
        or adapter_max_rank not in ADAPTER_RANK_CAPS
    ):
        raise IdentityError(
            f"adapter_max_rank must be one of {list(ADAPTER_RANK_CAPS)},"
            f" got {show(adapter_max_rank)}",
            rule="inference.adapter",
        )
    return adapter_max_rank


def _head(
    snapshot_content_sha256: str,
    model_config_sha256: str,
    max_top_k: int,
    max_model_len: int,
    max_prompt_logprob_candidates: int,
) -> dict[str, object]:
    """The first six keys of ``C``, each value checked."""
    p = "inference"
    return {
        "schema": INFERENCE_SCHEMA,
        "snapshot_content_sha256": check_hex(
            snapshot_content_sha256, "snapshot_content_sha256", prefix=p
        ),
        "model_config_sha256": check_hex(model_config_sha256, "model_config_sha256", prefix=p),
        "max_top_k": check_int(max_top_k, "max_top_k", 1, MAX_TOP_K, prefix=p),
        "max_model_len": check_int(max_model_len, "max_model_len", 1, MAX_MODEL_LEN, prefix=p),
        "max_prompt_logprob_candidates": check_int(
            max_prompt_logprob_candidates, "max_prompt_logprob_candidates", 1, MAX_CANDIDATES,
            prefix=p,
        ),
    }  # fmt: skip


def inference_config_document(
    *,
    snapshot_content_sha256: str,
    model_config_sha256: str,
    max_top_k: int,
    max_model_len: int,
    max_prompt_logprob_candidates: int,
    adapter_enabled: bool,
    adapter_max_rank: int | None,
    vllm_args: Sequence[str],
    environment: Mapping[str, str],
    runtime_versions: Mapping[str, str],
    runtime_content_sha256: str,
    accelerator: Mapping[str, object],
) -> dict[str, object]:
    """Document ``C`` with every key in the spec's order (the exact hashed value)."""
    args = _checked_args(vllm_args)
    document = _head(
        snapshot_content_sha256,
        model_config_sha256,
        max_top_k,
        max_model_len,
        max_prompt_logprob_candidates,
    )
    document.update(
        logprobs_mode=LOGPROBS_MODE,
        generation_config="vllm",
        load_format="safetensors",
        adapter_enabled=adapter_enabled,
        adapter_max_rank=_adapter_rank(adapter_enabled, adapter_max_rank),
        runtime_lora_updates=False,
        vllm_args=args,
        environment=inference_environment(environment),
        deterministic_policy={
            "seed": _seed(args),
            "enforce_eager": "--enforce-eager" in args,
            "environment": deterministic_environment(environment),
        },
        runtime_versions=parse_runtime_versions(runtime_versions, "runtime_versions"),
        runtime_content_sha256=check_hex(
            runtime_content_sha256, "runtime_content_sha256", prefix="inference"
        ),
        accelerator=parse_accelerator(accelerator, "accelerator").to_dict(),
        runtime_cache_policy=RUNTIME_CACHE_POLICY,
    )
    return document


def inference_config_bytes(doc: Mapping[str, object]) -> bytes:
    """``C``: the canonical bytes of the document, in the order it was built."""
    return canonical_json(dict(doc))


def inference_config_sha256(doc: Mapping[str, object]) -> str:
    """``inference_config_sha256 = hex(sha256(C))``."""
    return hashlib.sha256(inference_config_bytes(doc)).hexdigest()
