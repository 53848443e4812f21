"""``kiln-teacher qualify``: portable checks and the receipt, on real tiny models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kiln_registry.launcher.policy import parse_launcher_argv
from kiln_registry.launcher.qualification import qualify, write_receipt
from kiln_registry.testing.tiny_models import TinyModel

KILN_TEACHER = Path(sys.executable).with_name("kiln-teacher")
LIMITS = ["--served-model-id=teacher", "--max-top-k=8", "--max-model-len=64"]
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}


def _request(model: Path, adapter: Path | None = None) -> object:
    flags = [f"--model-path={model}", *LIMITS, "--dry-run"]
    if adapter is not None:
        flags.append(f"--adapter-path={adapter}")
    return parse_launcher_argv([*flags, "--", "--dtype=float32"], ENV)


def test_qualify_checks_pass_and_the_source_is_untouched(
    tiny_model: TinyModel, tiny_adapter: Path
) -> None:
    before = {p.name: p.read_bytes() for p in tiny_model.path.iterdir()}
    # Hashing only `tokenizers` keeps this fast; the CLI test below hashes everything.
    receipt = qualify(_request(tiny_model.path, tiny_adapter), ENV, packages=("tokenizers",))  # type: ignore[arg-type]
    assert receipt["passed"] is True, receipt["checks"]
    assert receipt["launchable"] is False
    assert receipt["missing_packages"] == ["vllm", "torch", "transformers"]
    names = {check["name"] for check in receipt["checks"]}  # type: ignore[union-attr]
    assert "identity_stable" in names
    assert {n for n in names if n.startswith("mutate:")} == {
        "mutate:model/model.safetensors:flip",
        "mutate:model/config.json:append-space",
        "mutate:model/tokenizer.json:append-space",
        "mutate:model/kiln-qualify-extra.txt:create",
        "mutate:adapter/adapter_model.safetensors:flip",
        "mutate:adapter/adapter_config.json:append-space",
    }
    assert "option:--seed=1" in names and "environment:CUDA_VISIBLE_DEVICES" in names
    assert "refuse-option:--load-format=pt" in names
    assert "refuse-variable:PYTHONPATH" in names
    assert {p.name: p.read_bytes() for p in tiny_model.path.iterdir()} == before


def test_receipt_is_written_atomically(tmp_path: Path) -> None:
    target = tmp_path / "receipt.json"
    target.write_text("old")
    write_receipt(str(target), {"schema": "x", "passed": True})
    assert json.loads(target.read_text()) == {"passed": True, "schema": "x"}
    assert [p.name for p in tmp_path.iterdir()] == ["receipt.json"]


def test_qualify_command_fails_closed_on_a_bad_tree_without_a_receipt(tmp_path: Path) -> None:
    # The full command hashes every runtime package twice (about a minute on
    # two cores), so the command-line path is tested on a refusal; the checks
    # and the receipt writer are tested above.
    receipt = tmp_path / "qualification.json"
    model = tmp_path / "model"
    model.mkdir()
    out = subprocess.run(
        [
            str(KILN_TEACHER),
            "qualify",
            f"--model-path={model}",
            *LIMITS,
            "--receipt",
            str(receipt),
            "--",
            "--api-key=never-printed",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "model.config_missing" in out.stderr or "config.json" in out.stderr
    assert "never-printed" not in out.stdout + out.stderr
    assert not receipt.exists()


def test_receipt_flag_is_taken_out_before_the_delimiter() -> None:
    from kiln_registry.launcher.cli import _split_receipt

    assert _split_receipt(["--receipt=r.json", "--model-path=m"]) == ("r.json", ["--model-path=m"])
    assert _split_receipt(["--receipt", "r", "--x"]) == ("r", ["--x"])
    assert _split_receipt(["--a", "--", "--receipt=r"]) == (None, ["--a", "--", "--receipt=r"])


def test_qualify_refuses_identity_input(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(KILN_TEACHER), "qualify", "--identity-input=/x", "--model-path=/m", *LIMITS],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
