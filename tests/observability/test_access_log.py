"""Request ids and the structured access log, in process and from ``kiln serve``.

In process: a real registry with ``auth = "required"`` on loopback; the
``kiln_registry.access`` records go through ``JsonFormatter`` (the one
``kiln serve`` uses) into a buffer.  A well-formed ``X-Request-ID`` is kept
and returned; a malformed, oversized, token-shaped or repeated one is
replaced by a generated id.  Each access line is a JSON object whose fields
are the request's (route template, status, duration, client, token *name*),
never the token.  The subprocess test checks ``kiln serve`` itself: every
stderr line is JSON with a millisecond UTC time, uvicorn's own access line
is gone, and a planted credential value appears nowhere.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kiln_registry.observability.access import ACCESS_LOGGER, FIELDS_ATTR
from kiln_registry.observability.logs import JsonFormatter, TextFormatter
from kiln_registry.observability.request_id import MAX_LENGTH
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import ServerProcess, run_registry, write_config
from tests.auth.support import bearer, create_token

MILLIS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
GENERATED = re.compile(r"^[0-9a-f]{12}-[0-9a-f]+$")
ACCESS_KEYS = {"time", "level", "logger", "message", "request_id", "method", "route", "path",
               "status", "duration_ms", "client", "token"}  # fmt: skip
PLANTED = "sk-obs-planted-Zq81xV0-never-log"


@contextmanager
def captured_access(formatter: logging.Formatter) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def _records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_request_ids_are_kept_when_well_formed_and_generated_otherwise(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    token = "kiln_" + "A" * 43
    cases = [
        ([("x-request-id", "trace-01.ab:cd_EF")], "trace-01.ab:cd_EF"),
        ([("x-request-id", "a" * MAX_LENGTH)], "a" * MAX_LENGTH),
        ([("x-request-id", "a" * (MAX_LENGTH + 1))], None),
        ([("x-request-id", "has space")], None),
        ([("x-request-id", "semi;colon")], None),
        ([("x-request-id", token)], None),  # a pasted token is never echoed or logged
        ([("x-request-id", "one"), ("x-request-id", "two")], None),
        ([], None),
    ]
    seen: set[str] = set()
    with run_registry(config) as server, server.client() as http:
        for headers, expected in cases:
            response = http.get("/health", headers=headers)
            assert response.status_code == 200
            rid = response.headers["x-request-id"]
            if expected is None:
                assert GENERATED.match(rid), rid
            else:
                assert rid == expected
            seen.add(rid)
    assert len(seen) == len(cases)


def test_access_records_are_fields_with_the_token_name_only(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "required"})
    token = create_token(tmp_path / "registry.db", "ops-reader", {"read"})
    with (
        captured_access(JsonFormatter()) as stream,
        run_registry(config) as server,
        server.client() as http,
    ):
        ok = http.get("/v1/teachers/some-alias", headers=bearer(token) | {"x-request-id": "r1"})
        refused = http.get("/v1/teachers", params={"token": token})
        plain = http.get("/health")
    assert (ok.status_code, refused.status_code, plain.status_code) == (404, 401, 200)
    records = _records(stream)
    assert [r["status"] for r in records] == [404, 401, 200]
    first, second, third = records
    assert set(first) == ACCESS_KEYS and first["message"] == "request"
    assert first["request_id"] == "r1" and MILLIS.match(str(first["time"]))
    assert (first["method"], first["route"], first["path"]) == (
        "GET", "/v1/teachers/{alias}", "/v1/teachers/some-alias",
    )  # fmt: skip
    assert first["token"] == "ops-reader" and first["client"] == "127.0.0.1"
    assert isinstance(first["duration_ms"], float) and first["duration_ms"] >= 0
    assert second["route"] == "/v1/teachers" and second["token"] is None
    assert second["request_id"] == refused.headers["x-request-id"]
    assert third["route"] == "/health"
    assert token not in stream.getvalue() and token[5:25] not in stream.getvalue()


def test_text_format_carries_the_same_fields() -> None:
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "request", None, None)
    record.__dict__[FIELDS_ATTR] = {"route": "/health", "status": 200}
    line = TextFormatter().format(record)
    assert line.endswith(' INFO kiln_registry.access: request route="/health" status=200')
    assert MILLIS.match(line.split()[0])


@pytest.mark.secret_env("KILN_OBS_PLANTED")
@pytest.mark.slow
def test_kiln_serve_writes_json_lines_without_uvicorn_access_lines(
    tmp_path: Path, tiny_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_OBS_PLANTED", PLANTED)
    config = write_config(
        tmp_path, student=tiny_model.path, server={"log_format": "json"},
        credentials={"planted": ("https://teacher.invalid", "KILN_OBS_PLANTED")},
    )  # fmt: skip
    with ServerProcess(config, tmp_path / "serve.log") as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as http:
            # A caller may choose a secret's value as its request id: answered, never logged.
            echoed = http.get("/v1/teachers", headers={"x-request-id": PLANTED})
            http.get(f"/v1/teachers/{PLANTED}")
        server.stop()
    text = server.output()
    lines = [json.loads(line) for line in text.splitlines()]
    assert all(MILLIS.match(str(line["time"])) for line in lines)
    access = [line for line in lines if line["logger"] == ACCESS_LOGGER]
    routes = [(a["route"], a["status"]) for a in access]
    assert ("/v1/teachers", 200) in routes and ("/v1/teachers/{alias}", 404) in routes
    assert all(set(a) == ACCESS_KEYS for a in access)
    assert echoed.headers["x-request-id"] == PLANTED  # the caller's own value, to the caller
    assert "HTTP/1.1" not in text  # uvicorn's preformatted access line is off
    assert PLANTED not in text and "[redacted]" in text
