"""Every route x (no token / wrong scope / right scope), with ``[server] auth = "required"``.

The expected scope of each route is written out here (not read from
``auth.scopes``), and the table must list exactly the application's routes, so
a route added later without a scope decision fails this test.  "Wrong scope"
is a token holding every scope except the needed one and ``admin``; "right
scope" holds only the needed one.  The requests name aliases and jobs that do
not exist and send empty bodies, so an authorised request ends in 400/404,
never a state change.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from kiln_registry.api.app import create_app
from kiln_registry.auth.tokens import SCOPES
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.auth.support import bearer, create_token

JOB = "job-" + "0" * 24
# (method, route template) -> (concrete path, body, needed scope or None for open)
ROUTES: dict[tuple[str, str], tuple[str, object, str | None]] = {
    ("GET", "/health"): ("/health", None, None),
    ("GET", "/ready"): ("/ready", None, "read"),
    ("GET", "/metrics"): ("/metrics", None, "read"),
    ("GET", "/docs"): ("/docs", None, None),  # the pages are static shells (api.ui)
    ("GET", "/ui"): ("/ui", None, None),
    ("GET", "/"): ("/", None, None),  # redirects to /ui
    ("GET", "/assets/{name}"): ("/assets/ui.js", None, None),
    ("GET", "/openapi.json"): ("/openapi.json", None, "read"),
    ("GET", "/v1/keys"): ("/v1/keys", None, "read"),
    ("GET", "/v1/teachers"): ("/v1/teachers", None, "read"),
    ("GET", "/v1/teachers/{alias:path}"): ("/v1/teachers/nobody", None, "read"),
    ("GET", "/v1/teachers/{alias:path}/receipts"): ("/v1/teachers/nobody/receipts", None, "read"),
    ("POST", "/v1/teachers"): ("/v1/teachers", {}, "register"),
    ("DELETE", "/v1/teachers/{alias:path}"): ("/v1/teachers/nobody", None, "register"),
    ("POST", "/v1/teachers/{alias:path}/probe"): ("/v1/teachers/nobody/probe", None, "register"),
    ("POST", "/v1/teachers/{alias:path}/report"): ("/v1/teachers/nobody/report", None, "read"),
    ("POST", "/v1/teachers/{alias:path}/launch"): ("/v1/teachers/nobody/launch", None, "register"),
    ("GET", "/v1/jobs"): ("/v1/jobs", None, "read"),
    ("GET", "/v1/jobs/{job_id}"): (f"/v1/jobs/{JOB}", None, "read"),
    ("POST", "/v1/jobs"): ("/v1/jobs", {}, "jobs"),
    ("POST", "/v1/jobs/{job_id}/cancel"): (f"/v1/jobs/{JOB}/cancel", None, "jobs"),
    ("GET", "/v1/jobs/{job_id}/result"): (f"/v1/jobs/{JOB}/result", None, "jobs"),
    ("DELETE", "/v1/jobs/{job_id}"): (f"/v1/jobs/{JOB}", None, "jobs"),
    ("GET", "/v1/audit"): ("/v1/audit", None, "admin"),
    ("POST", "/v1/admin/aliases/{alias:path}/release"): (
        "/v1/admin/aliases/nobody/release",
        None,
        "admin",
    ),
}


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[tuple[RegistryServer, dict[str, str]]]:
    directory = tmp_path_factory.mktemp("matrix")
    config = write_config(directory, student=tiny_model.path, server={"auth": "required"})
    database = directory / "registry.db"
    tokens = {f"only-{s}": create_token(database, f"only-{s}", {s}) for s in SCOPES}
    for scope in SCOPES:
        others = set(SCOPES) - {scope, "admin"}
        tokens[f"not-{scope}"] = create_token(database, f"not-{scope}", others)
    with run_registry(config) as registry:
        yield registry, tokens


def app_routes(registry: RegistryServer) -> set[tuple[str, str]]:
    app = registry_app(registry)
    found: set[tuple[str, str]] = set()
    for route in app.routes:
        methods = getattr(route, "methods", None) or set()
        for method in methods - {"HEAD"}:
            found.add((method, getattr(route, "path", "")))
    return found


def registry_app(registry: RegistryServer) -> FastAPI:
    return create_app(registry.ctx)


def test_the_table_lists_every_route(secured: tuple[RegistryServer, dict[str, str]]) -> None:
    routes = app_routes(secured[0])
    assert routes == set(ROUTES), sorted(routes ^ set(ROUTES))


@pytest.mark.parametrize("key", sorted(ROUTES), ids=lambda k: f"{k[0]} {k[1]}")
def test_route_needs_its_scope(
    secured: tuple[RegistryServer, dict[str, str]], key: tuple[str, str]
) -> None:
    registry, tokens = secured
    path, body, scope = ROUTES[key]
    method = key[0]
    with registry.client() as http:

        def call(headers: dict[str, str] | None) -> httpx.Response:
            return http.request(method, path, json=body, headers=headers)

        anonymous = call(None)
        if scope is None:
            assert anonymous.status_code == (307 if path == "/" else 200)
            return
        assert anonymous.status_code == 401, anonymous.text
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert error_of(anonymous)["code"] == "unauthorized"
        wrong = call(bearer(tokens[f"not-{scope}"]))
        assert wrong.status_code == 403, wrong.text
        assert error_of(wrong)["code"] == "forbidden" and scope in error_of(wrong)["message"]
        for name in (f"only-{scope}", "only-admin"):
            right = call(bearer(tokens[name]))
            assert right.status_code not in (401, 403), (name, right.text)
            assert right.status_code < 500, right.text


def test_metrics_public_opens_ready_and_metrics_only(tmp_path: Path, tiny_model: TinyModel) -> None:
    server = {"auth": "required", "metrics_public": True}
    config = write_config(tmp_path, student=tiny_model.path, server=server)
    with run_registry(config) as registry, registry.client() as http:
        assert http.get("/ready").status_code == 200
        assert http.get("/metrics").status_code == 200
        assert http.get("/v1/teachers").status_code == 401


def test_public_docs_opens_the_schema_only(tmp_path: Path, tiny_model: TinyModel) -> None:
    server = {"auth": "required", "public_docs": True}
    config = write_config(tmp_path, student=tiny_model.path, server=server)
    with run_registry(config) as registry, registry.client() as http:
        assert http.get("/openapi.json").json()["info"]["title"]
        assert http.post("/openapi.json").status_code == 401  # other methods: as before
        for path in ("/v1/teachers", "/v1/keys", "/ready", "/metrics"):
            assert http.get(path).status_code == 401, path
