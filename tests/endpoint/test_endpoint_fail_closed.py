"""The endpoint fails closed: a swapped teacher, a killed replica, a deleted alias, access.

* A real wrapper server answers as the pinned reference teacher until it is flipped to a
  reference teacher of another identity (max_top_k 7): the next answer is never relayed
  (502 ``teacher_identity_changed``), TRL's next call raises, every later request is 503,
  and the registry, told through its API, marks the alias unavailable.
* A replica set of two: replica 0 is stopped mid-run; its requests go to replica 1 and the
  results are equal.
* The registry deletes the alias while the endpoint serves: 503 naming it.
* Off loopback: refused without TLS and an API key; with both, HTTPS and the key work.
All real processes and sockets on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import SERVED, TlsFiles
from tests.api.support import RegistryServer
from tests.endpoint.conftest import ALIAS, register
from tests.endpoint.support import EndpointProcess, Switch, tokens
from tests.helpers import serve_app

Reference = tuple[ReferenceTeacher, TeacherIdentity]
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def other_teacher(tiny_model: TinyModel) -> Reference:
    """The same model under another identity (max_top_k 7): a teacher swapped behind a URL."""
    return load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=7, max_model_len=64
    )


def _body(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 4, **extra}


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.filterwarnings(
    "ignore:TRL currently supports vLLM versions:UserWarning",
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning",  # importing TRL/vLLM
)
def test_a_flipped_fingerprint_is_never_relayed_and_the_alias_goes_unavailable(
    registry: RegistryServer, reference: Reference, other_teacher: Reference, tmp_path: Path
) -> None:
    from trl.generation.vllm_client import VLLMClient

    switch = Switch(
        create_reference_app(reference[0], api_key_env=None),
        create_reference_app(other_teacher[0], api_key_env=None),
    )
    with serve_app(switch) as url:
        register(registry, ALIAS, [url])
        with EndpointProcess(ALIAS, registry.url, tmp_path / "endpoint.log") as endpoint:
            endpoint.wait_ready()
            trl = VLLMClient(base_url=endpoint.url)
            before = trl.get_sequence_logprobs([tokens(10)], [4], top_logprobs=4)
            assert len(before["logprobs"][0]) == 6
            switch.flip()
            with endpoint.client() as http:
                refused = http.post("/v1/completions", json=_body(tokens(10)))
                assert refused.status_code == 502
                error = refused.json()["error"]
                assert "choices" not in refused.json()
                assert (error["type"], error["rule"]) == (
                    "teacher_identity_changed",
                    "endpoint.fingerprint",
                )
                with pytest.raises(Exception):  # noqa: B017 - TRL raises a plain Exception
                    trl.get_sequence_logprobs([tokens(10)], [4], top_logprobs=4)
                after = http.post("/v1/completions", json=_body(tokens(10)))
                assert after.status_code == 503 and "fenced" in after.json()["error"]["message"]
                assert http.get("/health").status_code == 503
                metrics = http.get("/metrics").text
                assert "kiln_endpoint_fenced_replicas 1.0" in metrics
            with registry.client() as api:
                _until(
                    lambda: api.get(f"/v1/teachers/{ALIAS}").json()["usable"] is False,
                    "the registry to mark the alias unavailable",
                )
                receipts = api.get(f"/v1/teachers/{ALIAS}/receipts").json()["receipts"]
                assert receipts[0]["outcome"] == "failed"
            assert "fenced" in endpoint.output()


def test_a_killed_replica_hands_its_requests_to_the_other(
    registry: RegistryServer, reference: Reference, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as second, contextlib.ExitStack() as first:
        urls = [
            first.enter_context(serve_app(create_reference_app(reference[0], api_key_env=None))),
            second.enter_context(serve_app(create_reference_app(reference[0], api_key_env=None))),
        ]
        entry = register(registry, ALIAS, urls)
        assert len(entry["replicas"]) == 2  # type: ignore[arg-type]
        with EndpointProcess(ALIAS, registry.url, tmp_path / "endpoint.log") as endpoint:
            endpoint.wait_ready()
            prompts = [tokens(12, start=s) for s in range(4)]
            with endpoint.client() as http:
                expected = [http.post("/v1/completions", json=_body(p)).json() for p in prompts]
                first.close()  # replica 0 stops mid-run
                for prompt, want in zip(prompts, expected, strict=True):
                    got = http.post("/v1/completions", json=_body(prompt))
                    assert got.status_code == 200, got.text
                    assert got.json()["choices"] == want["choices"]
                assert "kiln_endpoint_live_replicas 1.0" in http.get("/metrics").text
                assert http.get("/health").status_code == 200


def test_deleting_the_alias_stops_the_endpoint(
    registry: RegistryServer, teacher_url: str, tmp_path: Path
) -> None:
    register(registry, ALIAS, [teacher_url])
    log = tmp_path / "endpoint.log"
    with EndpointProcess(ALIAS, registry.url, log, "--recheck-s", "0.3") as endpoint:
        endpoint.wait_ready()
        with endpoint.client() as http:
            assert http.post("/v1/completions", json=_body(tokens(5))).status_code == 200
            with registry.client() as api:
                assert api.delete(f"/v1/teachers/{ALIAS}").status_code == 200

            def stopped() -> bool:
                return http.post("/v1/completions", json=_body(tokens(5))).status_code == 503

            _until(stopped, "the endpoint to stop serving the deleted alias")
            error = http.post("/v1/completions", json=_body(tokens(5))).json()["error"]
            assert "no longer has" in error["message"] and error["type"] == (
                "teacher_endpoint_unavailable"
            )
    with EndpointProcess(ALIAS, registry.url, tmp_path / "again.log") as again:
        assert again.wait_exit() == 2
        assert "teacher_not_found" in again.output() or "not found" in again.output().lower()


def test_off_loopback_needs_tls_and_a_key(
    registry: RegistryServer, teacher_url: str, tls_files: TlsFiles, tmp_path: Path
) -> None:
    with EndpointProcess(
        ALIAS, "http://127.0.0.1:1", tmp_path / "refused.log", listen="0.0.0.0:0"
    ) as refused:
        assert refused.wait_exit() == 2
        assert "endpoint.listen_off_loopback" in refused.output()
    register(registry, ALIAS, [teacher_url])
    key_env = "KILN_TEST_ENDPOINT_KEY"
    tls = ("--tls-cert-file", str(tls_files.cert_pem), "--tls-key-file", str(tls_files.cert_pem))
    with EndpointProcess(
        ALIAS, registry.url, tmp_path / "tls.log", *tls, "--api-key-env", key_env,
        env={key_env: "sk-endpoint-test-key"}, listen="0.0.0.0:0",
    ) as endpoint:  # fmt: skip
        endpoint.wait_ready()
        port = endpoint.url.rsplit(":", 1)[1]
        assert endpoint.url.startswith("https://")
        base = f"https://localhost:{port}"
        trust = ssl.create_default_context(cafile=str(tls_files.ca_pem))
        with httpx.Client(base_url=base, verify=trust, trust_env=False) as http:
            assert http.get("/health").status_code == 200
            assert http.get("/v1/models").status_code == 401
            assert http.post("/v1/completions", json=_body(tokens(5))).status_code == 401
            auth = {"authorization": "Bearer sk-endpoint-test-key"}
            assert http.get("/v1/models", headers=auth).status_code == 200
            ok = http.post("/v1/completions", json=_body(tokens(5)), headers=auth)
            assert ok.status_code == 200, ok.text
        assert "sk-endpoint-test-key" not in endpoint.output()
