"""``kiln-teacher --identity-input ... --manifest-only``, run as real subprocesses."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

KILN_TEACHER = Path(sys.executable).with_name("kiln-teacher")
SECRET = "s3cr3t-teacher-api-key"
HEX = {c: c * 64 for c in "abcdef"}
TEACHER_INPUT = {
    "schema": "kiln.vllm-teacher-input.v2",
    "base_model_sha256": HEX["a"],
    "snapshot_content_sha256": HEX["b"],
    "model_config_sha256": HEX["c"],
    "tokenizer_vocab_sha256": HEX["d"],
    "tokenizer_config_sha256": HEX["e"],
    "adapter": None,
    "adapter_max_rank": None,
    "vocab_size": 152064,
    "implementation": "vllm:0.25.0",
    "runtime_versions": {
        "python": "3.12.7",
        "python_implementation": "CPython",
        "vllm": "0.25.0",
        "torch": "2.9.1+cu129",
        "transformers": "5.0.0",
        "tokenizers": "0.22.2",
    },
    "runtime_content_sha256": HEX["f"],
    "accelerator": {
        "type": "cuda",
        "driver": "nvidia:580.65;cuda-runtime:12.9",
        "devices": [
            {
                "index": 0,
                "name": "example accelerator",
                "architecture": "example-arch",
                "total_memory_bytes": 25757220864,
            }
        ],
    },
}
LIMITS = ["--served-model-id=teacher-large", "--max-top-k=32", "--max-model-len=32768"]


@pytest.fixture
def input_file(tmp_path: Path) -> Path:
    path = tmp_path / "teacher-input.json"
    path.write_text(json.dumps(TEACHER_INPUT), encoding="utf-8")
    return path


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    # An explicit, minimal environment: the launch environment is an identity
    # input, and the test runner's own variables must not leak into it.
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}


def run_teacher(
    args: list[str], env: dict[str, str], *, module: bool = False
) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "kiln_registry.launcher"] if module else [str(KILN_TEACHER)]
    return subprocess.run(
        [*command, *args], env=env, capture_output=True, timeout=60, check=False, cwd="/"
    )


def manifest_args(input_file: Path, *extra: str) -> list[str]:
    return [f"--identity-input={input_file}", *LIMITS, "--manifest-only", "--", *extra]


def manifest(input_file: Path, env: dict[str, str], *extra: str) -> bytes:
    result = run_teacher(manifest_args(input_file, *extra), env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    return result.stdout


def identity_sha(output: bytes) -> str:
    value = json.loads(output)["identity_sha256"]
    assert isinstance(value, str)
    return value


def assert_one_error_line(result: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    assert result.returncode == 2
    assert result.stdout == b""
    text = result.stderr.decode("utf-8")
    assert text.endswith("\n") and text.count("\n") == 1, text
    assert text.startswith("kiln-teacher: error: ")
    for needle in needles:
        assert needle in text, text
    return text


def test_manifest_is_one_canonical_line(input_file: Path, base_env: dict[str, str]) -> None:
    output = manifest(input_file, base_env, "--host=127.0.0.1", "--port=8000")
    assert output.endswith(b"\n") and output.count(b"\n") == 1
    document = json.loads(output)
    assert list(document) == [
        "identity", "canonical_json", "system_fingerprint", "runtime_content_sha256",
        "identity_sha256", "inference_config",
    ]  # fmt: skip
    assert document["system_fingerprint"].startswith("kiln-teacher-v1.")
    assert document["system_fingerprint"].endswith("." + document["identity_sha256"])
    assert document["runtime_content_sha256"] == TEACHER_INPUT["runtime_content_sha256"]
    canonical = document["canonical_json"].encode("utf-8")
    assert json.loads(canonical) == document["identity"]
    assert hashlib.sha256(canonical).hexdigest() == document["identity_sha256"]
    compact = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    assert output == compact
    config = document["inference_config"]
    assert config["vllm_args"] == []
    assert config["environment"] == {"PATH": "/usr/bin:/bin"}
    assert document["identity"]["served_model_id"] == "teacher-large"
    assert document["identity"]["max_prompt_logprob_candidates"] == 1_000_000


def test_output_is_byte_identical_across_runs_and_entry_points(
    input_file: Path, base_env: dict[str, str]
) -> None:
    extra = ("--dtype=float32", "--port=8000", f"--api-key={SECRET}")
    first = manifest(input_file, base_env, *extra)
    second = manifest(input_file, base_env, *extra)
    as_module = run_teacher(manifest_args(input_file, *extra), base_env, module=True)
    assert as_module.returncode == 0, as_module.stderr
    assert first == second == as_module.stdout


def test_transport_and_order_keep_the_identity(input_file: Path, base_env: dict[str, str]) -> None:
    reference = manifest(input_file, base_env, "--dtype=float32", "--seed=0", "--port=8000")
    reordered = manifest(
        input_file,
        base_env,
        "--port=9000",
        "--seed=0",
        f"--api-key={SECRET}",
        "--host=0.0.0.0",
        "--dtype=float32",
        "--disable-uvicorn-access-log",
    )
    assert reordered == reference
    assert json.loads(reference)["inference_config"]["vllm_args"] == [
        "--dtype=float32",
        "--seed=0",
    ]


@pytest.mark.parametrize(
    "change",
    [
        ("--dtype=bfloat16",),
        ("--dtype=float32", "--enforce-eager"),
        ("--dtype=float32", "--seed=1"),
    ],
)
def test_inference_options_change_the_identity(
    input_file: Path, base_env: dict[str, str], change: tuple[str, ...]
) -> None:
    reference = identity_sha(manifest(input_file, base_env, "--dtype=float32"))
    assert identity_sha(manifest(input_file, base_env, *change)) != reference


def test_device_and_determinism_variables_change_the_identity(
    input_file: Path, base_env: dict[str, str]
) -> None:
    reference = identity_sha(manifest(input_file, base_env))
    devices = identity_sha(manifest(input_file, {**base_env, "CUDA_VISIBLE_DEVICES": "1"}))
    hashseed = identity_sha(manifest(input_file, {**base_env, "PYTHONHASHSEED": "0"}))
    assert len({reference, devices, hashseed}) == 3
    # Launcher-owned KILN_* variables are consumed, not bound.
    kiln = {**base_env, "KILN_VLLM_SNAPSHOT_ROOT": str(input_file.parent)}
    assert identity_sha(manifest(input_file, kiln)) == reference


@pytest.mark.parametrize(
    ("option", "rule"),
    [
        ("--served-model=x", "policy.owned"),
        ("--max_logprobs=9", "policy.owned"),
        ("--hf-overrides.architectures=[]", "policy.path_valued"),
        ("--config=/tmp/serve.yaml", "policy.path_valued"),
        ("--trust-remote-code", "policy.owned"),
        ("--totally-new-option=1", "policy.not_reviewed"),
        ("--attention-backend=FLASH_ATTN", "policy.value"),
    ],
)
def test_refused_option_exits_2_with_one_line_naming_it(
    input_file: Path, base_env: dict[str, str], option: str, rule: str
) -> None:
    name = option.split("=", 1)[0]
    result = run_teacher(manifest_args(input_file, f"--api-key={SECRET}", option), base_env)
    text = assert_one_error_line(result, name, rule)
    assert SECRET not in text


@pytest.mark.parametrize(
    "extra",
    [
        ("--api-key", SECRET),
        (f"--api_key={SECRET}",),
        (f"--api-key={SECRET}", f"--api-key={SECRET}"),
        (f"--api-key={SECRET}", "-O3"),
        (f"--api-key={SECRET}", SECRET),
    ],
)
def test_api_key_never_printed(
    input_file: Path, base_env: dict[str, str], extra: tuple[str, ...]
) -> None:
    result = run_teacher(manifest_args(input_file, *extra), base_env)
    assert result.returncode == 2
    assert SECRET.encode() not in result.stdout + result.stderr
    ok = run_teacher(manifest_args(input_file, f"--api-key={SECRET}"), base_env)
    assert ok.returncode == 0
    assert SECRET.encode() not in ok.stdout + ok.stderr


def test_refused_environment_names_the_variable_not_its_value(
    input_file: Path, base_env: dict[str, str]
) -> None:
    value = "/secret/looking/home"
    result = run_teacher(manifest_args(input_file), {**base_env, "HF_HOME": value})
    text = assert_one_error_line(result, "HF_HOME", "env.path_valued")
    assert value not in text


def test_precomputed_input_can_never_launch(input_file: Path, base_env: dict[str, str]) -> None:
    result = run_teacher([f"--identity-input={input_file}", *LIMITS], base_env)
    assert_one_error_line(result, "launcher.mode", "can never launch")


def test_missing_or_invalid_input_file(tmp_path: Path, base_env: dict[str, str]) -> None:
    missing = run_teacher(manifest_args(tmp_path / "absent.json"), base_env)
    assert_one_error_line(missing, "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TEACHER_INPUT, "extra": 1}), encoding="utf-8")
    assert_one_error_line(run_teacher(manifest_args(bad), base_env), "bad.json")


def test_candidate_bound_is_checked(input_file: Path, base_env: dict[str, str]) -> None:
    args = [f"--identity-input={input_file}", *LIMITS, "--manifest-only"]
    ok = run_teacher([*args, "--max-prompt-logprob-candidates=33"], base_env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["identity"]["max_prompt_logprob_candidates"] == 33
    too_small = run_teacher([*args, "--max-prompt-logprob-candidates=32"], base_env)
    assert too_small.returncode == 2
    # Kiln's build_identity: at most max_model_len * min(K + 1, vocab) = 4 * 33.
    short = [f"--identity-input={input_file}", *LIMITS[:2], "--max-model-len=4", "--manifest-only"]
    above = run_teacher([*short, "--max-prompt-logprob-candidates=133"], base_env)
    assert above.returncode == 2 and b"bounds.above_model_len" in above.stderr, above.stderr


def test_help(base_env: dict[str, str]) -> None:
    result = run_teacher(["--help"], base_env)
    assert result.returncode == 0
    assert b"--manifest-only" in result.stdout
