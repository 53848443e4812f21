"""What ``kiln serve`` checks and sets up for access control and TLS before it binds.

* ``check_access``: ``auth = "off"`` on a non-loopback host is refused unless
  ``--insecure-no-auth``; ``warn_without_auth`` then logs a warning at start
  and every hour (``WARN_INTERVAL_S``) from a daemon thread.
* ``uvicorn_tls_options``: loads ``tls_cert_file``/``tls_key_file`` (and
  ``tls_client_ca_file``) into a throwaway ``SSLContext`` first, so a bad file
  is a clear ``ConfigError`` before the port is bound; returns uvicorn's
  ``ssl_*`` arguments (``CERT_REQUIRED`` when a client CA is set: mutual TLS).
* ``install_token_redaction``: a filter on the root handlers that replaces
  anything shaped like a token (``kiln_`` + 20 or more URL-safe characters)
  in every log line, so even a token sent in a query string never reaches
  the log.
Imports the standard library, ``config.access``, ``auth.tokens`` and errors.
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path
from typing import Any, Final

from kiln_registry.auth.tokens import TOKEN_PREFIX, redact_tokens
from kiln_registry.config.access import AccessKeys, auth_required, is_loopback
from kiln_registry.domain.errors import ConfigError

log = logging.getLogger("kiln_registry.serve.startup")

WARN_INTERVAL_S: Final = 3600.0
WARNING: Final = (
    "authentication is OFF on %s (not loopback): anyone who can reach this port can register"
    ' and delete teachers and run jobs; set [server] auth = "required" and use tokens'
)


def check_access(server: AccessKeys, *, insecure_no_auth: bool) -> None:
    """Refuse ``auth = "off"`` on a host other than loopback unless explicitly accepted."""
    if auth_required(server) or is_loopback(server.host) or insecure_no_auth:
        return
    raise ConfigError(
        f'[server] auth = "off" on the non-loopback host {server.host!r} is refused',
        rule="server.auth_off",
        hint='use auth = "required" with tokens (`kiln tokens create`), bind to 127.0.0.1,'
        " or pass --insecure-no-auth to accept the risk",
    )


def warn_without_auth(server: AccessKeys, interval_s: float = WARN_INTERVAL_S) -> None:
    """Log the no-auth warning now and every ``interval_s`` (only off + non-loopback)."""
    if auth_required(server) or is_loopback(server.host):
        return
    log.warning(WARNING, server.host)
    host = server.host

    def repeat() -> None:
        while not threading.Event().wait(interval_s):
            log.warning(WARNING, host)

    threading.Thread(target=repeat, name="kiln-no-auth-warning", daemon=True).start()


def _tls_error(what: str, path: Path, exc: BaseException) -> ConfigError:
    reason = type(exc).__name__
    if isinstance(exc, ssl.SSLError) and exc.reason:
        reason = str(exc.reason)
    elif isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    return ConfigError(
        f"[server] {what} {path} could not be loaded ({reason})",
        rule="server.tls",
        hint="give PEM files: the certificate chain, its unencrypted private key,"
        " and for mutual TLS the CA that signs client certificates",
    )


def uvicorn_tls_options(server: AccessKeys) -> dict[str, Any]:
    """uvicorn's ``ssl_*`` keyword arguments, after loading every file once."""
    cert, key, client_ca = server.tls_cert_file, server.tls_key_file, server.tls_client_ca_file
    if cert is None or key is None:
        return {}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (OSError, ssl.SSLError) as exc:
        raise _tls_error("tls_cert_file/tls_key_file", cert, exc) from None
    options: dict[str, Any] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise _tls_error("tls_client_ca_file", client_ca, exc) from None
        options["ssl_ca_certs"] = str(client_ca)
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


class TokenRedactionFilter(logging.Filter):
    """Replaces token-shaped text in a record's message (formatted once, here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if TOKEN_PREFIX in message:
            record.msg = redact_tokens(message)
            record.args = None
        return True


def install_token_redaction() -> None:
    """Attach ``TokenRedactionFilter`` to the root logger's handlers (after logging setup)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, TokenRedactionFilter) for f in handler.filters):
            handler.addFilter(TokenRedactionFilter())
