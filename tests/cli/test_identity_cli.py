"""``kiln identity`` and ``kiln digest``: JSON on stdout, one-line errors, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_registry.cli.main import run
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.model.inspect import inspect_model
from tests.model.builders import tokenizer_entries, tokenizer_json, write_adapter, write_model

GOLDEN_WEIGHT_V1 = "aa7e9961df654af2a7405c5d2c07eb5a72b58f86060035c245c3415793c459c1"
KILN = [str(Path(sys.executable).parent / "kiln")]  # the installed console script


def ok(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert run(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    value = json.loads(out)
    assert isinstance(value, dict)
    return value


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], rule: str) -> str:
    assert run(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("kiln: error: ")
    assert rule in err
    return err


def test_identity_tokenizers_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_model(tmp_path / "m")
    doc = ok(["identity", str(root), "--tokenizer-view", "tokenizers", "--workers", "2"], capsys)
    assert doc["base_model_sha256"] == GOLDEN_WEIGHT_V1
    assert doc["vocab_size"] == 128
    assert doc["adapter"] is None
    assert doc["tokenizer_view"] == "tokenizers"
    expected = inspect_model(root, limiter=ReadRateLimiter(None), use_transformers=False)
    assert doc["snapshot_content_sha256"] == expected.snapshot_content_sha256
    assert list(doc) == [*expected.to_json(), "tokenizer_view"]


def test_identity_with_transformers_and_adapter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_model(tmp_path / "m")
    adapter = write_adapter(tmp_path / "lora-a")
    doc = ok(
        ["identity", str(root), "--adapter-path", str(adapter), "--max-read-mib-per-second", "64"],
        capsys,
    )
    assert doc["tokenizer_view"] == "transformers"
    assert isinstance(doc["adapter"], dict) and doc["adapter"]["name"] == "lora-a"


def test_digest_snapshot_matches_identity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_model(tmp_path / "m")
    adapter = write_adapter(tmp_path / "lora")
    doc = ok(
        ["digest", "snapshot", "--model-path", str(root), "--adapter-path", str(adapter)], capsys
    )
    expected = inspect_model(root, adapter, limiter=ReadRateLimiter(None), use_transformers=False)
    assert doc["snapshot_content_sha256"] == expected.snapshot_content_sha256
    assert doc["has_adapter"] is True
    assert (doc["files"], doc["directories"]) == (6, 2)


def test_digest_vocab_width_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_model(tmp_path / "m", vocab_size=200)
    doc = ok(["digest", "vocab", str(root / "tokenizer.json")], capsys)
    assert (doc["model_width"], doc["entries"]) == (200, tokenizer_entries())
    assert doc["model_width_source"] == str(root / "config.json")
    doc = ok(["digest", "vocab", str(root / "tokenizer.json"), "--model-width", "90"], capsys)
    assert doc["model_width"] == 90
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "tokenizer.json").write_text(tokenizer_json())
    doc = ok(["digest", "vocab", str(lone / "tokenizer.json")], capsys)
    assert doc["model_width"] == tokenizer_entries()
    assert doc["model_width_source"] == "entry count"


def test_digest_runtime_of_tokenizers(capsys: pytest.CaptureFixture[str]) -> None:
    doc = ok(["digest", "runtime", "--packages", "tokenizers"], capsys)
    assert doc["packages"] == ["tokenizers"]
    versions = doc["runtime_versions"]
    assert isinstance(versions, dict)
    assert set(versions) == {"python", "python_implementation", "tokenizers"}
    assert (
        isinstance(doc["runtime_content_sha256"], str) and len(doc["runtime_content_sha256"]) == 64
    )


@pytest.mark.parametrize(
    ("damage", "rule", "named"),
    [
        ("symlink", "tree.symlink", "linked.safetensors"),
        ("fifo", "tree.special_file", "pipe"),
        ("missing_shard", "base_model.no_shards", "m"),
        ("empty_shard", "shards.empty", "model.safetensors"),
        ("hardlink", "tree.hardlink", "copy.bin"),
        ("narrow", "tokenizer_vocab.id_beyond_width", "model width 10"),
        ("disagree", "model.vocab_size_mismatch", "config.json"),
        ("bad_token", "tokenizer.load", "tokenizer.json"),
    ],
)
def test_bad_models_give_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, rule: str, named: str
) -> None:
    root = write_model(tmp_path / "m")
    if damage == "symlink":
        (root / "linked.safetensors").symlink_to(root / "model.safetensors")
    elif damage == "fifo":
        os.mkfifo(root / "pipe")
    elif damage == "missing_shard":
        (root / "model.safetensors").unlink()
    elif damage == "empty_shard":
        (root / "model.safetensors").write_bytes(b"")
    elif damage == "hardlink":
        os.link(root / "config.json", root / "copy.bin")
    elif damage == "narrow":
        (root / "config.json").write_text('{"vocab_size": 10}')
    elif damage == "disagree":
        (root / "config.json").write_text('{"vocab_size": 128, "text_config": {"vocab_size": 64}}')
    elif damage == "bad_token":
        text = tokenizer_json().replace('"<extra>"', '"\\udc80"')
        (root / "tokenizer.json").write_text(text)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    err = fails(["identity", str(root), "--tokenizer-view", "tokenizers"], capsys, rule)
    assert named in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_rate_limit_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_model(tmp_path / "m")
    fails(["identity", str(root), "--max-read-mib-per-second", "0"], capsys, "rate_limit.range")
    fails(
        ["digest", "snapshot", "--model-path", str(root), "--max-read-mib-per-second", "16385"],
        capsys,
        "rate_limit.range",
    )


def test_missing_runtime_package(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(
        ["digest", "runtime", "--packages", "kiln_no_such_pkg"],
        capsys,
        "runtime_content.package_missing",
    )
    assert "kiln_no_such_pkg" in err


def test_real_subprocess_error_and_success(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    good = subprocess.run(
        [*KILN, "digest", "snapshot", "--model-path", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert good.returncode == 0, good.stderr
    assert len(json.loads(good.stdout)["snapshot_content_sha256"]) == 64
    (root / "model.safetensors").write_bytes(b"")
    bad = subprocess.run(
        [*KILN, "identity", str(root), "--tokenizer-view", "tokenizers"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "shards.empty" in bad.stderr
