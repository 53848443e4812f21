"""The launcher's bytes against Kiln's launcher (issue 14, items 11 and 12).

Every input below is a test value of Kiln's own launcher tests,
``ericflo/kiln scripts/qualification/tests/test_vllm_teacher.py`` (newest
stored version, commit 48b0727): ``A_HASH``..``E_HASH``, ``RUNTIME_VERSIONS``,
``ACCELERATOR``, ``_manifest()``, ``MainTests._common()``, the argument and
environment cases of ``ArgumentAndCommandTests`` and the version cases of
``IdentityTests``.  The expected inference document ``C`` is written out here
by hand from the layout of ``ericflo/kiln scripts/vllm_teacher.py`` (commit
f1b710f: ``inference_config_fingerprint``, ``_deterministic_policy``,
``json.dumps(..., ensure_ascii=False, allow_nan=False, separators=(",", ":"))``)
and compared byte for byte.  Kiln's tests pin no inference digest; the two
below are ``sha256`` of those hand-written bytes.

Deliberate difference (kept, see the compatibility page): this project's ``C``
ends with ``"runtime_cache_policy":"kiln.private-runtime-cache.v1"``, so its
``inference_config_sha256`` is the digest of Kiln's bytes with that one key
appended; everything before it is Kiln's, byte for byte.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityError, KilnError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.compose import compose_identity
from kiln_registry.identity.digests import tokenizer_vocab_sha256
from kiln_registry.identity.inference import inference_config_bytes, inference_config_document
from kiln_registry.identity.input_manifest import parse_teacher_input
from kiln_registry.launcher.policy_env import check_launch_environment
from kiln_registry.model.tokenizer import TokenizerView, backend_config_sha256
from kiln_registry.vllm_options.options import classify_vllm_options

KILN_TEACHER = Path(sys.executable).with_name("kiln-teacher")
A_HASH, B_HASH, C_HASH, D_HASH, E_HASH = (c * 64 for c in "abcde")
RUNTIME_VERSIONS = {
    "python": "3.12.7",
    "python_implementation": "CPython",
    "vllm": "0.25.0",
    "torch": "2.9.1+rocm7.1",
    "transformers": "5.0.0",
    "tokenizers": "0.22.2",
}
ACCELERATOR = {
    "type": "rocm",
    "driver": "amdgpu:6.14.0;hip-runtime:7.1",
    "devices": [
        {
            "index": 0,
            "name": "AMD Radeon 8060S",
            "architecture": "gfx1151",
            "total_memory_bytes": 128 * 1024**3,
        }
    ],
}
KILN_INPUT: dict[str, Any] = {  # test_vllm_teacher.py: _manifest()
    "schema": "kiln.vllm-teacher-input.v2",
    "base_model_sha256": A_HASH,
    "snapshot_content_sha256": A_HASH,
    "model_config_sha256": D_HASH,
    "tokenizer_vocab_sha256": B_HASH,
    "tokenizer_config_sha256": C_HASH,
    "adapter": None,
    "adapter_max_rank": None,
    "vocab_size": 8,
    "implementation": "vllm:0.25.0",
    "runtime_versions": RUNTIME_VERSIONS,
    "runtime_content_sha256": E_HASH,
    "accelerator": ACCELERATOR,
}
KILN_COMMON = [  # test_vllm_teacher.py: MainTests._common() (less the input path)
    "--served-model-id", "teacher-qwen", "--max-top-k", "5", "--max-model-len", "4096",
]  # fmt: skip
KILN_KEYS = ["identity", "canonical_json", "system_fingerprint", "runtime_content_sha256"]
CACHE_POLICY_SUFFIX = b',"runtime_cache_policy":"kiln.private-runtime-cache.v1"}'
NO_DETERMINISM_ENV = (
    '{"CUBLAS_WORKSPACE_CONFIG":null,"CUDNN_DETERMINISTIC":null,'
    '"HIPBLASLT_TUNING_OVERRIDE_FILE":null,"NVIDIA_TF32_OVERRIDE":null,'
    '"PYTHONHASHSEED":null,"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE":null}'
)
KILN_TAIL = (
    '"runtime_versions":{"python":"3.12.7","python_implementation":"CPython",'
    '"vllm":"0.25.0","torch":"2.9.1+rocm7.1","transformers":"5.0.0","tokenizers":"0.22.2"},'
    '"runtime_content_sha256":"' + E_HASH + '",'
    '"accelerator":{"type":"rocm","driver":"amdgpu:6.14.0;hip-runtime:7.1",'
    '"devices":[{"index":0,"name":"AMD Radeon 8060S","architecture":"gfx1151",'
    '"total_memory_bytes":137438953472}]}}'
)
# sha256 of kiln_c(...) for MainTests' manifest-only inputs, without and with --seed=0.
KILN_DIGEST_NO_SEED = "fe58264b6c3e34e067dbd018b0b1e434ae859e14dc2b6326b93775a380c2faf8"
KILN_DIGEST_SEED_0 = "18348f72b4ae2586a78e8b45e6468e3cc32ea17e9069740fcde614bdf87034da"


def kiln_c(
    *, snapshot: str, model_config: str, top_k: int, model_len: int, candidates: int,
    args: str, env: str, seed: str, eager: str = "false",
) -> bytes:  # fmt: skip
    """Kiln's ``C`` for these values, key by key as vllm_teacher.py writes it."""
    return (
        '{"schema":"kiln.vllm-inference-config.v2",'
        f'"snapshot_content_sha256":"{snapshot}","model_config_sha256":"{model_config}",'
        f'"max_top_k":{top_k},"max_model_len":{model_len},'
        f'"max_prompt_logprob_candidates":{candidates},"logprobs_mode":"raw_logprobs",'
        '"generation_config":"vllm","load_format":"safetensors","adapter_enabled":false,'
        '"adapter_max_rank":null,"runtime_lora_updates":false,'
        f'"vllm_args":{args},"environment":{env},'
        f'"deterministic_policy":{{"seed":{seed},"enforce_eager":{eager},'
        f'"environment":{NO_DETERMINISM_ENV}}},' + KILN_TAIL
    ).encode("utf-8")


def ours_from_kiln(kiln_bytes: bytes) -> bytes:
    """Kiln's bytes with this project's one trailing key (kept deliberately)."""
    assert kiln_bytes.endswith(b"}")
    return kiln_bytes[:-1] + CACHE_POLICY_SUFFIX


def run_manifest(tmp_path: Path, *extra: str) -> dict[str, Any]:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(KILN_INPUT), encoding="utf-8")
    argv = [str(KILN_TEACHER), *KILN_COMMON, "--identity-input", str(path), "--manifest-only"]
    # MainTests clears the environment (mock.patch.dict(os.environ, {}, clear=True)).
    done = subprocess.run(
        [*argv, "--", *extra], env={}, capture_output=True, timeout=60, check=False, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    document = json.loads(done.stdout)
    assert isinstance(document, dict)
    return document


@pytest.mark.parametrize(
    ("extra", "args", "seed", "kiln_digest"),
    [((), "[]", "null", KILN_DIGEST_NO_SEED),
     (("--seed=0",), '["--seed=0"]', '"0"', KILN_DIGEST_SEED_0)],
)  # fmt: skip
def test_manifest_only_prints_kilns_keys_and_bytes(
    tmp_path: Path, extra: tuple[str, ...], args: str, seed: str, kiln_digest: str
) -> None:
    """MainTests.test_manifest_only_is_dependency_free_json, byte for byte."""
    document = run_manifest(tmp_path, *extra)
    assert list(document) == [*KILN_KEYS, "identity_sha256", "inference_config"]
    assert document["runtime_content_sha256"] == E_HASH
    kiln = kiln_c(
        snapshot=A_HASH, model_config=D_HASH, top_k=5, model_len=4096,
        candidates=24576, args=args, env="{}", seed=seed,
    )  # fmt: skip
    assert hashlib.sha256(kiln).hexdigest() == kiln_digest
    ours = canonical_json(document["inference_config"])
    assert ours == ours_from_kiln(kiln)
    identity_json = (
        '{"schema":"kiln.teacher-identity.v1",'
        '"protocol":"vllm.prompt-logprobs.numeric-token-ids.causal.v1",'
        f'"served_model_id":"teacher-qwen","base_model_sha256":"{A_HASH}",'
        f'"tokenizer_vocab_sha256":"{B_HASH}","tokenizer_config_sha256":"{C_HASH}",'
        '"adapter":null,"vocab_size":8,"max_top_k":5,"max_model_len":4096,'
        '"max_prompt_logprob_candidates":24576,"logprobs_mode":"raw_logprobs",'
        '"implementation":"vllm:0.25.0",'
        f'"inference_config_sha256":"{hashlib.sha256(ours).hexdigest()}"}}'
    )
    assert document["canonical_json"] == identity_json
    assert document["identity"] == json.loads(identity_json)
    payload = identity_json.encode("utf-8")
    encoded = base64.urlsafe_b64encode(payload).decode("ascii").rstrip("=")
    digest = hashlib.sha256(payload).hexdigest()
    assert document["system_fingerprint"] == f"kiln-teacher-v1.{encoded}.{digest}"
    assert document["identity_sha256"] == digest


def kiln_argument_case(**change: Any) -> dict[str, Any]:
    """ArgumentAndCommandTests.test_inference_hash_...: its kwargs, with one change."""
    kwargs: dict[str, Any] = {
        "snapshot_content_sha256": D_HASH,
        "model_config_sha256": A_HASH,
        "max_top_k": 20,
        "max_model_len": 4096,
        "max_prompt_logprob_candidates": 20_000,
        "adapter_enabled": False,
        "adapter_max_rank": None,
        "runtime_versions": copy.deepcopy(RUNTIME_VERSIONS),
        "runtime_content_sha256": E_HASH,
        "accelerator": copy.deepcopy(ACCELERATOR),
    }
    default = ["--dtype=bfloat16", "--tensor-parallel-size=2", "--port=8000"]
    extra = change.pop("extra_args", default)
    environment = change.pop("environment", {"CUDA_VISIBLE_DEVICES": "0,1"})
    kwargs.update(change)
    # Kiln drops transport options while hashing; here the launcher policy splits them off.
    kwargs["vllm_args"] = list(classify_vllm_options(extra).inference)
    kwargs["environment"] = environment
    return kwargs


def case_bytes(**change: Any) -> bytes:
    return inference_config_bytes(inference_config_document(**kiln_argument_case(**change)))


def test_inference_document_is_kilns_for_kilns_argument_case() -> None:
    kiln = kiln_c(
        snapshot=D_HASH, model_config=A_HASH, top_k=20, model_len=4096, candidates=20000,
        args='["--dtype=bfloat16","--tensor-parallel-size=2"]',
        env='{"CUDA_VISIBLE_DEVICES":"0,1"}', seed="null",
    )  # fmt: skip
    assert case_bytes() == ours_from_kiln(kiln)


@pytest.mark.parametrize(
    "change",
    [
        {"extra_args": ["--port=9000", "--tensor-parallel-size=2", "--dtype=bfloat16"]},
        {"environment": {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_CACHE_ROOT": "/tmp/private"}},
    ],
    ids=["reordered", "derived_cache"],
)
def test_kilns_same_digest_cases(change: dict[str, Any]) -> None:
    assert case_bytes(**change) == case_bytes()


@pytest.mark.parametrize(
    "change",
    [
        {"extra_args": ["--dtype=float16", "--tensor-parallel-size=2"]},
        {"environment": {"CUDA_VISIBLE_DEVICES": "2,3"}},
        {"model_config_sha256": B_HASH},
        {"runtime_versions": {**RUNTIME_VERSIONS, "torch": "2.9.2+rocm7.1"}},
        {"runtime_content_sha256": A_HASH},
        {"accelerator": {**ACCELERATOR, "devices": [
            {**ACCELERATOR["devices"][0], "architecture": "gfx1201"}]}},  # type: ignore[dict-item]
        {"environment": {"ROCR_VISIBLE_DEVICES": "1"}},
        {"environment": {"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/opt/toolchain/bin"}},
    ],
    ids=["dtype", "gpu", "model_config", "runtime", "runtime_content", "accelerator",
         "rocm_visibility", "tool_path"],
)  # fmt: skip
def test_kilns_changed_digest_cases(change: dict[str, Any]) -> None:
    assert case_bytes(**change) != case_bytes()


def test_kilns_determinism_case_writes_the_seed_text() -> None:
    document = inference_config_document(
        **kiln_argument_case(
            extra_args=["--dtype=bfloat16", "--tensor-parallel-size=2", "--seed=7"],
            environment={"CUDA_VISIBLE_DEVICES": "0,1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
        )
    )
    policy = document["deterministic_policy"]
    assert isinstance(policy, dict)
    assert policy["seed"] == "7"
    assert policy["environment"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def input_with_version(version: str) -> Any:
    value: dict[str, Any] = copy.deepcopy(KILN_INPUT)
    value["implementation"] = "vllm:" + version
    value["runtime_versions"] = {**RUNTIME_VERSIONS, "vllm": version}
    return parse_teacher_input(canonical_json(value), source="input.json")


def compose_version(version: str) -> str:
    composed = compose_identity(
        input_with_version(version), served_model_id="teacher-qwen", max_top_k=5,
        max_model_len=4096, max_prompt_logprob_candidates=20_000, vllm_args=[],
        environment={}, launcher_strict=True,
    )  # fmt: skip
    return composed.identity.implementation


@pytest.mark.parametrize(
    "version",
    # IdentityTests: 0.20.1rc0, 0.25.0 and 0.25.1+cu129 are accepted; issue 14 item 11 lists
    # the suffixes Kiln's VERSION_RE accepts (the suffix is ignored).
    ["0.20.1rc0", "0.25.0", "0.25.1+cu129", "0.20.1.dev5+g0123abcd", "0.20.1a0", "0.20.1-custom"],
)
def test_versions_kiln_accepts(version: str) -> None:
    assert compose_version(version) == "vllm:" + version


@pytest.mark.parametrize("version", ["0.20.0", "0.19.9", "0.20", "latest", "v0.20.1", "0.20.1 x"])
def test_versions_kiln_refuses(version: str) -> None:
    """IdentityTests refuses vllm:0.20.0; the rest fail Kiln's VERSION_RE or its minimum."""
    with pytest.raises(IdentityError) as info:
        compose_version(version)
    assert info.value.rule in ("identity.implementation", "input.text_control")


def test_kilns_accepted_extra_args() -> None:
    """ArgumentAndCommandTests.test_extra_args_are_unambiguous_unique_and_launcher_owned."""
    options = classify_vllm_options(
        ["--dtype=bfloat16", "--attention-backend=TRITON_ATTN", "--language-model-only",
         "--enforce-eager", "--api-key=$(touch /tmp/nope)"]
    )  # fmt: skip
    assert options.inference == (
        "--dtype=bfloat16", "--attention-backend=TRITON_ATTN", "--language-model-only",
        "--enforce-eager",
    )  # fmt: skip
    assert options.transport == ("--api-key=$(touch /tmp/nope)",)


def test_transport_split_is_kilns() -> None:
    """vllm_teacher.py TRANSPORT_OPTIONS: --disable-log-stats is not transport, so it is hashed."""
    options = classify_vllm_options(
        ["--disable-log-stats", "--enable-offline-docs", "--disable-fastapi-docs",
         "--uvicorn-log-level=info", "--allow-credentials", "--ssl-keyfile=/etc/tls/key.pem"]
    )  # fmt: skip
    assert options.inference == ("--disable-log-stats",)
    assert len(options.transport) == 5


@pytest.mark.parametrize(
    "args",
    [["--dtype", "bfloat16"], ["-p=8000"], ["--dtype=f16", "--dtype=bf16"],
     ["--language-model-only=true"], ["--model=/tmp/model"], ["--enable-lora"],
     ["--enable-prompt-adapter"], ["--middleware=x:y"], ["--load-format=dummy"],
     ["--quantization-param-path=/tmp/q.json"], ["--speculative-model=/tmp/draft"],
     ['--compilation-config={"cache_dir":"/tmp/cache"}'],
     ["--attention-backend=package.CustomBackend"], ["--attention-backend=ROCM_ATTN"],
     ["--brand-new-option=value"]],
)  # fmt: skip
def test_kilns_refused_extra_args(args: list[str]) -> None:
    with pytest.raises(KilnError):
        classify_vllm_options(args)


@pytest.mark.parametrize(
    ("name", "value"),
    [*((name, "/tmp/unbound") for name in (
        "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HIPBLASLT_TUNING_OVERRIDE_FILE", "CC",
        "LIBRARY_PATH", "NVCC", "VLLM_NCCL_SO_PATH", "VLLM_LOGGING_CONFIG_PATH",
        "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT")),
     ("VLLM_PLUGINS", "lora_filesystem_resolver"), ("VLLM_SKIP_MODEL_NAME_VALIDATION", "true")],
)  # fmt: skip
def test_kilns_refused_launch_variables(name: str, value: str) -> None:
    """test_launch_environment_disables_mutation_and_rejects_resolver_plugins."""
    with pytest.raises(KilnError) as info:
        check_launch_environment({name: value})
    assert name in str(info.value)


@pytest.mark.parametrize(
    "name",
    # vllm_teacher.py FORBIDDEN_FILE_ENV_KEYS: file or code inputs a path cannot bind.
    ["CC", "CPATH", "CPLUS_INCLUDE_PATH", "CUDAHOSTCXX", "CUDACXX", "CXX", "C_INCLUDE_PATH",
     "HIPBLASLT_TUNING_OVERRIDE_FILE", "LD_LIBRARY_PATH", "LD_PRELOAD", "LIBRARY_PATH", "NVCC",
     "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONPATH", "PYTHONSAFEPATH", "XDG_CACHE_HOME"],
)  # fmt: skip
def test_kilns_forbidden_file_variables(name: str) -> None:
    with pytest.raises(KilnError) as info:
        check_launch_environment({name: "/tmp/unbound"})
    assert name in str(info.value)


def test_kilns_safe_names_are_accepted_and_bound() -> None:
    """vllm_teacher.py SAFE_ENV_NAME_EXCEPTIONS: CUDA_MODULE_LOADING and PATH are hashed."""
    child = check_launch_environment(
        {"CUDA_MODULE_LOADING": "LAZY", "PATH": "/usr/bin:/bin"}
    ).child_environment
    document = inference_config_document(**kiln_argument_case(environment=child))
    assert document["environment"] == {"CUDA_MODULE_LOADING": "LAZY", "PATH": "/usr/bin:/bin"}


def test_secret_looking_variable_is_refused_not_hashed() -> None:
    """Kept deliberately: Kiln would hash (and print) HF_TOKEN's value in C."""
    secret = "hf_conformance_secret_value"
    with pytest.raises(KilnError) as info:
        check_launch_environment({"HF_TOKEN": secret})
    assert "HF_TOKEN" in str(info.value) and secret not in str(info.value)
    with pytest.raises(IdentityError) as backstop:
        inference_config_document(**kiln_argument_case(environment={"HF_TOKEN": secret}))
    assert backstop.value.rule == "inference.secret_variable"
    assert secret not in str(backstop.value)


def test_tokenizer_backend_json_is_parsed_strictly_then_hashed() -> None:
    """FilesystemFingerprintTests.test_tokenizer_config_hashes_canonical_backend_json_..."""
    backend = '{"version":"1.0","model":{"type":"BPE"}}'
    view = TokenizerView("tokenizer.json", {}, 0, backend)
    assert backend_config_sha256(view) == hashlib.sha256(backend.encode()).hexdigest()
    for bad, rule in (('{"version":1,"version":2}', "json.duplicate_key"),
                      ('{"version":NaN}', "json.non_finite"), ("[]", "tokenizer.backend_json"),
                      ("", "tokenizer.backend_json")):  # fmt: skip
        with pytest.raises(IdentityError) as info:
            backend_config_sha256(TokenizerView("tokenizer.json", {}, 0, bad))
        assert info.value.rule == rule


def test_tokenizer_vocab_golden_vector() -> None:
    """TokenizerVocabFingerprintTests.test_matches_rust_cross_runtime_golden_vector."""
    digest = tokenizer_vocab_sha256({"a": 0, "b": 1}, vocab_size_with_added=2, model_width=2)
    assert digest == "0e7ed7c4b2c375344d31b534f7cbb119b528114f1301f09d6642801b100710ff"
