"""Issue 18 item 8, the parts that need no live registry: one test per item.

Real subprocesses for ``python -m kiln_registry`` and the taken port (a real
listening socket); the completion scripts are checked by the shells' own
syntax checkers where the shell is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from kiln_registry.cli.main import run
from kiln_registry.jobs.core.signing import keys_document, load_or_create_signer
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
VERSION = metadata.version("kiln-registry")


def test_version_flag_and_python_dash_m(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"kiln {VERSION}\n"
    done = subprocess.run(
        [sys.executable, "-m", "kiln_registry", "--version"],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, f"kiln {VERSION}\n")


def test_openapi_info_version_is_the_package_version() -> None:
    from kiln_registry.api.app import create_app

    assert create_app(None).openapi()["info"]["version"] == VERSION


def test_a_taken_port_is_one_error_line_and_exit_status_2(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = tmp_path / "kiln.toml"
    config.write_text(
        f'[server]\ndatabase = "{tmp_path / "registry.db"}"\n'
        f'[student]\nmodel_path = "{tiny_model.path}"\n',
        encoding="utf-8",
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "kiln_registry", "serve", "--config", str(config),
             "--port", str(port)],
            capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: error: server.port_in_use:")
    assert f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0]
    assert not (tmp_path / "registry.db").exists()  # nothing was opened


def test_a_connection_failure_names_the_url_and_a_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert run(["teachers", "list", "--server", url, "--timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kiln: error: client.connect:")
    assert f"the registry at {url}" in err and f"curl {url}/health" in err


def test_corpus_verify_json_prints_json_for_a_refusal_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys.json"
    signer = load_or_create_signer(tmp_path / "signing.key")
    keys.write_text(json.dumps(keys_document([signer.public])), encoding="utf-8")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"not": "a corpus"}\n', encoding="utf-8")
    argv = ["corpus", "verify", str(corpus), "--public-key", str(keys), "--json"]
    assert run(argv) == 2
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["ok"] is False and doc["file"] == str(corpus)
    assert doc["error"]["rule"] == "corpus.unsigned" and doc["error"]["message"]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion_scripts(
    shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["completion", shell]) == 0
    script = capsys.readouterr().out
    for command in ("teachers", "jobs", "corpus", "completion", "serve"):
        assert command in script
    assert "#compdef kiln" in script if shell == "zsh" else "complete" in script
    binary = shutil.which(shell)
    if binary is not None:  # the shell's own parser, where the shell is installed
        path = tmp_path / f"kiln.{shell}"
        path.write_text(script, encoding="utf-8")
        check = subprocess.run([binary, "-n", str(path)], capture_output=True, timeout=60)
        assert check.returncode == 0, check.stderr


def test_kiln_toml_example_has_no_stale_release_notes() -> None:
    text = (REPO / "kiln.toml.example").read_text(encoding="utf-8")
    stale = re.compile(r"later release|future release|not (yet )?(supported|implemented) yet")
    assert not stale.search(text.lower())
    assert "[teachers.local.teacher-large]" in text  # launch profiles work today
