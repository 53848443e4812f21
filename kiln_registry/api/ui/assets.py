"""The fixed table of files the browser pages load, and the headers they are served with.

Names map to files in this package's ``static/`` directory or in the
``fastapi-offline`` package's (Swagger UI's bundle and style sheet); any other
name is unknown (no path from the request ever reaches the file system).  The
files are read once, on first use, never at import time.  Imports the standard
library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kiln_registry.domain.errors import KilnError
from kiln_registry.domain.text import quoted

STATIC: Final = Path(__file__).resolve().parent / "static"
SWAGGER_PACKAGE: Final = "fastapi_offline"
# name -> (where: "own" | "swagger", media type)
ASSETS: Final[dict[str, tuple[str, str]]] = {
    "docs.html": ("own", "text/html; charset=utf-8"),
    "docs.js": ("own", "text/javascript; charset=utf-8"),
    "docs.css": ("own", "text/css; charset=utf-8"),
    "ui.html": ("own", "text/html; charset=utf-8"),
    "ui.js": ("own", "text/javascript; charset=utf-8"),
    "ui.css": ("own", "text/css; charset=utf-8"),
    "swagger-ui-bundle.js": ("swagger", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger", "text/css; charset=utf-8"),
    "favicon.png": ("swagger", "image/png"),
}
PAGES: Final = frozenset({"docs.html", "ui.html"})
# Scripts and styles from this origin only: no inline script or style, no eval,
# no CDN, no frames (tests/browser load both pages and find no violation).
CSP: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS: Final = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str


def swagger_dir() -> Path:
    """Swagger UI's files as the ``fastapi-offline`` package ships them."""
    spec = importlib.util.find_spec(SWAGGER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise KilnError(
            "the API docs page needs the fastapi-offline package (Swagger UI's files)",
            code="docs_assets_missing",
            hint="install it with `pip install fastapi-offline` (a dependency of kiln-registry)",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "static"


@functools.cache
def asset(name: str) -> Asset:
    """The file ``name`` of the table; ``404 not_found`` for any other name."""
    entry = ASSETS.get(name)
    if entry is None:
        raise KilnError(
            f"no page asset named {quoted(name, 64)}",
            code="not_found",
            status=404,
            hint="the pages are /docs and /ui",
        )
    where, media_type = entry
    directory = STATIC if where == "own" else swagger_dir()
    return Asset(body=(directory / name).read_bytes(), media_type=media_type)
