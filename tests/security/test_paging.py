"""Issue 15 attack 7: list answers are bounded pages with an opaque cursor; alias caps hold."""

from __future__ import annotations

import base64

import pytest

from tests.api.support import RegistryServer, error_of


def test_teachers_are_listed_in_pages(registry: RegistryServer) -> None:
    aliases = [f"t{n:02d}" for n in range(7)]
    with registry.client() as http:
        for alias in reversed(aliases):
            body = {"alias": alias, "kind": "fixture", "model_id": "m"}
            assert http.post("/v1/teachers", json=body).status_code == 200
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            params: dict[str, str | int] = {"limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = http.get("/v1/teachers", params=params).json()
            assert len(page["teachers"]) <= 3
            seen += [t["spec"]["alias"] for t in page["teachers"]]
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        assert seen == aliases
        whole = http.get("/v1/teachers").json()
        assert "next_cursor" not in whole and len(whole["teachers"]) == 7  # Kiln's shape


@pytest.mark.parametrize(
    "cursor",
    [
        "not-base64!",
        base64.urlsafe_b64encode(b'{"x":1}').decode(),
        base64.urlsafe_b64encode(b'{"after":"\\ud800"}').decode(),
        "A" * 5000,
    ],
)
def test_bad_cursors_are_400(registry: RegistryServer, cursor: str) -> None:
    with registry.client() as http:
        response = http.get("/v1/teachers", params={"cursor": cursor})
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] in ("invalid_request",)


def test_limits_are_bounded(registry: RegistryServer) -> None:
    with registry.client() as http:
        for limit in (0, 1001, 2**63):
            assert http.get("/v1/teachers", params={"limit": limit}).status_code == 400
