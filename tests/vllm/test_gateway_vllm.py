"""The teacher gateway in front of real vLLM 0.32 (the CPU build).

The route list is taken from the running vLLM itself: its ``/openapi.json``,
read over the private Unix socket the launcher gave it (the test runs as the
same user, so the 0700 runtime directory is readable here).  Every route it
registers is refused at the gateway except the three allowed, and vLLM
itself holds no key.  A ``teacher_scoring`` job of the session registry runs
through the launch's gateway to vLLM and succeeds.  A second gateway, started
here with an API key (``python -m kiln_registry.gateway``), forwards to vLLM
through a recording Unix-socket relay: every byte vLLM received is kept, and
none of it is an ``Authorization`` header or key material, while vLLM still
answers.  The adapter's base alias refused directly at the gateway is checked
in ``test_real_vllm.py`` (the one adapter launch of the tier).
"""

from __future__ import annotations

import contextlib
import glob
import http.client
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kiln_registry.jobs.core.signing import parse_keys
from kiln_registry.jobs.kinds import verify_corpus
from tests.helpers import free_port
from tests.vllm.support import (
    MAX_MODEL_LEN,
    MAX_TOP_K,
    REPO,
    SERVED,
    Launched,
    Registry,
    child_environment,
    stop,
    tail,
    wait_health,
)

# The session's vLLM launch may happen in this module's setup: minutes on two busy cores.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]
ALLOWED = {("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/health")}
UNLISTED = [
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("POST", "/invocations"),
]
KEY_ENV = "KILN_GATEWAY_TEST_KEY"
SEQUENCES = [[1, 2, 3, 4, 5], [9, 8, 7], [4, 4, 4, 4, 4, 4, 4]]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path_ = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(self.path_)
        self.sock = sock


def _vllm_socket(launched: Launched) -> str:
    (path,) = glob.glob(f"/tmp/kiln-{launched.proc.pid}-*/vllm.sock")
    return path


def _get(conn: http.client.HTTPConnection, method: str, path: str) -> tuple[int, bytes]:
    body = b"{}" if method != "GET" else None
    conn.request(method, path, body=body, headers={"content-type": "application/json"})
    answer = conn.getresponse()
    return answer.status, answer.read()


def test_every_route_vllm_registers_is_refused_but_three(launched: Launched) -> None:
    uds = _vllm_socket(launched)
    assert stat.S_IMODE(os.stat(os.path.dirname(uds)).st_mode) == 0o700
    direct = _UnixConnection(uds)
    status, spec = _get(direct, "GET", "/openapi.json")
    assert status == 200
    routes = {
        (method.upper(), path)
        for path, item in json.loads(spec)["paths"].items()
        for method in item
        if "{" not in path
    }
    assert routes >= ALLOWED and len(routes) > 10  # vLLM registers many more
    gateway = http.client.HTTPConnection("127.0.0.1", launched.port, timeout=30)
    for method, path in sorted(routes | set(UNLISTED)):
        status, body = _get(gateway, method, path)
        if (method, path) in ALLOWED:
            assert status != 404, (method, path)
        else:
            assert status == 404, (method, path, status)
            assert json.loads(body)["error"]["code"] == 404
        gateway.close()
    direct.close()


def test_vllm_holds_no_key_and_answers_only_on_its_socket(launched: Launched) -> None:
    uds = _vllm_socket(launched)
    direct = _UnixConnection(uds)
    status, models = _get(direct, "GET", "/v1/models")  # no key: vLLM was given none
    assert status == 200 and json.loads(models)["data"][0]["id"] == SERVED
    direct.close()
    for pid in launched.vllm_pids():
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert not any(token.startswith((b"--api-key", b"--host", b"--port")) for token in argv)
        assert f"--uds={uds}".encode() in argv


def test_a_scoring_job_runs_through_the_gateway_to_vllm(
    launched: Launched, registry: Registry
) -> None:
    """The registry's job queue scores against real vLLM; its only way in is the gateway."""
    body = {"alias": "vllm-gateway-scoring", "kind": "remote", "provider": "vllm",
            "url": launched.url + "/v1", "model_id": SERVED}  # fmt: skip
    with registry.client() as http:
        assert http.post("/v1/teachers", json=body).status_code == 200
        submitted = http.post("/v1/jobs", json={
            "kind": "teacher_scoring", "teacher": "vllm-gateway-scoring", "top_k": 4,
            "sequences": SEQUENCES,
        })  # fmt: skip
        assert submitted.status_code == 201, submitted.text
        job = _wait_job(http, submitted.json()["id"])
        assert job["status"] == "succeeded", (job, tail(registry.log))
        result = http.get(f"/v1/jobs/{job['id']}/result")
        assert result.status_code == 200, result.text
        keys = parse_keys(http.get("/v1/keys").json(), "GET /v1/keys")
    assert result.headers["x-kiln-result-sha256"] == job["result"]["sha256"]  # type: ignore[index]
    with tempfile.TemporaryDirectory() as scratch:
        corpus = Path(scratch) / "corpus.jsonl"
        corpus.write_bytes(result.content)
        assert verify_corpus(corpus, keys).sequences == len(SEQUENCES)


def _wait_job(http: httpx.Client, job_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 600
    while True:
        job: dict[str, object] = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


class Relay:
    """A transparent Unix-socket relay that records every byte sent toward vLLM."""

    def __init__(self, listen: str, upstream: str) -> None:
        self.upstream = upstream
        self.received = bytearray()
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(listen)
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def recorded(self) -> bytes:
        with self._lock:
            return bytes(self.received)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() of the relay's thread
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:  # closed by the test
                return
            threading.Thread(target=self._pair, args=(client,), daemon=True).start()

    def _pair(self, client: socket.socket) -> None:
        with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
            upstream.connect(self.upstream)
            down = threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True)
            down.start()
            self._pump(client, upstream, True)
            down.join()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if record:
                    with self._lock:
                        self.received += chunk
                sink.sendall(chunk)
        with contextlib.suppress(OSError):  # pass the end on, then stop the other direction
            sink.shutdown(socket.SHUT_WR)
            source.shutdown(socket.SHUT_RD)


@pytest.fixture(scope="module")
def keyed_gateway(launched: Launched) -> Iterator[tuple[str, bytes, Relay]]:
    """A gateway holding a key, in front of a recording relay to the session's vLLM socket."""
    key = ("kiln-gw-" + secrets.token_hex(24)).encode()
    workdir = tempfile.mkdtemp(prefix="kiln-relay-")  # short: Unix socket paths are bounded
    relay = Relay(os.path.join(workdir, "relay.sock"), _vllm_socket(launched))
    port, log = free_port(), Path(workdir) / "gateway.log"
    argv = [sys.executable, "-m", "kiln_registry.gateway", "--host=127.0.0.1", f"--port={port}",
            f"--upstream-uds={workdir}/relay.sock", f"--served-model-id={SERVED}",
            f"--max-model-len={MAX_MODEL_LEN}", f"--max-top-k={MAX_TOP_K}",
            f"--api-key-env={KEY_ENV}"]  # fmt: skip
    env = {**child_environment(), KEY_ENV: key.decode()}
    with log.open("ab") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        wait_health(f"http://127.0.0.1:{port}", proc, 120, log)  # /health needs no key
        yield f"http://127.0.0.1:{port}", key, relay
    finally:
        assert stop(proc, signal.SIGTERM) == 0, tail(log)
        relay.close()
        assert key not in log.read_bytes()


def test_no_authorization_header_reaches_vllm(keyed_gateway: tuple[str, bytes, Relay]) -> None:
    url, key, relay = keyed_gateway
    wrong = b"kiln-gw-" + secrets.token_hex(24).encode()
    completion = {"model": SERVED, "prompt": [1, 2, 3, 4], "max_tokens": 1, "prompt_logprobs": 2}
    before = relay.recorded()  # the fixture's /health polls, forwarded without a key
    with httpx.Client(base_url=url, timeout=300, trust_env=False) as http:
        refused = http.post("/v1/completions", json=completion,
                            headers={"Authorization": "Bearer " + wrong.decode()})  # fmt: skip
        assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
        assert http.get("/v1/models").status_code == 401  # no header at all
        assert relay.recorded() == before  # refused requests never reach vLLM
        bearer = {"Authorization": "Bearer " + key.decode()}
        models = http.get("/v1/models", headers=bearer)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == SERVED
        answer = http.post("/v1/completions", json=completion, headers=bearer)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["choices"][0]["prompt_logprobs"]) == 4
    sent = relay.recorded()
    assert sent.startswith(before) and b"GET /health HTTP/1.1\r\n" in before
    assert sent[len(before) :].count(b"POST /v1/completions HTTP/1.1\r\n") == 1
    assert sent[len(before) :].count(b"GET /v1/models HTTP/1.1\r\n") == 1
    assert b"authorization" not in sent.lower() and b"bearer" not in sent.lower()
    assert key not in sent and wrong not in sent and key[8:24] not in sent
