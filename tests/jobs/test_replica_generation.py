"""Off-policy generation jobs over a teacher replica set spread over every proved replica.

Real parts only: two reference teachers serving the chat model on loopback, each
behind an ASGI wrapper that counts its completion requests.  A generation job on
the two-URL alias sends generation (and, with ``top_k > 0``, Kiln-token scoring)
requests to both replicas beyond their job probes, and its corpus equals the same
job's on one teacher (greedy generation is deterministic), the job id, alias and
signature set aside.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from tests.helpers import serve_app
from tests.jobs.generation_harness import CHAT_MODEL_ID, MESSAGES, submit_generation
from tests.jobs.harness import Registry, make_config, running_registry

PROBES = 3  # completion requests of one replica's job probes (tests/jobs/test_replica_jobs)


class Counting:
    """ASGI: counts the completion requests it passes to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.count = 0
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/completions"):
            with self._lock:
                self.count += 1
        await self.app(scope, receive, send)


def _register(reg: Registry, alias: str, urls: list[str]) -> None:
    body: dict[str, Any] = {"alias": alias, "kind": "remote", "provider": "vllm",
                            "model_id": CHAT_MODEL_ID}  # fmt: skip
    body.update({"url": urls[0]} if len(urls) == 1 else {"urls": urls})
    response = reg.http.post("/v1/teachers", json=body)
    assert response.status_code == 200, response.text


def _examples(reg: Registry, alias: str) -> list[dict[str, Any]]:
    """A greedy job's examples, the job id and alias set aside."""
    prompts = [{"id": f"p{i}", "messages": m} for i, m in enumerate(MESSAGES)]
    submitted = submit_generation(reg.http, alias, prompts=prompts, max_tokens=5, top_k=4)
    assert submitted.status_code == 201, submitted.text
    job = reg.wait(submitted.json()["id"], timeout=180.0)
    assert job["status"] == "succeeded", job
    body = reg.http.get(f"/v1/jobs/{job['id']}/result")
    assert body.status_code == 200 and body.headers["x-kiln-corpus-signature"]
    examples = [json.loads(line) for line in body.content.decode().splitlines()[1:]]
    for example in examples:
        assert example["metadata"].pop("job_id") == job["id"]
        assert example["metadata"].pop("teacher") == alias
    return examples


@contextlib.contextmanager
def _replicas(model: Path, count: int) -> Iterator[list[tuple[str, Counting]]]:
    teacher, _ = load_reference_teacher(
        model, served_model_id=CHAT_MODEL_ID, max_top_k=8, max_model_len=64
    )
    with contextlib.ExitStack() as stack:
        served = []
        for _ in range(count):
            app = Counting(create_reference_app(teacher, api_key_env=None))
            served.append((stack.enter_context(serve_app(app)), app))
        yield served


def test_a_generation_job_spreads_over_both_replicas(tmp_path: Path, chat_model: Path) -> None:
    # No cache: the second job must really generate again.
    config = make_config(tmp_path, chat_model, concurrency=2, cache=False)
    with _replicas(chat_model, 3) as served, running_registry(config) as reg:
        (single, _), (url_a, app_a), (url_b, app_b) = served
        _register(reg, "one", [single])
        _register(reg, "set", [url_a, url_b])
        expected = _examples(reg, "one")
        before = (app_a.count, app_b.count)
        assert _examples(reg, "set") == expected
        # Both replicas answered generation requests beyond their job probes.
        assert app_a.count - before[0] > PROBES, (before, app_a.count)
        assert app_b.count - before[1] > PROBES, (before, app_b.count)
        entry = reg.http.get("/v1/teachers/set").json()
        assert {r["status"] for r in entry["replicas"]} == {"verified"}
