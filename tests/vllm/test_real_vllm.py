"""Real vLLM (CPU build) end to end: launcher, registry, parity, local teachers, refusals.

One ``kiln-teacher`` launch serves the first tests (session fixture); the
adapter deployment, the stock vLLM and the registry's own local launch each
need their own server.  See conftest.py for the skip/fail rule.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.launch import base_model_name
from kiln_registry.launcher.runtime import runtime_content
from kiln_registry.launcher.runtime_memo import MEMO_NAME, RuntimeMemo
from kiln_registry.parity.run import ParityOptions, ParityTarget, parity
from kiln_registry.testing.tiny_models import TinyModel
from tests.vllm.conftest import LOCAL_PROFILE, LOCAL_SERVED
from tests.vllm.support import (
    READY_S,
    SERVED,
    Launched,
    Registry,
    launch,
    private_dir,
    start_launch,
    start_stock_vllm,
    stop,
    tail,
)

KEPT = ("attempts.jsonl", MEMO_NAME)  # what a launch leaves in its cache root, by design
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]


def remote(alias: str, url: str, model_id: str) -> dict[str, str]:
    return {"alias": alias, "kind": "remote", "provider": "vllm", "url": url, "model_id": model_id}


def test_launched_teacher_registers_with_the_launchers_identity(
    launched: Launched, registry: Registry
) -> None:
    with registry.client() as http:
        response = http.post("/v1/teachers", json=remote("vllm-tiny", launched.url + "/v1", SERVED))
        assert response.status_code == 200, response.text
        entry = http.get("/v1/teachers/vllm-tiny").json()
    assert entry["status"] == "verified" and entry["usable"] is True
    assert entry["identity_revision"] == "sha256:" + launched.announcement["identity_sha256"]
    identity = verify_fingerprint(launched.announcement["fingerprint"])
    assert entry["spec"]["identity"]["implementation"] == identity.implementation
    assert identity.implementation.startswith("vllm:")
    assert Path(launched.announcement["snapshot_path"]).parent == launched.snapshots


def test_prompt_logprobs_equal_the_reference_teacher(
    launched: Launched, reference_url: str
) -> None:
    options = ParityOptions(atol=1e-5, top_k=8, prompts=2)
    report = parity(ParityTarget(launched.url), ParityTarget(reference_url), options)
    assert report["grade"] in ("identical", "within_tolerance"), report
    assert report["positions"] == ["first", "interior", "final"]
    assert report["same_identity"] is False  # different implementations, same numbers


def test_local_teacher_registers_through_the_server(registry: Registry) -> None:
    snapshots, caches = registry.local_roots
    body = {"alias": "local-tiny", "kind": "local", "launch_profile": LOCAL_PROFILE}
    with registry.client() as http:
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text + registry.log.read_text()[-3000:]
        entry = response.json()
        assert entry["status"] == "verified" and entry["usable"] is True
        assert entry["spec"]["model_id"] == LOCAL_SERVED and entry["spec"]["kind"] == "local"
        assert entry["spec"]["identity"]["implementation"].startswith("vllm:")
        assert len(os.listdir(snapshots)) == 1
        assert http.delete("/v1/teachers/local-tiny").status_code == 200
    assert os.listdir(snapshots) == []
    assert [name for name in os.listdir(caches) if name not in KEPT] == []


def test_stock_vllm_is_refused(tiny_model: TinyModel, registry: Registry, tmp_path: Path) -> None:
    proc, url = start_stock_vllm(tiny_model.path, tmp_path / "stock.log")
    try:
        with registry.client() as http:
            response = http.post("/v1/teachers", json=remote("stock", url + "/v1", "stock"))
            assert response.status_code == 502, response.text
            assert response.json()["error"]["code"] == "teacher_identity_probe_failed"
            assert "fingerprint" in response.json()["error"]["message"]
            assert http.get("/v1/teachers/stock").status_code == 404
    finally:
        stop(proc)
        with contextlib.suppress(ProcessLookupError):  # an engine process outliving its parent
            os.killpg(proc.pid, signal.SIGKILL)


def test_adapter_base_alias_is_refused(
    tiny_model: TinyModel, tiny_adapter: Path, registry: Registry, tmp_path: Path
) -> None:
    teacher = launch(tmp_path, tiny_model.path, served="tiny-lora", adapter=tiny_adapter)
    try:
        identity = verify_fingerprint(teacher.announcement["fingerprint"])
        assert identity.adapter is not None
        base = base_model_name(identity.base_model_sha256)
        _base_alias_refused_at_the_gateway(teacher, base)
        with registry.client() as http:
            refused = http.post("/v1/teachers", json=remote("lora-base", teacher.url + "/v1", base))
            assert refused.status_code == 502, refused.text
            assert refused.json()["error"]["code"] == "teacher_identity_probe_failed"
            assert http.get("/v1/teachers/lora-base").status_code == 404
            lora = remote("lora", teacher.url + "/v1", "tiny-lora")
            served = http.post("/v1/teachers", json=lora)
            assert served.status_code == 200, served.text
            assert served.json()["spec"]["identity"]["adapter"]["name"] == "tiny-lora"
    finally:
        stop(teacher.proc, signal.SIGTERM)
    assert teacher.leftovers() == []


def _base_alias_refused_at_the_gateway(teacher: Launched, base: str) -> None:
    """vLLM itself serves ``base`` on its socket; the gateway refuses it by name (404)."""
    body = {"model": base, "prompt": [1, 2, 3], "max_tokens": 1}
    (uds,) = glob.glob(f"/tmp/kiln-{teacher.proc.pid}-*/vllm.sock")
    with httpx.Client(transport=httpx.HTTPTransport(uds=uds), timeout=300) as vllm:
        assert vllm.post("http://vllm/v1/completions", json=body).status_code == 200
    refused = httpx.post(teacher.url + "/v1/completions", json=body, timeout=300, trust_env=False)
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
    assert "internal base alias" in error["message"]


def test_sigint_while_launching_leaves_nothing(tiny_model: TinyModel, tmp_path: Path) -> None:
    """SIGINT after the snapshot is sealed (runtime hashing runs): nothing may remain.

    SIGTERM with vLLM running is checked by the ``launched`` fixture's teardown.
    """
    teacher = start_launch(tmp_path, tiny_model.path)
    try:
        deadline = time.monotonic() + READY_S
        while not any(p.name.startswith("ready-") for p in teacher.snapshots.iterdir()):
            assert teacher.proc.poll() is None, tail(teacher.log)
            assert time.monotonic() < deadline, "no sealed snapshot appeared"
            time.sleep(0.05)
    finally:
        status = stop(teacher.proc, signal.SIGINT)
    assert status == 128 + signal.SIGINT, tail(teacher.log)
    assert teacher.leftovers() == []


def test_a_forged_runtime_memo_fails_the_launch_before_anything_is_served(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    """The memo only shortens the measurement before spawn: the recheck child hashes the
    runtime again, disagrees with a forged digest, and the launch exits 2 with vLLM
    drained, having answered nothing on its port; the memo is removed."""
    caches = private_dir(tmp_path / "caches")
    fd = os.open(caches, os.O_RDONLY | os.O_DIRECTORY)
    try:
        runtime_content(limiter=ReadRateLimiter(None), memo=RuntimeMemo(fd))
    finally:
        os.close(fd)
    memo = json.loads((caches / MEMO_NAME).read_bytes())
    memo["entries"][0]["sha256"] = "0" * 64  # this runtime's signature, another digest
    (caches / MEMO_NAME).write_text(json.dumps(memo))

    teacher = start_launch(tmp_path, tiny_model.path)
    answered: list[int] = []
    try:
        deadline = time.monotonic() + READY_S
        while teacher.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                got = httpx.get(teacher.url + "/health", timeout=2, trust_env=False)
                answered.append(got.status_code)
            time.sleep(0.25)
    finally:
        status = stop(teacher.proc, signal.SIGTERM)
    assert status == 2, tail(teacher.log)
    assert answered == [], answered
    assert "launcher.recheck_mismatch" in teacher.log.read_text(), tail(teacher.log)
    spawned = [json.loads(line) for line in (caches / "attempts.jsonl").read_text().splitlines()]
    assert spawned and spawned[-1]["pid"], spawned  # vLLM had been spawned, and was drained
    assert not (caches / MEMO_NAME).exists()
    assert teacher.leftovers() == []
