"""Redaction of secret values from text and from real logging records."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from uvicorn.logging import AccessFormatter

from kiln_registry.credentials import (
    REDACTED,
    SecretRedactionFilter,
    install_redaction,
    redact_text,
)

VAR = "KILN_TEST_REDACT_KEY"
OTHER = "KILN_TEST_REDACT_OTHER"
SECRET = "sk-live-redact-me-0123"
LOGGER = "kiln_test_redaction"


class Captured:
    def __init__(self, logger: logging.Logger, stream: io.StringIO) -> None:
        self.logger = logger
        self.stream = stream

    def text(self) -> str:
        return self.stream.getvalue()


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Captured]:
    monkeypatch.setenv(VAR, SECRET)
    monkeypatch.delenv(OTHER, raising=False)
    logger = logging.getLogger(LOGGER)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    install_redaction([VAR, OTHER], logger_names=[LOGGER])
    yield Captured(logger, stream)
    logger.removeHandler(handler)
    for old in list(logger.filters):
        logger.removeFilter(old)
    logger.propagate = True


class Leaky:
    def __str__(self) -> str:
        return f"Leaky({SECRET})"


def test_message_args_and_mapping_args_are_redacted(captured: Captured) -> None:
    captured.logger.info("sending %s", SECRET)
    captured.logger.info(f"inline {SECRET}")
    captured.logger.info("mapping %(key)s", {"key": SECRET})
    captured.logger.info("object %s", Leaky())
    captured.logger.info("split %s%s", SECRET[:8], SECRET[8:])
    text = captured.text()
    assert SECRET not in text
    assert text.count(REDACTED) == 5


def test_tracebacks_are_redacted(captured: Captured) -> None:
    try:
        raise RuntimeError(f"teacher said 401 for {SECRET}")
    except RuntimeError:
        captured.logger.exception("probe failed")
    text = captured.text()
    assert "Traceback" in text
    assert "RuntimeError: teacher said 401 for [redacted]" in text
    assert SECRET not in text


def test_child_logger_records_are_redacted_by_the_handler_filter(captured: Captured) -> None:
    logging.getLogger(f"{LOGGER}.child").warning("child saw %s", SECRET)
    assert SECRET not in captured.text()
    assert "child saw [redacted]" in captured.text()


def test_values_are_read_at_filter_time(
    captured: Captured, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VAR, "sk-rotated-value")
    captured.logger.info("old %s new %s", SECRET, "sk-rotated-value")
    assert "sk-rotated-value" not in captured.text()
    assert SECRET in captured.text()  # the old value is no longer a secret
    monkeypatch.setenv(OTHER, "sk-other-value")
    captured.logger.info("other sk-other-value")
    assert "sk-other-value" not in captured.text()


def test_messages_without_secrets_are_untouched(captured: Captured) -> None:
    captured.logger.info("%d teachers, %s", 3, "fine")
    assert captured.text() == "INFO 3 teachers, fine\n"


def test_uvicorn_access_records_keep_their_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, SECRET)
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/v1/teachers?token={SECRET}", "1.1", 200),
        None,
    )
    assert SecretRedactionFilter([VAR]).filter(record)
    line = AccessFormatter("%(client_addr)s %(request_line)s %(status_code)s").format(record)
    assert SECRET not in line
    assert "GET /v1/teachers?token=[redacted] HTTP/1.1" in line


def test_install_replaces_an_earlier_filter(captured: Captured) -> None:
    logger = logging.getLogger(LOGGER)
    install_redaction([VAR], logger_names=[LOGGER])
    install_redaction([VAR], logger_names=[LOGGER])
    for target in (logger, *logger.handlers):
        assert sum(isinstance(f, SecretRedactionFilter) for f in target.filters) == 1


def test_redact_text_longest_value_first_and_blank_values_ignored() -> None:
    environ = {VAR: "abc", OTHER: "abcdef", "KILN_TEST_BLANK": "  "}
    names = [VAR, OTHER, "KILN_TEST_BLANK", "KILN_TEST_UNSET"]
    assert redact_text("x abcdef y abc z  ", names, environ) == (f"x {REDACTED} y {REDACTED} z  ")


def test_redact_text_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, SECRET)
    assert redact_text(f"body: {SECRET}", [VAR]) == f"body: {REDACTED}"
