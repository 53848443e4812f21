"""Scrubbing secret values out of text and log records.

The registry knows the *names* of its secret variables (from kiln.toml); the
values are looked up at the moment text is scrubbed, so a rotated secret is
redacted too and no value is ever kept in an object.  ``redact_text`` is for
strings (teacher error bodies, messages); ``SecretRedactionFilter`` is a
``logging.Filter`` for records; ``install_redaction`` attaches one filter to
the root and uvicorn loggers and their handlers.  ``redact_tokens`` replaces
anything shaped like a registry API token (``kiln_`` + URL-safe characters;
``auth.tokens`` mints them) with ``kiln_[redacted]``; ``well_formed`` says whether
text has a minted token's exact shape.

Imports: standard library only.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

REDACTED = "[redacted]"
DEFAULT_LOGGERS: tuple[str, ...] = ("", "uvicorn", "uvicorn.error", "uvicorn.access")

_FORMATTER = logging.Formatter()


# Every registry API token starts with this (``auth.tokens.generate_token``).
TOKEN_PREFIX: Final = "kiln_"
# Anything that looks like a token, for log redaction (see ``redact_tokens``).
TOKEN_PATTERN: Final = re.compile(r"kiln_[A-Za-z0-9_-]{20,}")
# The exact shape of a minted token (the client checks it before sending one).
MAX_TOKEN_CHARS: Final = 256
_TOKEN: Final = re.compile(r"^kiln_[A-Za-z0-9_-]{43,251}$")
_URL_SAFE: Final = re.compile(r"[A-Za-z0-9_-]")


def well_formed(token: str) -> bool:
    """True for text shaped like a token (prefix, alphabet, length); says nothing of validity."""
    return len(token) <= MAX_TOKEN_CHARS and _TOKEN.fullmatch(token) is not None


def token_problem(token: str) -> str | None:
    """What makes ``token`` malformed (prefix, length, alphabet), never quoting it; None if fine."""
    if token[:1] in ("'", '"') or token.lower().startswith("bearer"):
        return "it carries quotes or a 'Bearer' word: give the token alone"
    if not token.startswith(TOKEN_PREFIX):
        return f"it does not start with {TOKEN_PREFIX!r}"
    body = token[len(TOKEN_PREFIX) :]
    bad = next((i for i, ch in enumerate(body) if not _URL_SAFE.fullmatch(ch)), None)
    if bad is not None:
        return (
            f"character {bad + len(TOKEN_PREFIX) + 1} is not URL-safe base64 (A-Z a-z 0-9 - _):"
            " was it cut, wrapped or pasted with white space?"
        )
    if not 43 <= len(body) <= MAX_TOKEN_CHARS - len(TOKEN_PREFIX):
        return (
            f"it is {len(token)} characters long; a token is {TOKEN_PREFIX!r} plus 43 to"
            f" {MAX_TOKEN_CHARS - len(TOKEN_PREFIX)} characters (was it cut short?)"
        )
    return None if well_formed(token) else "it is not shaped like a kiln token"


def redact_tokens(text: str) -> str:
    """``text`` with anything shaped like a token replaced by ``kiln_[redacted]``."""
    if TOKEN_PREFIX not in text:
        return text
    return TOKEN_PATTERN.sub("kiln_[redacted]", text)


def _current_values(names: Iterable[str], environ: Mapping[str, str] | None) -> list[str]:
    """Set, non-blank values of ``names``, longest first (so overlaps redact fully)."""
    env = os.environ if environ is None else environ
    values = {env.get(name) for name in names}
    return sorted((v for v in values if v and v.strip()), key=len, reverse=True)


def _scrub(text: str, values: Sequence[str]) -> str:
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_text(text: str, names: Iterable[str], environ: Mapping[str, str] | None = None) -> str:
    """``text`` with the current value of every variable in ``names`` replaced."""
    return _scrub(text, _current_values(names, environ))


def _scrub_object(obj: object, values: Sequence[str]) -> object:
    """A string stays a string; any other object is replaced only if it leaks."""
    if isinstance(obj, str):
        return _scrub(obj, values)
    text = f"{obj!s}\n{obj!r}"
    if any(value in text for value in values):
        return _scrub(str(obj), values)
    return obj


def _scrub_args(args: object, values: Sequence[str]) -> object:
    # Arguments keep their shape because formatters such as uvicorn's access
    # formatter unpack ``record.args`` positionally.
    if isinstance(args, tuple):
        return tuple(_scrub_object(arg, values) for arg in args)
    if isinstance(args, Mapping):
        return {key: _scrub_object(arg, values) for key, arg in args.items()}
    return args


class SecretRedactionFilter(logging.Filter):
    """Replace current secret values in a record's message, args and traceback."""

    def __init__(self, names: Iterable[str], environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._names = frozenset(names)
        self._environ = environ

    @property
    def names(self) -> frozenset[str]:
        return self._names

    def filter(self, record: logging.LogRecord) -> bool:
        values = _current_values(self._names, self._environ)
        if not values:
            return True
        record.msg = _scrub_object(record.msg, values)
        record.args = _scrub_args(record.args, values)  # type: ignore[assignment]
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _scrub(record.exc_text, values)
            # The exception object itself may hold the value; formatters use
            # exc_text when it is set, so the live exception is dropped.
            record.exc_info = None
        if record.stack_info:
            record.stack_info = _scrub(record.stack_info, values)
        self._collapse_if_leaking(record, values)
        return True

    @staticmethod
    def _collapse_if_leaking(record: logging.LogRecord, values: Sequence[str]) -> None:
        """Last guard: a value assembled across arguments still gets redacted."""
        try:
            message = record.getMessage()
        except Exception:  # a malformed record; logging reports it later
            return
        if any(value in message for value in values):
            record.msg = _scrub(message, values)
            record.args = None


def install_redaction(
    names: Iterable[str],
    *,
    environ: Mapping[str, str] | None = None,
    logger_names: Iterable[str] = DEFAULT_LOGGERS,
) -> SecretRedactionFilter:
    """Attach one redaction filter to the named loggers and their current handlers.

    Handler filters also see records propagated from child loggers.  Call it
    after logging (including uvicorn's log config) is configured, because
    reconfiguring replaces handlers.  Calling it again replaces the filter.
    """
    redaction = SecretRedactionFilter(names, environ)
    for name in logger_names:
        logger = logging.getLogger(name)
        for target in (logger, *logger.handlers):
            for old in [f for f in target.filters if isinstance(f, SecretRedactionFilter)]:
                target.removeFilter(old)
            target.addFilter(redaction)
    return redaction
