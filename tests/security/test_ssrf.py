"""Issue 15 attack 3: registration is neither a reader of other services nor a port scanner.

A real registry registers URLs that point at a loopback service answering
with a non-vLLM error page (its text must not come back), at a vLLM-shaped
error (not quoted either, since issue 27), at a closed port, at a TLS server it does not
trust and at a server that drops the connection (one error, same message);
``[server] teacher_hosts`` refuses other hosts before any request is sent.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, serve_tls, write_config
from tests.security.conftest import CountingTeacher

SECRET_PAGE = b'{"detail": "admin token: hunter2-internal-secret"}'


def _register(http: object, url: str) -> dict[str, str]:
    body = {"alias": "a1", "kind": "remote", "provider": "vllm", "model_id": "m", "url": url}
    response = http.post("/v1/teachers", json=body)  # type: ignore[attr-defined]
    assert response.status_code >= 400, response.text
    return error_of(response)


def test_non_vllm_error_body_is_not_echoed(
    registry: RegistryServer, counting_teacher: CountingTeacher
) -> None:
    counting_teacher.body = SECRET_PAGE
    with registry.client() as http:
        error = _register(http, counting_teacher.url + "/admin/secret")
    assert "hunter2" not in str(error) and "admin token" not in str(error)
    assert "HTTP 500" in error["message"] and "not shown" in error["message"]
    assert counting_teacher.requests  # it did answer; only the status comes back


def test_vllm_error_body_is_not_quoted_either(
    registry: RegistryServer, counting_teacher: CountingTeacher
) -> None:
    # Issue 27 item 13: a vLLM-shaped error was quoted (up to 400 characters); any
    # service can answer in that shape, so only the rule and the status come back.
    counting_teacher.status = 404
    counting_teacher.body = (
        b'{"error":{"message":"The model `m` does not exist.","type":"NotFoundError",'
        b'"param":null,"code":404}}'
    )
    with registry.client() as http:
        error = _register(http, counting_teacher.url + "/v1")
    assert "does not exist" not in error["message"] and "HTTP 404" in error["message"]
    assert error["rule"] == "probe.http_status"


@pytest.fixture
def dropping_port() -> Iterator[int]:
    """A TCP server that accepts and closes at once (a transport failure, not a refusal)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_connect_transport_and_tls_failures_look_alike(
    registry: RegistryServer,
    counting_teacher: CountingTeacher,
    dropping_port: int,
    free_port: int,
    tmp_path: Path,
) -> None:
    import trustme

    ca = trustme.CA()  # a CA the registry does not trust
    pem = tmp_path / "tls.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    seen = []
    with serve_tls(counting_teacher, pem) as tls_port, registry.client() as http:
        for url in (
            f"http://127.0.0.1:{free_port}/v1",  # closed port
            f"http://127.0.0.1:{dropping_port}/v1",  # accepts, then drops
            f"https://127.0.0.1:{tls_port}/v1",  # TLS with an untrusted certificate
        ):
            error = _register(http, url)
            seen.append((error["code"], error.get("rule"), error["message"], error["hint"]))
    assert len(set(seen)) == 1, seen
    assert seen[0][:2] == ("teacher_identity_probe_failed", "probe.unreachable")


def test_teacher_hosts_allowlist(
    tmp_path: Path, tiny_model: TinyModel, counting_teacher: CountingTeacher
) -> None:
    config = write_config(
        tmp_path, student=tiny_model.path, server={"teacher_hosts": ["*.teachers.example"]}
    )
    with run_registry(config) as server, server.client() as http:
        for url in (counting_teacher.url + "/v1", "http://localhost:1/v1"):
            error = _register(http, url)
            assert error["code"] == "teacher_registration_invalid"
            assert error["rule"] == "teacher.host_not_allowed"
    assert counting_teacher.requests == []
