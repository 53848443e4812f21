"""Shared pieces of the off-policy generation tests.

``chat_model`` copies the tiny model and gives its tokenizer a chat template
(the tiny builder has none, and other tests' identities must not change);
``chat_teacher`` serves that copy with the reference teacher;
``rewriting_proxy`` forwards to a real teacher and lets a test rewrite
generation answers, for misbehaviour a correct teacher cannot produce.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response

from kiln_registry.identity.document import TeacherIdentity
from tests.helpers import serve_app

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CHAT_MODEL_ID = "tiny-chat"
MESSAGES = [
    [{"role": "user", "content": "the teacher says hello"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a cat"}],
    [{"role": "user", "content": "doan zy"}],
    [{"role": "user", "content": "quto"}],
]


def add_chat_template(source: Path, dest: Path) -> Path:
    """A copy of the model directory ``source`` whose tokenizer has ``CHAT_TEMPLATE``."""
    shutil.copytree(source, dest)
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return dest


@dataclass(frozen=True)
class ChatTeacher:
    url: str
    identity: TeacherIdentity
    teacher: Any  # the loaded ReferenceTeacher


@contextmanager
def chat_teacher(
    model: Path, *, max_model_len: int = 64, max_top_k: int = 8
) -> Iterator[ChatTeacher]:
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    teacher, identity = load_reference_teacher(
        model, served_model_id=CHAT_MODEL_ID, max_top_k=max_top_k, max_model_len=max_model_len
    )
    with serve_app(create_reference_app(teacher, api_key_env=None)) as url:
        yield ChatTeacher(url=url, identity=identity, teacher=teacher)


Rewrite = Callable[[int, dict[str, Any]], dict[str, Any] | bytes]


@contextmanager
def rewriting_proxy(upstream: str, rewrite: Rewrite) -> Iterator[str]:
    """A proxy to ``upstream`` that passes ``rewrite(i, body)`` for generation answer ``i``.

    Generation requests are the ones asking ``return_token_ids``; probes pass unchanged.
    """
    app = FastAPI(openapi_url=None)
    count = [0]

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        async with httpx.AsyncClient(base_url=upstream, timeout=60.0, trust_env=False) as http:
            answer = await http.request(request.method, "/" + path, content=body,
                                        headers={"content-type": "application/json"})  # fmt: skip
        content = answer.content
        if body and json.loads(body).get("return_token_ids") and answer.status_code == 200:
            index, count[0] = count[0], count[0] + 1
            changed = rewrite(index, json.loads(content))
            content = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
        return Response(content=content, status_code=answer.status_code,
                        media_type="application/json")  # fmt: skip

    with serve_app(app) as url:
        yield url


def submit_generation(http: httpx.Client, teacher: str, **fields: Any) -> httpx.Response:
    body = {"kind": "off_policy_generation", "teacher": teacher, **fields}
    return http.post("/v1/jobs", json=body)
