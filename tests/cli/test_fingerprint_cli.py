"""``kiln fingerprint encode|verify`` through the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

KILN = Path(sys.executable).parent / "kiln"
VECTOR_DIR = Path(__file__).parents[1] / "vectors"
VALID: list[dict[str, Any]] = json.loads(
    (VECTOR_DIR / "fingerprint_valid.json").read_text("utf-8")
)["cases"]
INVALID: list[dict[str, Any]] = json.loads(
    (VECTOR_DIR / "fingerprint_invalid.json").read_text("utf-8")
)["cases"]


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    return subprocess.run(
        [str(KILN), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def test_encode_golden(tmp_path: Path) -> None:
    golden = VALID[0]
    path = tmp_path / "identity.json"
    path.write_text(json.dumps(golden["identity"], indent=2), encoding="utf-8")
    result = kiln("fingerprint", "encode", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    output = json.loads(result.stdout)
    assert output["fingerprint"] == golden["fingerprint"]
    assert output["identity_sha256"] == golden["identity_sha256"]
    assert output["identity_revision"] == "sha256:" + golden["identity_sha256"]
    assert output["identity"] == golden["identity"]


def test_verify_round_trip_and_strict() -> None:
    case = VALID[1]  # a launcher-valid static-adapter identity
    result = kiln("fingerprint", "verify", case["fingerprint"], "--launcher-strict")
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["valid"] is True
    assert output["identity"] == case["identity"]
    assert output["identity_sha256"] == case["identity_sha256"]


def test_verify_stock_vllm_fails_with_one_line() -> None:
    result = kiln("fingerprint", "verify", "vllm-0.32.0-96a60ac7")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("kiln: error: fingerprint.prefix:")


@pytest.mark.parametrize(
    "name", ["sorted_keys", "equals_padding", "uppercase_digest", "leading_space_in_json"]
)
def test_verify_names_the_rule(name: str) -> None:
    case = next(c for c in INVALID if c["name"] == name)
    result = kiln("fingerprint", "verify", case["fingerprint"])
    assert result.returncode == 2
    assert result.stderr.startswith(f"kiln: error: {case['rule']}:")


def test_launcher_strict_refuses_the_golden_implementation() -> None:
    result = kiln("fingerprint", "verify", VALID[0]["fingerprint"], "--launcher-strict")
    assert result.returncode == 2
    assert "identity.implementation" in result.stderr


def test_encode_refusals(tmp_path: Path) -> None:
    bad = dict(VALID[0]["identity"], vocab_size=True)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    result = kiln("fingerprint", "encode", str(path))
    assert result.returncode == 2
    assert "identity.integer_type" in result.stderr and "vocab_size" in result.stderr
    duplicate = tmp_path / "dup.json"
    duplicate.write_text('{"schema": 1, "schema": 2}', encoding="utf-8")
    result = kiln("fingerprint", "encode", str(duplicate))
    assert result.returncode == 2
    assert "json.duplicate_key" in result.stderr and str(duplicate) in result.stderr
    link = tmp_path / "link.json"
    link.symlink_to(path)
    result = kiln("fingerprint", "encode", str(link))
    assert result.returncode == 2
    assert "input.not_regular" in result.stderr
    result = kiln("fingerprint", "encode", str(tmp_path / "missing.json"))
    assert result.returncode == 2
    assert "input.unreadable" in result.stderr


def test_usage_error_exits_2() -> None:
    result = kiln("fingerprint")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
