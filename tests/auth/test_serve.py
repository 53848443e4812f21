"""``kiln serve`` as a real process: the 0.0.0.0 default, ``--insecure-no-auth``, TLS and mTLS.

The server binds ``0.0.0.0`` (or loopback with TLS) and the test connects over
loopback only.  Certificates come from ``trustme`` (a throwaway CA); nothing
leaves the machine.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from kiln_registry.client.sync import RegistryClient, RegistryClientError
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO, write_config
from tests.auth.support import bearer, create_token
from tests.helpers import free_port

START_S = 60.0


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@contextmanager
def serve(config: Path, *extra: str, host: str = "0.0.0.0") -> Iterator[Served]:
    port = free_port()
    log = config.parent / f"serve-{port}.log"
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config),
            "--host", host, "--port", str(port), *extra]  # fmt: skip
    with log.open("ab") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    served = Served(proc, port, log)
    try:
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_up(served: Served, probe: object) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert served.proc.poll() is None, served.output()
        try:
            probe()  # type: ignore[operator]
            return
        except (httpx.TransportError, RegistryClientError, ssl.SSLError, OSError):
            time.sleep(0.1)
    raise AssertionError(f"kiln serve did not come up: {served.output()}")


def run_to_exit(config: Path, *extra: str, host: str = "0.0.0.0") -> tuple[int, str]:
    with serve(config, *extra, host=host) as served:
        code = served.proc.wait(timeout=START_S)
        return code, served.output()


def test_a_public_bind_requires_tokens_by_default(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    token = create_token(tmp_path / "registry.db", "ops", {"read"})
    with serve(config) as served, httpx.Client(timeout=10, trust_env=False) as http:
        url = f"http://127.0.0.1:{served.port}"
        wait_up(served, lambda: http.get(url + "/health").raise_for_status())
        refused = http.get(url + "/v1/teachers")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert http.get(url + "/ready").status_code == 401
        assert http.get(url + "/v1/teachers", headers=bearer(token)).status_code == 200
        assert http.get(url + "/v1/teachers", headers=bearer(token + "x")).status_code == 401
    assert token not in served.output()


def test_auth_off_on_a_public_bind_is_refused(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "off"})
    code, output = run_to_exit(config)
    assert code == 2 and "server.auth_off" in output and "--insecure-no-auth" in output


def test_insecure_no_auth_starts_with_a_warning(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "off"})
    with serve(config, "--insecure-no-auth") as served, httpx.Client(trust_env=False) as http:
        url = f"http://127.0.0.1:{served.port}"
        wait_up(served, lambda: http.get(url + "/health").raise_for_status())
        assert http.get(url + "/v1/teachers").status_code == 200
    assert "authentication is OFF" in served.output()


@dataclass(frozen=True)
class Pki:
    ca: trustme.CA
    ca_pem: Path
    cert: Path
    key: Path
    client: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("pki")
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    server.private_key_pem.write_to_path(str(d / "key.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    ca.issue_cert("client@example").private_key_and_cert_chain_pem.write_to_path(
        str(d / "client.pem")
    )
    return Pki(ca, d / "ca.pem", d / "cert.pem", d / "key.pem", d / "client.pem")


def _tls_config(tmp_path: Path, model: Path, pki: Pki, *, mutual: bool) -> Path:
    server: dict[str, object] = {"auth": "required", "tls_cert_file": pki.cert,
                                 "tls_key_file": pki.key}  # fmt: skip
    if mutual:
        server["tls_client_ca_file"] = pki.ca_pem
    return write_config(tmp_path, student=model, server=server)


def test_tls_serving_with_a_token(tmp_path: Path, tiny_model: TinyModel, pki: Pki) -> None:
    config = _tls_config(tmp_path, tiny_model.path, pki, mutual=False)
    token = create_token(tmp_path / "registry.db", "ops", {"read"})
    deployer = create_token(tmp_path / "registry.db", "deployer", {"register"})
    with serve(config, host="127.0.0.1") as served:
        url = f"https://localhost:{served.port}"
        with RegistryClient(url, token=token, ca_file=pki.ca_pem, timeout=10) as client:
            wait_up(served, client.health)
            assert client.list_teachers() == []
        # Plain HTTP to the TLS port: a transport error, no answer, no token accepted,
        # and a state change sent that way changes nothing.
        plain = f"http://127.0.0.1:{served.port}/v1/teachers"
        with httpx.Client(trust_env=False, timeout=5) as http:
            with pytest.raises(httpx.HTTPError):
                http.get(plain, headers=bearer(token))
            body = {"alias": "plain", "kind": "fixture", "model_id": "m"}
            with pytest.raises(httpx.HTTPError):
                http.post(plain, json=body, headers=bearer(deployer))
        with RegistryClient(url, token=token, ca_file=pki.ca_pem, timeout=10) as client:
            assert client.list_teachers() == []
        # The system store does not know the throwaway CA.
        with (
            RegistryClient(url, token=token, timeout=10) as client,
            pytest.raises(RegistryClientError) as refused,
        ):
            client.list_teachers()
        assert refused.value.code == "registry_unreachable"
        assert "--ca-file" in str(refused.value.hint)
    assert token not in served.output() and deployer not in served.output()


def test_mutual_tls_requires_the_client_certificate(
    tmp_path: Path, tiny_model: TinyModel, pki: Pki
) -> None:
    config = _tls_config(tmp_path, tiny_model.path, pki, mutual=True)
    token = create_token(tmp_path / "registry.db", "ops", {"read"})
    with serve(config, host="127.0.0.1") as served:
        url = f"https://localhost:{served.port}"
        cert = (pki.client, pki.client)
        with RegistryClient(url, token=token, ca_file=pki.ca_pem, client_cert=cert) as client:
            wait_up(served, client.health)
            assert client.list_teachers() == []
        with (
            RegistryClient(url, token=token, ca_file=pki.ca_pem, timeout=10) as client,
            pytest.raises(RegistryClientError) as refused,
        ):
            client.list_teachers()
        assert refused.value.code == "registry_client_certificate_required"
        assert "--client-cert-file" in str(refused.value.hint)
        _cli_under_mutual_tls(url, token, pki)
    assert token not in served.output()


def _kiln(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _cli_under_mutual_tls(url: str, token: str, pki: Pki) -> None:
    """``kiln teachers list`` with the certificate by option or variable; without: a clear error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["KILN_OPS_TOKEN"] = token
    base = ["teachers", "list", "--server", url, "--ca-file", str(pki.ca_pem),
            "--token-env", "KILN_OPS_TOKEN", "--json"]  # fmt: skip
    by_option = _kiln(env, *base, "--client-cert-file", str(pki.client),
                      "--client-key-file", str(pki.client))  # fmt: skip
    assert by_option.returncode == 0, by_option.stderr
    by_env = _kiln({**env, "KILN_CLIENT_CERT_FILE": str(pki.client)}, *base)
    assert by_env.returncode == 0, by_env.stderr
    without = _kiln(env, *base)
    assert without.returncode == 2, without.stderr
    assert "registry_client_certificate_required" in without.stderr or (
        "client certificate" in without.stderr
    ), without.stderr
    assert "--client-cert-file" in without.stderr and "Traceback" not in without.stderr
    key_only = _kiln(env, *base, "--client-key-file", str(pki.client))
    assert key_only.returncode == 2 and "client.client_cert" in key_only.stderr, key_only.stderr
    for done in (by_option, by_env, without, key_only):
        assert token not in done.stdout + done.stderr


@pytest.mark.parametrize("broken", ["cert", "key", "client_ca", "missing"])
def test_bad_tls_files_are_refused_at_start(
    tmp_path: Path, tiny_model: TinyModel, pki: Pki, broken: str
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    server: dict[str, object] = {"tls_cert_file": pki.cert, "tls_key_file": pki.key}
    key = {"cert": "tls_cert_file", "key": "tls_key_file", "client_ca": "tls_client_ca_file",
           "missing": "tls_cert_file"}[broken]  # fmt: skip
    server[key] = tmp_path / "absent.pem" if broken == "missing" else garbage
    config = write_config(tmp_path, student=tiny_model.path, server=server)
    code, output = run_to_exit(config, host="127.0.0.1")
    assert code == 2 and "server.tls" in output and key.split("_")[1] in output, output
    assert "Traceback" not in output
    assert os.environ.get("KILN_TOKEN") is None or os.environ["KILN_TOKEN"] not in output
