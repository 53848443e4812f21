"""``kiln reference-teacher`` over HTTPS with ``--api-key-env``, registered with a token.

The reference teacher runs as a real process on a ``trustme`` certificate
for ``localhost``; a registry with ``auth = "required"`` trusts that CA
(``teacher_ca_file``) and holds the key in a credential, and a
``register``-scoped token registers it: the identity probes pass over TLS.
"""

from __future__ import annotations

import json
import os
import select
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trustme

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO, remote, run_registry, write_config
from tests.auth.support import bearer, create_token

KEY_ENV = "KILN_AUTH_REF_KEY"
KEY = "sk-auth-ref/Zq4+Wx=Ty7!Uv1"
pytestmark = pytest.mark.secret_env(KEY_ENV)


def _argv(model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kiln_registry.cli.main", "reference-teacher",
            "--model-path", str(model), "--served-model-id", "teacher-tiny",
            "--max-top-k", "4", "--max-model-len", "64", "--port", "0",
            "--api-key-env", KEY_ENV, "--threads", "1", *extra]  # fmt: skip


def test_https_credentialed_reference_teacher_registers_with_a_token(
    tmp_path: Path, tiny_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv(KEY_ENV, KEY)
    tls = (
        "--tls-cert-file",
        str(tmp_path / "cert.pem"),
        "--tls-key-file",
        str(tmp_path / "key.pem"),
    )
    process = subprocess.Popen(
        _argv(tiny_model.path, *tls), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, KEY_ENV: KEY}, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 120)
        assert ready, "no startup line within 120 s"
        url: str = json.loads(process.stdout.readline())["url"]
        assert url.startswith("https://127.0.0.1:")
        origin = url.replace("127.0.0.1", "localhost")
        server = {"auth": "required", "teacher_ca_file": tmp_path / "ca.pem"}
        config = write_config(tmp_path, student=tiny_model.path, server=server,
                              credentials={"ref": (origin, KEY_ENV)})  # fmt: skip
        token = create_token(tmp_path / "registry.db", "registrar", {"register"})
        with run_registry(config) as registry, registry.client(timeout=120) as http:
            body = remote("ref", origin + "/v1", credential_id="ref")
            assert http.post("/v1/teachers", json=body).status_code == 401
            made = http.post("/v1/teachers", json=body, headers=bearer(token))
            assert made.status_code == 200, made.text
            assert made.json()["status"] == "verified"
        verify = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with httpx.Client(verify=verify, trust_env=False) as plain:
            assert plain.get(origin + "/v1/models").status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert KEY not in out and KEY not in err and token not in out + err


def test_reference_teacher_refuses_half_or_bad_tls_options(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    for extra in (("--tls-cert-file", str(bad)),
                  ("--tls-cert-file", str(bad), "--tls-key-file", str(bad))):  # fmt: skip
        result = subprocess.run(
            _argv(tmp_path / "no-model", *extra), cwd=REPO, capture_output=True, text=True,
            timeout=120, check=False, env={**os.environ, KEY_ENV: KEY},
        )  # fmt: skip
        assert result.returncode == 2 and "reference.tls" in result.stderr, result.stderr
