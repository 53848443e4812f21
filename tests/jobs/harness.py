"""Test harness for the job queue: a real registry on loopback with its workers running.

``Registry`` runs ``create_app(build_context(config))`` under uvicorn in a
thread *with* its lifespan (so the job workers run), on a migrated SQLite
file in ``tmp_path``.  ``controlled_teacher`` is a vLLM-like handler for
``tests/probe/teacher_server.TeacherServer`` whose fingerprint per request
the test decides.  Real sockets on 127.0.0.1 only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kiln_registry.config.settings import KilnConfig
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.serve.startup import build_context
from tests.pg_server import database_settings
from tests.probe.teacher_server import (
    HASH_A,
    HASH_C,
    HASH_F,
    Reply,
    Request,
    completion_body,
    vllm_error,
)

TERMINAL = ("succeeded", "failed", "cancelled")


def make_config(tmp_path: Path, student: Path, **jobs: Any) -> KilnConfig:
    (tmp_path / "corpora").mkdir(exist_ok=True)
    return KilnConfig.model_validate(
        {
            "server": database_settings(tmp_path / "db"),  # KILN_TEST_BACKEND decides
            "student": {"model_path": str(student)},
            "jobs": {
                "corpus_root": str(tmp_path / "corpora"),
                "result_root": str(tmp_path / "results"),
                **jobs,
            },
        }
    )


@dataclass
class Registry:
    url: str
    http: httpx.Client
    ctx: Any

    def register(self, alias: str, teacher_url: str, model_id: str) -> dict[str, Any]:
        body = {"alias": alias, "kind": "remote", "provider": "vllm", "model_id": model_id,
                "url": teacher_url}  # fmt: skip
        response = self.http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def submit(self, teacher: str, top_k: int, **source: Any) -> httpx.Response:
        body = {"kind": "teacher_scoring", "teacher": teacher, "top_k": top_k, **source}
        return self.http.post("/v1/jobs", json=body)

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait(
        self, job_id: str, statuses: tuple[str, ...] = TERMINAL, timeout: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in statuses:
                return job
            assert time.monotonic() < deadline, f"job stuck: {job}"
            time.sleep(0.02)


@contextmanager
def running_registry(config: KilnConfig, timeout: float = 20.0) -> Iterator[Registry]:
    """The full registry app (lifespan on: job workers run) on a free loopback port."""
    import uvicorn

    from kiln_registry.api.app import create_app
    from kiln_registry.reference_teacher.app import bind_socket

    ctx = build_context(config)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(ctx), log_level="warning", access_log=False, lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "registry did not start"
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as http:
            yield Registry(url=url, http=http, ctx=ctx)
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
        ctx.close()  # the entry cache's connection too (PostgreSQL: a held driver connection)


def student_identity(
    vocab_sha256: str, *, inference: str = HASH_F, max_top_k: int = 8
) -> TeacherIdentity:
    """A vLLM-style identity whose vocabulary matches the tiny student (width 512)."""
    return TeacherIdentity(
        served_model_id="teacher-tiny",
        base_model_sha256=HASH_A,
        tokenizer_vocab_sha256=vocab_sha256,
        tokenizer_config_sha256=HASH_C,
        adapter=None,
        vocab_size=512,
        max_top_k=max_top_k,
        max_model_len=64,
        max_prompt_logprob_candidates=64 * (max_top_k + 1),
        implementation="vllm:0.32.0",
        inference_config_sha256=inference,
    )


@dataclass
class Controlled:
    """A teacher whose fingerprint for request ``i`` is ``fingerprint(i)``; optionally slow."""

    identity: TeacherIdentity
    fingerprint: Callable[[int], str] | None = None
    delay_s: float = 0.0
    status_for: Callable[[int], int | None] = lambda index: None
    gate: threading.Event | None = None
    prompts: list[list[int]] = field(default_factory=list)

    def __call__(self, request: Request, index: int) -> Reply:
        req = request.json()
        k = req["prompt_logprobs"]
        assert isinstance(k, int)
        if k > self.identity.max_top_k:
            return vllm_error(f"Requested prompt logprobs of {k}")
        forced = self.status_for(index)
        if forced == -1:  # the connection ends in the middle of the body
            return Reply(body=b'{"object":"text_completion","choices":[]}', mode="close_mid")
        if forced is not None:
            return vllm_error("engine overloaded", status=forced)
        prompt = req["prompt"]
        assert isinstance(prompt, list)
        self.prompts.append(prompt)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.gate is not None and prompt != [0, 0]:  # scoring, not a probe: hold it
            assert self.gate.wait(30), "the test never opened the gate"
        fp = self.fingerprint(index) if self.fingerprint else self.identity.fingerprint()
        return Reply(
            body=completion_body(model=str(req["model"]), fingerprint=fp, prompt=prompt, k=k)
        )
