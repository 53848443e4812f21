"""The browser pages' server side: ``/docs``, ``/ui`` and ``/assets/<name>`` (``api.ui``).

With ``[server] auth = "required"`` the pages and their files are open (fixed
files, no data) while ``/openapi.json`` and the API still need a token; every
page response carries the strict Content-Security-Policy; the pages hold no
inline script and no URL outside the registry; Swagger UI's files come from the
installed ``fastapi-offline`` package; an unknown asset name is a 404 envelope.
(The pages running in a browser: ``tests/browser``.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.api.ui.assets import ASSETS, CSP, swagger_dir
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.auth.support import bearer, create_token

EXTERNAL = re.compile(r"""(https?:)?//[a-z0-9]""", re.IGNORECASE)
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE)


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[tuple[RegistryServer, str]]:
    directory = tmp_path_factory.mktemp("pages")
    config = write_config(directory, student=tiny_model.path, server={"auth": "required"})
    token = create_token(directory / "registry.db", "reader", {"read"})
    with run_registry(config) as registry:
        yield registry, token


@pytest.mark.parametrize("path", ["/docs", "/ui"])
def test_pages_are_open_static_shells_with_a_strict_policy(
    secured: tuple[RegistryServer, str], path: str
) -> None:
    registry, _ = secured
    with registry.client() as http:
        page = http.get(path)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-eval" not in CSP
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["cache-control"] == "no-store"
    assert INLINE_SCRIPT.search(page.text) is None
    assert EXTERNAL.search(page.text) is None
    for src in re.findall(r"""(?:src|href)="([^"]+)\"""", page.text):
        assert src.startswith("/"), src


def test_the_root_leads_to_the_dashboard(secured: tuple[RegistryServer, str]) -> None:
    registry, _ = secured
    with registry.client() as http:
        answer = http.get("/")
    assert answer.status_code == 307 and answer.headers["location"] == "/ui"
    assert answer.headers["content-security-policy"] == CSP


def test_every_asset_is_served_without_a_token(secured: tuple[RegistryServer, str]) -> None:
    registry, _ = secured
    with registry.client() as http:
        for name, (where, media_type) in ASSETS.items():
            answer = http.get(f"/assets/{name}")
            assert answer.status_code == 200, (name, answer.text[:200])
            assert answer.headers["content-type"] == media_type
            assert answer.headers["content-security-policy"] == CSP
            if where == "swagger":
                assert answer.content == (swagger_dir() / name).read_bytes()
    assert Path(swagger_dir()).is_dir()


def test_own_scripts_never_write_html(secured: tuple[RegistryServer, str]) -> None:
    registry, _ = secured
    with registry.client() as http:
        for name in ("ui.js", "docs.js"):
            script = http.get(f"/assets/{name}").text
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
                assert sink not in script, (name, sink)


def test_data_still_needs_a_token(secured: tuple[RegistryServer, str]) -> None:
    registry, token = secured
    with registry.client() as http:
        assert http.get("/openapi.json").status_code == 401
        assert http.get("/v1/teachers").status_code == 401
        assert http.get("/openapi.json", headers=bearer(token)).status_code == 200
        # Only GET/HEAD of the pages' files are open: anything else needs admin.
        assert http.post("/assets/ui.js", json={}).status_code == 401


@pytest.mark.parametrize("name", ["nothing.js", "..%2Fapp.py", "%2e%2e", "ui.JS", "x" * 65])
def test_unknown_assets_are_refused(secured: tuple[RegistryServer, str], name: str) -> None:
    registry, _ = secured
    with registry.client() as http:
        answer = http.get(f"/assets/{name}")
    assert answer.status_code in (400, 404), answer.text
    assert error_of(answer)["code"] in ("not_found", "invalid_request")
