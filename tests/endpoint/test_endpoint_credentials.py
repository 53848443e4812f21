"""The endpoint in front of an HTTPS teacher that needs a bearer key, as the registry's probes.

The reference teacher serves over TLS (a trustme CA) and refuses requests without the key
in ``KEY_ENV``; the registry and the endpoint both read ``[teachers.credentials.tls]``
(bound to the teacher's exact origin) and ``[server] teacher_ca_file`` from one kiln.toml.
Requests through the endpoint are answered; the key never reaches its output; an endpoint
whose config lacks the credential refuses to start, naming the unknown id.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import KEY_ENV, SECRET, TlsFiles, TlsTeacher
from tests.api.conftest import tls_teacher as tls_teacher  # shared session fixture
from tests.api.support import remote, run_registry, write_config
from tests.endpoint.support import EndpointProcess, tokens

pytestmark = pytest.mark.secret_env(KEY_ENV)
ALIAS = "tls@vllm"


def test_an_authenticated_tls_teacher_is_served_with_its_credential(
    tmp_path: Path,
    tiny_model: TinyModel,
    tls_teacher: TlsTeacher,
    tls_files: TlsFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    config = write_config(
        tmp_path, student=tiny_model.path, server={"teacher_ca_file": tls_files.ca_pem},
        credentials={"tls": (tls_teacher.origin, KEY_ENV)},
    )  # fmt: skip
    with run_registry(config) as registry:
        with registry.client() as http:
            body = remote(ALIAS, tls_teacher.url, credential_id="tls")
            assert http.post("/v1/teachers", json=body).status_code == 200
        log = tmp_path / "endpoint.log"
        with EndpointProcess(ALIAS, registry.url, log, "--config", str(config)) as endpoint:
            endpoint.wait_ready()
            with endpoint.client() as client:
                answer = client.post(
                    "/v1/completions",
                    json={"model": "teacher-tiny", "prompt": tokens(7), "max_tokens": 1,
                          "prompt_logprobs": 3},
                )  # fmt: skip
                assert answer.status_code == 200, answer.text
                assert len(answer.json()["choices"][0]["prompt_logprobs"]) == 7
                # A request the teacher refuses comes back in vLLM's shape, scrubbed.
                refused = client.post(
                    "/v1/completions",
                    json={"model": "teacher-tiny", "prompt": tokens(7), "top_k": 3},
                )
                assert refused.status_code == 400 and SECRET not in refused.text
            assert SECRET not in endpoint.output()
        bare = tmp_path / "bare.toml"
        bare.write_text(config.read_text().split("[teachers.credentials.tls]")[0], encoding="utf-8")
        with EndpointProcess(ALIAS, registry.url, tmp_path / "bare.log", "--config",
                             str(bare)) as refused_start:  # fmt: skip
            assert refused_start.wait_exit() == 2
            assert "no endpoint of tls@vllm proved" in refused_start.output()
            assert "credential.unknown" in refused_start.output()
