"""Routes of the browser pages: ``/docs`` (Swagger UI), ``/ui`` (dashboard), ``/assets/{name}``.

``/`` redirects to ``/ui``, as Kiln's server does (``crates/kiln-server/src/api/ui.rs``).
All of them are open (``auth.scopes`` lists them): they serve fixed files and no
data.  The data comes from the JSON API, which the pages call with the
operator's bearer token.  None of them is part of the OpenAPI document.
Imports FastAPI and ``api.ui.assets``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from kiln_registry.api.ui.assets import PAGES, SECURITY_HEADERS, asset

router = APIRouter(include_in_schema=False)
AssetName = Annotated[str, Path(max_length=64, pattern=r"^[a-z0-9][a-z0-9.-]*$")]


async def _serve(name: str) -> Response:
    found = await run_in_threadpool(asset, name)
    headers = dict(SECURITY_HEADERS)
    # Pages are re-read on every visit; assets may be cached for a short while.
    headers["cache-control"] = "no-store" if name in PAGES else "max-age=300"
    return Response(found.body, media_type=found.media_type, headers=headers)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307, headers=SECURITY_HEADERS)


@router.get("/docs")
async def docs_page() -> Response:
    """Swagger UI over ``/openapi.json`` ("Authorize" sends the bearer token)."""
    return await _serve("docs.html")


@router.get("/ui")
async def dashboard_page() -> Response:
    """The operator dashboard: teachers, one teacher's receipts, jobs; refreshed live."""
    return await _serve("ui.html")


@router.get("/assets/{name}")
async def page_asset(name: AssetName) -> Response:
    return await _serve(name)
