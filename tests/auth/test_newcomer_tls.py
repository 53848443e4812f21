"""Issue 30 items 3 and 4: ``KILN_CA_FILE``, "this server speaks HTTPS", malformed tokens.

One real ``kiln serve`` with TLS and tokens (a ``trustme`` CA); the CLI runs as
real subprocesses, the Python client in process, raw requests with httpx.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kiln_registry.client.sync import RegistryClient
from kiln_registry.credentials.redaction import token_problem
from kiln_registry.domain.errors import InputError
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO
from tests.auth.support import create_token
from tests.auth.test_serve import Pki, _tls_config, pki, serve, wait_up

__all__ = ["pki"]  # the module-scoped fixture, shared with test_serve


def _kiln(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry", *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_token_problems_name_what_is_wrong_without_the_token() -> None:
    good = "kiln_" + "A" * 43
    assert token_problem(good) is None
    assert "does not start with 'kiln_'" in str(token_problem("sk-" + "A" * 43))
    assert "43 to 251" in str(token_problem("kiln_" + "A" * 20))
    assert "character 8 is not URL-safe" in str(token_problem("kiln_AA+" + "A" * 43))
    assert "quotes or a 'Bearer' word" in str(token_problem(f"Bearer {good}"))


def test_ca_file_variable_plain_http_and_malformed_tokens(
    tmp_path: Path, tiny_model: TinyModel, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _tls_config(tmp_path, tiny_model.path, pki, mutual=False)
    token = create_token(tmp_path / "registry.db", "ops", {"read"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    with serve(config, host="127.0.0.1") as served:
        url = f"https://localhost:{served.port}"
        monkeypatch.setenv("KILN_CA_FILE", str(pki.ca_pem))  # the Python client reads it too
        with RegistryClient(url, token=token, timeout=10) as client:
            wait_up(served, client.health)
            assert client.list_teachers() == []
        env.update(KILN_TOKEN=token, KILN_CA_FILE=str(pki.ca_pem), KILN_SERVER=url)
        listed = _kiln(env, "teachers", "list")
        assert listed.returncode == 0 and "no teachers" in listed.stdout, listed.stderr

        missing = _kiln({**env, "KILN_CA_FILE": str(tmp_path / "nope.pem")}, "teachers", "list")
        assert missing.returncode == 2 and "$KILN_CA_FILE names" in missing.stderr
        monkeypatch.setenv("KILN_CA_FILE", str(tmp_path / "nope.pem"))
        with pytest.raises(InputError, match="KILN_CA_FILE"):
            RegistryClient(url, token=token)

        plain = f"http://127.0.0.1:{served.port}"
        http_cli = _kiln({**env, "KILN_SERVER": plain}, "teachers", "list")
        assert http_cli.returncode == 2, http_cli.stderr
        assert f"this server speaks HTTPS; use https://127.0.0.1:{served.port}" in http_cli.stderr

        cut = token[:30]
        short = _kiln({**env, "KILN_TOKEN": cut}, "teachers", "list")
        assert short.returncode == 2 and "characters long" in short.stderr, short.stderr
        assert cut not in short.stderr

        verify = ssl.create_default_context(cafile=str(pki.ca_pem))
        with httpx.Client(verify=verify, trust_env=False, timeout=10) as http:
            answer = http.get(f"{url}/v1/teachers", headers={"authorization": f"Bearer {cut}"})
        assert answer.status_code == 401
        message = answer.json()["error"]["message"]
        assert "malformed" in message and "characters long" in message and cut not in message
    assert token not in served.output()
