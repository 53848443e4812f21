"""``kiln teachers ...`` against a real ``kiln serve`` subprocess and a reference teacher.

The registry is a real child process (SQLite file in tmp, loopback port,
SIGTERM at the end); the teacher is the reference teacher in a thread.  The
commands run in-process through ``kiln_registry.cli.main.run`` (captured
output), and once as a real ``kiln`` subprocess for the exit status.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kiln_registry.cli.main import run
from kiln_registry.cli.teachers_cmds import printable, table
from kiln_registry.client.sync import RegistryClient, RegistryClientError
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port, serve_reference_teacher

SERVED = "teacher-tiny"
ALIAS = "tiny-cli@reference"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = tmp / "kiln.toml"
    config.write_text(
        f'[server]\nport = {port}\ndatabase = "{tmp / "registry.db"}"\n'
        f'[student]\nmodel_path = "{tiny_model.path}"\n',
        encoding="utf-8",
    )
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        with RegistryClient(url, timeout=2) as client:
            while True:
                try:
                    client.health()
                    break
                except RegistryClientError:
                    assert proc.poll() is None, (tmp / "serve.log").read_text()
                    assert time.monotonic() < deadline, "kiln serve did not start"
                    time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def teacher_url(tiny_model: TinyModel) -> Iterator[str]:
    with serve_reference_teacher(tiny_model.path, SERVED) as url:
        yield url


def kiln(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = run(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.slow  # starts `kiln serve` and loads a reference teacher
def test_full_lifecycle(server: str, teacher_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    s = ["--server", server]
    assert kiln(capsys, "teachers", "list", *s) == (0, "no teachers registered\n", "")
    status, out, _ = kiln(capsys, "teachers", "register", "--alias", ALIAS, "--provider",
                          "vllm", "--model-id", SERVED, "--url", teacher_url, *s)  # fmt: skip
    assert status == 0 and out.startswith(f"registered {ALIAS}\n")
    assert "verified" in out and "identity.served_model_id" in out

    status, out, _ = kiln(capsys, "teachers", "show", ALIAS, "--json", *s)
    entry = json.loads(out)
    assert status == 0 and entry["status"] == "verified" and entry["usable"] is True
    revision = entry["identity_revision"].removeprefix("sha256:")

    status, out, _ = kiln(capsys, "teachers", "list", *s)
    header, row = out.splitlines()
    assert header.split() == ["ALIAS", "KIND", "STATUS", "USABLE", "MODEL", "MAX_TOP_K", "REVISION"]
    assert row.split() == [ALIAS, "remote", "verified", "yes", SERVED, "8", revision[:12]]

    status, out, _ = kiln(capsys, "teachers", "probe", ALIAS, *s)
    assert status == 0 and out.startswith("outcome   passed\n")
    assert [line.split()[0] for line in out.splitlines()[-3:]] == ["discover", "max_top_k", "cap"]

    status, out, _ = kiln(capsys, "teachers", "receipts", ALIAS, "--json", *s)
    assert [r["outcome"] for r in json.loads(out)["receipts"]] == ["passed", "passed"]
    status, out, _ = kiln(capsys, "teachers", "receipts", ALIAS, *s)
    assert out.splitlines()[0].split() == ["ID", "CREATED", "OUTCOME", "REVISION", "FAILURE"]

    assert kiln(capsys, "teachers", "delete", ALIAS, *s) == (0, f"deleted {ALIAS}\n", "")
    status, out, err = kiln(capsys, "teachers", "show", ALIAS, *s)
    assert (status, out) == (2, "")
    assert err.startswith("kiln: error: teacher_not_found (HTTP 404)") and err.count("\n") == 1


def test_a_repeated_url_registers_a_replica_set(
    server: str, teacher_url: str, tiny_model: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve_reference_teacher(tiny_model.path, SERVED) as second:
        status, out, err = kiln(capsys, "teachers", "register", "--alias", "set@cli",
                                "--provider", "vllm", "--model-id", SERVED, "--url", teacher_url,
                                "--url", second, "--server", server)  # fmt: skip
        assert status == 0, err
        for index, url in enumerate((teacher_url, second)):
            assert re.search(rf"^replica {index} +{re.escape(url)} \(verified\)$", out, re.M), out
        status, out, _ = kiln(capsys, "teachers", "show", "set@cli", "--json", "--server", server)
        assert [r["url"] for r in json.loads(out)["replicas"]] == [teacher_url, second]
        assert kiln(capsys, "teachers", "delete", "set@cli", "--server", server)[0] == 0


def test_json_list_and_server_from_the_environment(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_SERVER", server)
    argv = ["teachers", "register", "--alias", "fx-env", "--kind", "fixture", "--model-id", "m"]
    status, out, _ = kiln(capsys, *argv, "--notes", "a fixture", "--json")
    assert status == 0 and json.loads(out)["status"] == "configured"
    status, out, _ = kiln(capsys, "teachers", "list", "--json")
    aliases = [t["spec"]["alias"] for t in json.loads(out)["teachers"]]
    assert status == 0 and "fx-env" in aliases
    status, out, err = kiln(capsys, *argv)
    assert status == 2 and "teacher_alias_exists" in err and "hint:" in err
    status, _, err = kiln(capsys, "teachers", "register", "--alias", "r", "--model-id", "m",
                          "--url", "http://127.0.0.1:1")  # fmt: skip
    assert status == 2 and "teacher_registration_invalid" in err and "provider" in err
    assert kiln(capsys, "teachers", "delete", "fx-env", "--json")[1] == (
        '{\n  "status": "deleted",\n  "alias": "fx-env"\n}\n'
    )


def test_unreachable_server_is_one_line_and_exit_2() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    proc = subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", "teachers", "list",
         "--server", f"http://127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("kiln: error: client.connect:")


def test_bad_server_url_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = kiln(capsys, "teachers", "list", "--server", "http://u:pw-secret@127.0.0.1")
    assert status == 2 and "client.server_url" in err and "pw-secret" not in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(["teachers", "register", "--alias", "a", "--kind", "cloud"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        run(["teachers", "receipts", "a", "--limit", "0"])
    assert "invalid" in capsys.readouterr().err


def test_server_strings_cannot_reach_the_terminal_raw() -> None:
    assert printable("a\x1b[2Jb\nc\x07") == "a?[2Jb?c?"
    assert printable(None) == "-"
    text = table(("alias", "notes"), [("x", "\x1b]0;title\x07" + "n" * 100)])
    assert "\x1b" not in text and "\x07" not in text
    assert max(len(line) for line in text.splitlines()) == len("alias") + 2 + 48
