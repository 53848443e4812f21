"""The launcher flag parser: forms, duplicates, integers, modes and defaults."""

from __future__ import annotations

import pytest

from kiln_registry.domain.errors import InputError, PolicyError
from kiln_registry.launcher.policy import MAX_LAUNCHER_ARGV, LauncherRequest, parse_launcher_argv

HOME = {"HOME": "/home/teacher"}
LIMITS = ["--served-model-id=teacher-large", "--max-top-k=32", "--max-model-len=32768"]
MANIFEST = ["--identity-input=/tmp/input.json", *LIMITS, "--manifest-only"]
LAUNCH = ["--model-path=/models/teacher", *LIMITS]
SECRET = "s3cr3t-api-key-value"


def parse(argv: list[str], env: dict[str, str] | None = None) -> LauncherRequest:
    return parse_launcher_argv(argv, HOME if env is None else env)


def refusal(argv: list[str], env: dict[str, str] | None = None) -> InputError:
    with pytest.raises(InputError) as caught:
        parse(argv, env)
    return caught.value


def test_manifest_request_from_the_seed_example() -> None:
    request = parse(MANIFEST)
    assert request.mode == "manifest"
    assert request.manifest_only and not request.dry_run
    assert request.identity_input == "/tmp/input.json"
    assert request.served_model_id == "teacher-large"
    assert (request.max_top_k, request.max_model_len) == (32, 32768)
    assert request.max_prompt_logprob_candidates is None
    assert request.max_provenance_read_mib_per_second is None
    assert request.model_path is None and request.adapter_path is None
    assert request.process_group_mode == "detached"
    assert request.vllm_options.transport == request.vllm_options.inference == ()


def test_full_launch_request_with_both_flag_forms() -> None:
    request = parse(
        [
            "--model-path",
            "/models/teacher",
            "--adapter-path=/adapters/domain-v7",
            "--snapshot-root",
            "/var/tmp/snapshots",
            "--cache-root=/var/tmp/caches",
            "--served-model-id",
            "teacher-domain-v7",
            "--max-top-k",
            "32",
            "--max-model-len=32768",
            "--max-prompt-logprob-candidates=1000000",
            "--max-provenance-read-mib-per-second",
            "256",
            "--process-group-mode=inherited",
            "--",
            "--host=127.0.0.1",
            "--port=8000",
            f"--api-key={SECRET}",
            "--dtype=bfloat16",
        ]
    )
    assert request.mode == "launch"
    assert request.model_path == "/models/teacher"
    assert request.adapter_path == "/adapters/domain-v7"
    assert request.snapshot_root == "/var/tmp/snapshots"
    assert request.cache_root == "/var/tmp/caches"
    assert request.max_prompt_logprob_candidates == 1_000_000
    assert request.max_provenance_read_mib_per_second == 256
    assert request.process_group_mode == "inherited"
    assert request.vllm_options.inference == ("--dtype=bfloat16",)
    assert request.vllm_options.port == 8000
    assert SECRET not in repr(request)


def test_default_roots_come_from_home_and_the_environment() -> None:
    request = parse(LAUNCH)
    assert request.snapshot_root == "/home/teacher/.cache/kiln/teacher-snapshots"
    assert request.cache_root == "/home/teacher/.cache/kiln/vllm-runtime-caches"
    env = {**HOME, "KILN_VLLM_SNAPSHOT_ROOT": "/srv/snapshots"}
    assert parse(LAUNCH, env).snapshot_root == "/srv/snapshots"
    flagged = parse([*LAUNCH, "--snapshot-root=/flag/wins"], env)
    assert flagged.snapshot_root == "/flag/wins"
    assert parse(LAUNCH, {}).snapshot_root is None
    assert parse(LAUNCH, {"HOME": "relative"}).cache_root is None


def test_empty_snapshot_root_variable_is_refused() -> None:
    error = refusal(LAUNCH, {**HOME, "KILN_VLLM_SNAPSHOT_ROOT": ""})
    assert error.rule == "launcher.snapshot_root"


@pytest.mark.parametrize(
    ("argv", "rule"),
    [
        ([*MANIFEST, "--max-top-k=32"], "launcher.duplicate"),
        ([*MANIFEST, "--manifest-only"], "launcher.duplicate"),
        ([*MANIFEST, "--served-model-id", "other"], "launcher.duplicate"),
        ([*MANIFEST, "--model=/m"], "launcher.unknown_flag"),
        ([*MANIFEST, "--max-top=32"], "launcher.unknown_flag"),
        ([*MANIFEST, "--served-model=x"], "launcher.unknown_flag"),
        ([*MANIFEST, "--max_top_k=32"], "launcher.unknown_flag"),
        ([*MANIFEST, "--dtype=half"], "launcher.unknown_flag"),
        ([*MANIFEST, "-h"], "launcher.form"),
        ([*MANIFEST, "stray"], "launcher.form"),
        ([*MANIFEST, "--manifest-only=1"], "launcher.form"),
        (["--manifest-only=true", *MANIFEST[:-1]], "launcher.form"),
        ([*LIMITS, "--identity-input"], "launcher.value"),
        (["--identity-input", "--manifest-only", *LIMITS], "launcher.value"),
        (["--identity-input=", *LIMITS, "--manifest-only"], "launcher.value"),
        (["--identity-input=/x\n", *LIMITS, "--manifest-only"], "launcher.control"),
        (["--identity-input", "/x\x00", *LIMITS, "--manifest-only"], "launcher.control"),
        (["--identity-input=/i", *LIMITS[1:], "--manifest-only"], "launcher.required"),
        (["--identity-input=/i", *LIMITS[:2], "--manifest-only"], "launcher.required"),
    ],
)
def test_flag_form_refusals(argv: list[str], rule: str) -> None:
    assert refusal(argv).rule == rule


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("max-top-k", "0"),
        ("max-top-k", "65537"),
        ("max-top-k", "+32"),
        ("max-top-k", "032"),
        ("max-top-k", "3_2"),
        ("max-top-k", " 32"),
        ("max-top-k", "32.0"),
        ("max-top-k", "-1"),
        ("max-top-k", "true"),
        ("max-top-k", "０"),
        ("max-model-len", "16777217"),
        ("max-model-len", "32k"),
        ("max-prompt-logprob-candidates", "1000001"),
        ("max-prompt-logprob-candidates", "0"),
        ("max-provenance-read-mib-per-second", "0"),
        ("max-provenance-read-mib-per-second", "16385"),
        ("process-group-mode", "attached"),
    ],
)
def test_integer_and_choice_values_are_strict(flag: str, value: str) -> None:
    argv = [*(a for a in MANIFEST if not a.startswith(f"--{flag}=")), f"--{flag}={value}"]
    assert refusal(argv).rule == "launcher.value"


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("max-top-k", "1"),
        ("max-top-k", "65536"),
        ("max-model-len", "16777216"),
        ("max-prompt-logprob-candidates", "1"),
        ("max-provenance-read-mib-per-second", "16384"),
    ],
)
def test_integer_bounds_are_inclusive(flag: str, value: str) -> None:
    argv = [*(a for a in MANIFEST if not a.startswith(f"--{flag}=")), f"--{flag}={value}"]
    request = parse(argv)
    assert int(value) in (
        request.max_top_k,
        request.max_model_len,
        request.max_prompt_logprob_candidates,
        request.max_provenance_read_mib_per_second,
    )


@pytest.mark.parametrize("served", ["-x", ".x", "a b", "a:b", "x" * 257, "é"])
def test_served_model_id_pattern(served: str) -> None:
    argv = ["--identity-input=/i", f"--served-model-id={served}", *LIMITS[1:], "--manifest-only"]
    assert refusal(argv).rule == "launcher.served_model_id"


@pytest.mark.parametrize(
    "argv",
    [
        [*MANIFEST, "--dry-run"],
        ["--identity-input=/i", *LIMITS],
        ["--identity-input=/i", *LIMITS, "--model-path=/m"],
        ["--identity-input=/i", *LIMITS, "--dry-run"],
        [*MANIFEST, "--model-path=/m"],
        [*MANIFEST, "--adapter-path=/a"],
        [*LIMITS, "--manifest-only"],
        [*LIMITS, "--dry-run"],
        LIMITS,
        [*LIMITS, "--adapter-path=/a"],
    ],
)
def test_mode_rules(argv: list[str]) -> None:
    assert refusal(argv).rule == "launcher.mode"


def test_accepted_modes() -> None:
    assert parse([*LAUNCH, "--dry-run"]).mode == "dry-run"
    assert parse(["--identity-input=/i", *LAUNCH, "--dry-run"]).dry_run
    assert parse([*LAUNCH, "--manifest-only"]).mode == "manifest"
    assert parse(LAUNCH).mode == "launch"


def test_only_the_first_delimiter_splits() -> None:
    with pytest.raises(PolicyError) as caught:
        parse([*MANIFEST, "--", "--port=1", "--", "--dtype=half"])
    assert caught.value.rule == "policy.delimiter"
    with pytest.raises(PolicyError) as caught:
        parse([*MANIFEST[:-1], "--", "--manifest-only"])
    assert caught.value.rule == "policy.not_reviewed"
    assert parse([*MANIFEST, "--"]).vllm_options.inference == ()


def test_secrets_are_never_echoed() -> None:
    # Option names (before '=') are echoed so a refusal names the option;
    # values and positional tokens never are.
    for argv in (
        [*MANIFEST, f"--api-key={SECRET}"],
        [*MANIFEST, SECRET],
        [*MANIFEST, "--api-key", SECRET],
        [*MANIFEST, "--", "--api-key", SECRET],
    ):
        with pytest.raises((InputError, PolicyError)) as caught:
            parse(argv)
        assert SECRET not in str(caught.value), argv


def test_argv_length_is_bounded() -> None:
    argv = [*MANIFEST, "--", *["--enforce-eager"] * MAX_LAUNCHER_ARGV]
    assert refusal(argv).rule == "launcher.too_many"
