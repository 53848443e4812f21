"""The OpenAPI document: FastAPI's, corrected to say exactly what the server does.

FastAPI adds a ``422`` response (and its ``HTTPValidationError`` schema) to
every operation with parameters or a body; this server answers a request that
fails validation with ``400`` and the error envelope instead (``api.errors``),
which each operation's own error list already names.  FastAPI also files an
error response under the route's media type (``text/plain`` for
``/metrics``); the envelope is always ``application/json``.  And FastAPI's
OpenAPI model stores ``minimum``/``maximum`` as floats; integer bounds are
written back as integers (the signed 64-bit extremes, which a float cannot
hold, are restored exactly).  Every request and response body gets an
example (``api.examples``; an error response one per error code), and the
NDJSON corpus of ``GET /v1/jobs/{id}/result`` is described as a binary body
whose lines are the component schemas of ``wire.corpus``, named in
``x-ndjson-line-schema``.  Every operation names what it needs: the bearer
scheme ``bearerAuth`` with the token scope in ``x-kiln-scope`` (the rule of
``auth.scopes``, as served with the default ``metrics_public = false``), or an
empty ``security`` list for the open routes; and each can answer ``431``
(``serve.guard``'s bound on the request head, plain text).  ``install_openapi``
replaces ``app.openapi`` with a generator that drops those entries and caches
the result as FastAPI does.  Imports FastAPI, pydantic, ``api.examples``,
``wire.corpus`` and ``auth.scopes``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from kiln_registry.api.examples import (
    METRICS_EXAMPLE,
    body_examples,
    error_example,
    ndjson_example,
)
from kiln_registry.auth.scopes import required_scope
from kiln_registry.version import package_version
from kiln_registry.wire.corpus import LINE_MODELS, LINE_MODELS_DESCRIPTION, NDJSON

UNUSED_SCHEMAS = ("HTTPValidationError", "ValidationError")


I64_AS_FLOAT = float(2**63)
MAX_DEPTH = 64


def _integer_bounds(node: Any, depth: int = 0) -> None:
    """Turn float ``minimum``/``maximum`` of integer schemas back into integers, in place."""
    if depth > MAX_DEPTH:
        return
    if isinstance(node, list):
        for item in node:
            _integer_bounds(item, depth + 1)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        for key, extreme in (("minimum", -(2**63)), ("maximum", 2**63 - 1)):
            value = node.get(key)
            if isinstance(value, float) and value.is_integer():
                node[key] = extreme if abs(value) == I64_AS_FLOAT else int(value)
    for item in node.values():
        _integer_bounds(item, depth + 1)


def corrected(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without FastAPI's 422 responses and their component schemas."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                responses = operation.get("responses", {})
                responses.pop("422", None)
                for response in responses.values():
                    _envelope_is_json(response)
    components = schema.get("components", {}).get("schemas", {})
    for name in UNUSED_SCHEMAS:
        components.pop(name, None)
    _add_line_schemas(components)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                _describe(operation)
                _add_examples(operation)
    _add_security(schema)
    _add_head_bound(schema)
    _integer_bounds(schema)
    return schema


BEARER = "bearerAuth"
BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": (
        "A kiln-registry token (`kiln tokens create`), sent as `Authorization: Bearer <token>`;"
        " the operation's `x-kiln-scope` names the scope it needs (`admin` covers all)."
    ),
}


HEAD_TOO_LARGE = {
    "description": (
        "The request head (target and header lines) is over `kiln serve`'s bound: a plain-text"
        " answer, then the connection is closed (`serve_guard`; no error envelope, since the"
        " request was never parsed)."
    ),
    "content": {
        "text/plain": {
            "schema": {"type": "string"},
            "example": "Request header fields too large",
        }
    },
}


def _add_head_bound(schema: dict[str, Any]) -> None:
    """Every operation can answer 431 (the head bound applies before routing)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.setdefault("responses", {})["431"] = HEAD_TOO_LARGE


def _add_security(schema: dict[str, Any]) -> None:
    """Declare the bearer scheme and each operation's need for it (and its scope)."""
    schema.setdefault("components", {}).setdefault("securitySchemes", {})[BEARER] = BEARER_SCHEME
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict):
                continue
            scope = required_scope(method.upper(), path)
            if scope is None:
                operation["security"] = []
            else:
                operation["security"] = [{BEARER: []}]
                operation["x-kiln-scope"] = scope


REF = "#/components/schemas/"
# Query and path parameters the routes declare without a description (shared meanings).
PARAMETER_DESCRIPTIONS = {
    "limit": "Page size: at most this many items (1..=1000).",
    "cursor": "`next_cursor` of the previous page, unchanged; omit for the first page.",
    "status": "Only jobs with this status.",
    "before": "Only events older than this event id.",
    "alias": "The teacher alias, percent-encoded as one path segment (`/` as `%2F`).",
}


def _add_line_schemas(components: dict[str, Any]) -> None:
    """The NDJSON line models (and what they reference) as component schemas."""
    for model in LINE_MODELS:
        doc = model.model_json_schema(by_alias=True, ref_template=REF + "{model}")
        for name, sub in doc.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components.setdefault(model.__name__, doc)


def _ref_name(media: dict[str, Any]) -> str | None:
    ref = media.get("schema", {}).get("$ref", "")
    return ref.removeprefix(REF) if ref.startswith(REF) else None


# Operations whose handlers carry no docstring.
OPERATION_DESCRIPTIONS = {
    "health": "Liveness: `ok` while the process serves (no token needed).",
    "ready": "Readiness: the database revision, the number of aliases, the last legacy import.",
    "metrics": "Prometheus metrics in the text exposition format.",
    "getJob": "One job: status, progress, timestamps of each phase, error or result.",
}


def _describe(operation: dict[str, Any]) -> None:
    if not operation.get("description") and operation.get("operationId") in OPERATION_DESCRIPTIONS:
        operation["description"] = OPERATION_DESCRIPTIONS[operation["operationId"]]
    for parameter in operation.get("parameters", []):
        if not parameter.get("description") and parameter.get("name") in PARAMETER_DESCRIPTIONS:
            parameter["description"] = PARAMETER_DESCRIPTIONS[parameter["name"]]


def _add_examples(operation: dict[str, Any]) -> None:
    examples = body_examples()
    for media in operation.get("requestBody", {}).get("content", {}).values():
        mapping = media.get("schema", {}).get("discriminator", {}).get("mapping", {})
        if mapping:  # one example per kind
            media["examples"] = {
                kind: {"summary": kind, "value": examples[ref.removeprefix(REF)]}
                for kind, ref in mapping.items()
            }
        elif (name := _ref_name(media)) in examples:  # named: callers may add their own
            media["examples"] = {name: {"summary": name, "value": examples[name]}}
    for response in operation.get("responses", {}).values():
        codes = response.get("x-kiln-error-codes")
        for media_type, media in response.get("content", {}).items():
            if codes:
                media["examples"] = {code: {"value": error_example(code)} for code in codes}
            elif media_type == NDJSON:
                _describe_ndjson(media)
            elif media_type == "text/plain":
                media["example"] = METRICS_EXAMPLE
            elif (name := _ref_name(media)) in examples:
                media["example"] = examples[name]


def _describe_ndjson(media: dict[str, Any]) -> None:
    lines: list[type[BaseModel]] = list(LINE_MODELS)
    media["schema"] = {"type": "string", "format": "binary", "description": LINE_MODELS_DESCRIPTION}
    media["x-ndjson-line-schema"] = {"anyOf": [{"$ref": REF + m.__name__} for m in lines]}
    media["example"] = ndjson_example()


def _envelope_is_json(response: dict[str, Any]) -> None:
    if "x-kiln-error-codes" not in response:
        return
    content = response.get("content", {})
    if "application/json" not in content and len(content) == 1:
        response["content"] = {"application/json": next(iter(content.values()))}


def install_openapi(app: FastAPI) -> None:
    app.version = package_version()  # info.version is the package's version

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = corrected(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    openapi_version=app.openapi_version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
