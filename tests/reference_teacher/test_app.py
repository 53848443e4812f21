"""The reference teacher over real HTTP: uvicorn on 127.0.0.1, and the ``kiln`` CLI.

Bodies are compared with the captured vLLM responses (errors byte for byte);
the API key is read from its variable per request and never shows up in a
response, header, log line or the CLI's output.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import captured, serve_app

KEY_ENV = "REF_TEACHER_TEST_KEY"
KEY = "sk-reference-Zq81-never-printed"
pytestmark = pytest.mark.secret_env(KEY_ENV)
ERRORS = ["err_pl33", "err_pl_minus2", "err_pl_stream", "err_wrong_model", "err_token_oob",
          "err_too_long", "err_no_key", "err_bad_key"]  # fmt: skip


@pytest.fixture(scope="module")
def loaded(tiny_model: TinyModel) -> tuple[ReferenceTeacher, TeacherIdentity]:
    return load_reference_teacher(
        tiny_model.path, served_model_id="teacher-tiny", max_top_k=32, max_model_len=256
    )


@pytest.fixture(scope="module")
def url(loaded: tuple[ReferenceTeacher, TeacherIdentity]) -> Iterator[str]:
    with serve_app(create_reference_app(loaded[0], api_key_env=KEY_ENV)) as base:
        yield base


@pytest.fixture
def client(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    monkeypatch.setenv(KEY_ENV, KEY)
    with httpx.Client(base_url=url, timeout=30, trust_env=False) as http:
        yield http


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _replay(client: httpx.Client, name: str, **headers: str) -> tuple[httpx.Response, bytes, Any]:
    raw, meta = captured(name)
    sent = headers or (_auth() if meta["request"]["api_key_sent"] else {})
    response = client.post("/v1/completions", json=meta["request"]["body"], headers=sent)
    return response, raw, meta


def test_health_and_version_need_no_key(client: httpx.Client) -> None:
    health = client.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert client.get("/version").json() == {"version": "transformers:" + _transformers()}


def _transformers() -> str:
    import transformers

    return str(transformers.__version__)


def test_models_is_guarded_and_shaped_like_vllm(client: httpx.Client) -> None:
    assert client.get("/v1/models").status_code == 401
    ours = client.get("/v1/models", headers=_auth()).json()
    theirs = json.loads(captured("models")[0])
    assert list(ours) == list(theirs)
    assert list(ours["data"][0]) == list(theirs["data"][0])
    assert list(ours["data"][0]["permission"][0]) == list(theirs["data"][0]["permission"][0])
    assert (ours["data"][0]["id"], ours["data"][0]["max_model_len"]) == ("teacher-tiny", 256)


@pytest.mark.parametrize(("name", "k"), [("pl0", 0), ("pl1", 1), ("pl32", 32)])
def test_completion_rows_have_vllm_layout(
    client: httpx.Client, loaded: tuple[ReferenceTeacher, TeacherIdentity], name: str, k: int
) -> None:
    response, raw, meta = _replay(client, name)
    assert response.status_code == 200
    ours, theirs = response.json(), json.loads(raw)
    assert list(ours) == list(theirs)
    assert list(ours["choices"][0]) == list(theirs["choices"][0])
    assert ours["system_fingerprint"] == loaded[1].fingerprint()
    assert verify_fingerprint(ours["system_fingerprint"]) == loaded[1]
    rows = ours["choices"][0]["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(meta["request"]["body"]["prompt"])
    for row, token in zip(rows[1:], meta["request"]["body"]["prompt"][1:], strict=True):
        assert next(iter(row)) == str(token)
        assert len(row) in (k, k + 1) if k else len(row) == 1
    assert ours["usage"] == theirs["usage"]


@pytest.mark.parametrize("name", ["pl1_batch2", "pl1_n2", "pl1_single_token"])
def test_batches_and_copies_match_vllm_counts(client: httpx.Client, name: str) -> None:
    response, raw, _ = _replay(client, name)
    ours, theirs = response.json(), json.loads(raw)
    assert [c["index"] for c in ours["choices"]] == [c["index"] for c in theirs["choices"]]
    assert ours["usage"] == theirs["usage"]
    widths = [[len(r or {}) for r in c["prompt_logprobs"]] for c in ours["choices"]]
    assert all(
        len(w) == len(t["prompt_logprobs"]) for w, t in zip(widths, theirs["choices"], strict=True)
    )


@pytest.mark.parametrize("name", ERRORS)
def test_errors_are_byte_identical_to_vllm(client: httpx.Client, name: str) -> None:
    extra = {"Authorization": "Bearer wrong-key"} if name == "err_bad_key" else {}
    response, raw, meta = _replay(client, name, **extra)
    assert response.status_code == meta["status"]
    assert response.content == raw
    assert response.headers["content-type"] == "application/json"


def test_missing_key_variable_refuses_everything(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    response = client.get("/v1/models", headers=_auth())
    assert (response.status_code, response.content) == (401, b'{"error":"Unauthorized"}')
    monkeypatch.setenv(KEY_ENV, "")
    assert client.get("/v1/models", headers=_auth("anything")).status_code == 401
    assert client.get("/v1/models").status_code == 401


def test_oversized_body_is_refused_before_parsing(client: httpx.Client) -> None:
    body = b'{"model":"teacher-tiny","prompt":[' + b"1," * 700_000 + b"1]}"
    response = client.post("/v1/completions", content=body, headers=_auth())
    assert response.status_code == 413
    assert response.json()["error"]["code"] == 413


def test_key_never_appears_in_responses_or_logs(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[bytes] = []
    for headers in (_auth(), _auth(KEY + "x"), {}):
        for response in (
            client.get("/v1/models", headers=headers),
            client.post(
                "/v1/completions", json={"model": "nope", "prompt": [1, 2]}, headers=headers
            ),
            client.post("/v1/completions", content=b"{", headers=headers),
        ):
            seen.append(response.content + repr(response.headers).encode())
    assert all(KEY.encode() not in text for text in seen)
    assert KEY not in caplog.text


def _kiln() -> str:
    return str(Path(sys.executable).parent / "kiln")


def test_cli_refuses_public_host_without_key() -> None:
    result = subprocess.run(
        [_kiln(), "reference-teacher", "--model-path", "/nonexistent", "--served-model-id", "t",
         "--max-top-k", "1", "--max-model-len", "8", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "reference.non_loopback_without_key" in result.stderr


def test_cli_serves_and_never_prints_the_key(tiny_model: TinyModel) -> None:
    env = {**os.environ, KEY_ENV: KEY}
    process = subprocess.Popen(
        [_kiln(), "reference-teacher", "--model-path", str(tiny_model.path),
         "--served-model-id", "teacher-tiny", "--max-top-k", "4", "--max-model-len", "64",
         "--port", "0", "--api-key-env", KEY_ENV, "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 120)
        assert ready, "no startup line within 120 s"
        line = json.loads(process.stdout.readline())
        identity = verify_fingerprint(line["fingerprint"])
        assert line["identity_digest"] == identity.digest()
        assert line["url"].startswith("http://127.0.0.1:")
        body = {"model": "teacher-tiny", "prompt": [1, 5, 9], "max_tokens": 1, "prompt_logprobs": 4}
        with httpx.Client(base_url=line["url"], timeout=30, trust_env=False) as http:
            ok = http.post("/v1/completions", json=body, headers=_auth())
            assert ok.status_code == 200
            assert ok.json()["system_fingerprint"] == line["fingerprint"]
            assert http.post("/v1/completions", json=body).status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises SIGTERM (exit by signal).
    assert process.returncode in (0, -signal.SIGTERM)
    assert KEY not in out and KEY not in err
