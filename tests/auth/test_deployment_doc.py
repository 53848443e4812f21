"""Every command of docs/deployment.md runs, in order, against a real TLS registry.

The ``sh`` blocks of the page are run by bash (``set -euo pipefail``) with
the page's paths replaced by temporary ones and ``registry.internal`` by
``localhost`` (the test certificate's name); the registry itself is started
from the ``ExecStart=`` line of ``deploy/kiln-registry.service`` with the
same replacements, configured with the page's ``toml`` block.  The unit
file is checked with ``systemd-analyze verify`` (its ``ExecStart`` pointed
at this checkout's ``kiln``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import trustme

from kiln_registry.client.sync import RegistryClient, RegistryClientError
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO
from tests.helpers import free_port

DOC = REPO / "docs" / "deployment.md"
UNIT = REPO / "deploy" / "kiln-registry.service"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(kind: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(DOC.read_text(encoding="utf-8")) if lang == kind]


def _replace(text: str, root: Path, port: int, model: Path) -> str:
    for old, new in (
        ("/etc/kiln-registry", str(root / "etc")),
        ("/var/lib/kiln-registry", str(root / "var")),
        ("/srv/models/student", str(model)),
        ("/opt/kiln-registry", str(REPO)),
        ("registry.internal:8420", f"localhost:{port}"),
        ("port = 8420", f"port = {port}"),
        ("deploy/kiln-registry.service", str(root / "kiln-registry.service")),
    ):
        text = text.replace(old, new)
    return text


def _pki(etc: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    (etc / "tls").mkdir(parents=True)
    cert.cert_chain_pems[0].write_to_path(str(etc / "tls" / "cert.pem"))
    cert.private_key_pem.write_to_path(str(etc / "tls" / "key.pem"))
    ca.cert_pem.write_to_path(str(etc / "tls" / "ca.pem"))


def _bash(script: str, env: dict[str, str]) -> str:
    argv = ["bash", "-c", "set -euo pipefail\n" + script + "\nenv"]
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _exported(stdout: str, env: dict[str, str]) -> None:
    for line in stdout.splitlines():
        name, _, value = line.partition("=")
        if name.startswith("KILN_"):
            env[name] = value


def _exec_start(root: Path, port: int, model: Path) -> list[str]:
    unit = _replace(UNIT.read_text(encoding="utf-8"), root, port, model)
    (root / "kiln-registry.service").write_text(unit, encoding="utf-8")
    [line] = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=").split()


def _wait_up(proc: subprocess.Popen[bytes], port: int, ca: Path) -> None:
    deadline = time.monotonic() + 60
    with RegistryClient(f"https://localhost:{port}", ca_file=ca, timeout=5) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "kiln serve exited"
            try:
                client.health()
                return
            except RegistryClientError:
                time.sleep(0.2)
    raise AssertionError("kiln serve did not come up")


def test_every_command_of_the_deployment_page(tmp_path: Path, tiny_model: TinyModel) -> None:
    port = free_port()
    (tmp_path / "var").mkdir(mode=0o700)
    _pki(tmp_path / "etc")
    [toml] = blocks("toml")
    config = _replace(toml, tmp_path, port, tiny_model.path)
    (tmp_path / "etc" / "kiln.toml").write_text(config, encoding="utf-8")
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    scripts = [_replace(b, tmp_path, port, tiny_model.path) for b in blocks("sh")]
    assert len(scripts) == 5
    _exported(_bash(scripts[0], env), env)  # tokens
    assert env["KILN_DEPLOYER_TOKEN"].startswith("kiln_")
    argv = _exec_start(tmp_path, port, tiny_model.path)
    if shutil.which("systemd-analyze"):  # absent on machines without systemd tools
        _bash(scripts[1], env)
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_up(proc, port, tmp_path / "etc" / "tls" / "ca.pem")
        used = _bash(scripts[2], env)  # list teachers, audit
        assert "token.create" in used
        _bash(scripts[3], env)  # revoke
        ca = ssl.create_default_context(cafile=str(tmp_path / "etc" / "tls" / "ca.pem"))
        with httpx.Client(verify=ca, trust_env=False) as http:
            url = f"https://localhost:{port}/v1/teachers"
            auth = {"authorization": f"Bearer {env['KILN_DEPLOYER_TOKEN']}"}
            assert http.get(url, headers=auth).status_code == 401
        backup = _bash(scripts[4], env)  # online backup while serving
        assert "ok" in backup.splitlines()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    assert env["KILN_OPS_TOKEN"] not in (tmp_path / "serve.log").read_text(encoding="utf-8")
