"""``kiln serve``'s logging: JSON lines (or text), request ids, access fields, redaction.

``JsonFormatter`` writes one JSON object per record: ``time`` (UTC, ISO 8601
with milliseconds), ``level``, ``logger``, ``message``, the ``request_id`` of
the request being served (when there is one) and, for an access record
(``observability.access``), its fields (``method``, ``route``, ``path``,
``status``, ``duration_ms``, ``client``, ``token`` — the token's name) as
top-level keys.  ``TextFormatter`` writes the same content as one line of
``key=value`` pairs after the message.

Both formatters scrub the finished line once more: token-shaped text and the
current value of every configured secret variable are replaced, so even a
value that reached the line outside the record's message and arguments (a
request id a caller chose, for instance) is never written.

``configure_logging`` installs one stderr handler on the root logger with
the chosen formatter, the repeat cap (``observability.repeats.RepeatFilter``; access
records are exempt) and the redaction filters; uvicorn's loggers propagate
to it and uvicorn's own access log is turned off by ``run_server``
(``access_log=False``): the access layer writes the access log instead.
httpx's one INFO line per outbound request (``HTTP Request: POST ... "HTTP/1.1
400 Bad Request"``: every probe, the cap probe's expected 400 included, and
every scoring request) is demoted to DEBUG (``DemoteToDebug``): the probe
receipts and the job counters already record them.
Imports the standard library, orjson, ``credentials.redaction`` and ``auth.tokens``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Final

import orjson

from kiln_registry.credentials.redaction import install_redaction, redact_text, redact_tokens
from kiln_registry.observability.access import FIELDS_ATTR
from kiln_registry.observability.request_id import current_request_id

LOG_LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
UVICORN_LOGGERS: Final = ("uvicorn", "uvicorn.error", "uvicorn.access")
DEMOTED_LOGGERS: Final = ("httpx",)  # per-request chatter of the outbound client


class DemoteToDebug(logging.Filter):
    """A logger filter: its INFO records become DEBUG ones, dropped unless DEBUG is enabled."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class _Seconds:
    """The formatted UTC second last used (formatting it is most of a timestamp's cost)."""

    last: tuple[int, str] = (-1, "")


def utc_millis(created: float) -> str:
    """``2026-12-01T16:40:00.123Z`` for a record's ``created`` time."""
    seconds = int(created)
    last = _Seconds.last
    if last[0] != seconds:
        last = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
        _Seconds.last = last
    return f"{last[1]}.{int((created - seconds) * 1000):03d}Z"


def access_fields(record: logging.LogRecord) -> Mapping[str, object] | None:
    """The fields of an access record (``observability.access``), else None."""
    fields = record.__dict__.get(FIELDS_ATTR)
    return fields if isinstance(fields, dict) else None


class _Scrubbing(logging.Formatter):
    """Scrubs tokens and current secret values from every finished line."""

    def __init__(self, secret_env_names: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self._secret_names = secret_env_names

    def _scrub(self, line: str) -> str:
        return redact_tokens(redact_text(line, self._secret_names))

    def _exception(self, record: logging.LogRecord) -> str | None:
        if record.exc_text:
            return record.exc_text
        if record.exc_info:
            return self.formatException(record.exc_info)
        return None


class JsonFormatter(_Scrubbing):
    """One JSON object per log line (``[server] log_format = "json"``)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": utc_millis(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = access_fields(record)
        if fields is not None:
            doc.update(fields)
        else:
            request_id = current_request_id.get()
            if request_id is not None:
                doc["request_id"] = request_id
        exception = self._exception(record)
        if exception is not None:
            doc["exception"] = exception
        return self._scrub(orjson.dumps(doc, default=str).decode("utf-8"))


class TextFormatter(_Scrubbing):
    """``time LEVEL logger: message key=value ...`` (``log_format = "text"``)."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{utc_millis(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        )
        fields = access_fields(record)
        if fields is None:
            request_id = current_request_id.get()
            fields = {} if request_id is None else {"request_id": request_id}
        pairs = " ".join(
            f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in fields.items()
        )
        if pairs:
            line = f"{line} {pairs}"
        exception = self._exception(record)
        if exception is not None:
            line = f"{line}\n{exception}"
        return self._scrub(line)


def configure_logging(log_format: str, secret_env_names: frozenset[str], level: str) -> None:
    """One stderr handler on the root logger, uvicorn's loggers propagating, redaction on."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter
    if log_format == "json":
        formatter = JsonFormatter(secret_env_names)
    else:
        formatter = TextFormatter(secret_env_names)
    handler.setFormatter(formatter)
    from kiln_registry.observability.repeats import RepeatFilter

    handler.addFilter(RepeatFilter())  # a flood of one line (e.g. accept errors) is capped
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LOG_LEVELS[level])
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    for name in DEMOTED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DemoteToDebug) for f in logger.filters):
            logger.addFilter(DemoteToDebug())
    install_redaction(secret_env_names)
