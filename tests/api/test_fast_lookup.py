"""The cached lookup path answers exactly what the router would, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from kiln_registry.api.fast_lookup import cached_alias
from tests.api.support import RegistryServer, remote


def _scope(path: str, method: str = "GET", query: bytes = b"") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "query_string": query}


@pytest.mark.parametrize(
    ("scope", "alias"),
    [
        (_scope("/v1/teachers/t@vllm"), "t@vllm"),
        (_scope("/v1/teachers/qwen/qwen3-8b@vllm"), "qwen/qwen3-8b@vllm"),
        (_scope("/v1/teachers/t@vllm", method="HEAD"), None),
        (_scope("/v1/teachers/t@vllm", method="DELETE"), None),
        (_scope("/v1/teachers/t@vllm", query=b"x=1"), None),
        (_scope("/v1/teachers/t@vllm/receipts"), None),
        (_scope("/v1/teachers/"), None),
        (_scope("/v1/teachers"), None),
        (_scope("/v1/jobs/t@vllm"), None),
        ({"type": "lifespan"}, None),
    ],
)
def test_only_plain_gets_of_one_alias_are_candidates(
    scope: dict[str, Any], alias: str | None
) -> None:
    assert cached_alias(scope) == alias


def test_a_cached_answer_is_the_routes_own_answer(
    registry: RegistryServer, teacher_url: str
) -> None:
    with registry.client() as http:
        assert http.post("/v1/teachers", json=remote("fast@vllm", teacher_url)).status_code == 200
        routed = http.get("/v1/teachers/fast@vllm")  # renders and fills the cache
        assert registry.ctx.entry_cache().get("fast@vllm") is not None
        cached = http.get("/v1/teachers/fast@vllm")  # served by the cached path
        encoded = http.get("/v1/teachers/fast%40vllm")
        assert routed.status_code == cached.status_code == encoded.status_code == 200
        assert routed.content == cached.content == encoded.content
        for name in ("content-type", "content-length"):
            assert routed.headers[name] == cached.headers[name] == encoded.headers[name]
        # A query string or a suffix route is never answered from the cache.
        assert http.get("/v1/teachers/fast@vllm/receipts").json()["receipts"]
        assert http.get("/v1/teachers/fast@vllm", params={"x": "1"}).content == routed.content
        # A delete empties the cache at once: the next read is the router's 404.
        assert http.delete("/v1/teachers/fast@vllm").status_code == 200
        gone = http.get("/v1/teachers/fast@vllm")
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "teacher_not_found"
