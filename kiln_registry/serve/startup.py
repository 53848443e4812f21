"""Start-up of ``kiln serve``: configuration, logging, student, database, uvicorn.

The order is the fail-closed order: the configuration (with any ``--host`` /
``--port`` override, re-validated as a whole so a port collision is caught)
and every secret variable are checked before anything is opened; then access
control (``auth.serving``: ``auth = "off"`` on a non-loopback host is refused
unless ``--insecure-no-auth``, and TLS files are loaded once so a bad one
stops the start); logging is configured with secret and token redaction; the
student is loaded with the ``tokenizers`` library (no torch); the database is
upgraded to head in one transaction (a newer revision is refused); local aliases are marked
unavailable (``teachers.local_relaunch.reconcile_at_startup``); only then does the
server bind its port.  On exit (uvicorn handles SIGINT/SIGTERM) the context
closes, which drains every local teacher's process group and removes its
snapshot and cache.

Imports the configuration, credential redaction, database, model and probe
layers and (inside ``run_server``) uvicorn and the API app; nothing happens
at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from kiln_registry.api.context import RegistryContext
from kiln_registry.auth.serving import (
    check_access,
    install_token_redaction,
    uvicorn_tls_options,
    warn_without_auth,
)
from kiln_registry.config.loader import check_startup_environment, load_config
from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.engine import database_label, session_factory
from kiln_registry.db.opening import ensure_schema, open_database
from kiln_registry.domain.errors import ConfigError
from kiln_registry.domain.text import ErrorItem, error_location, error_message, render_errors
from kiln_registry.legacy.registry import import_configured_legacy_registry
from kiln_registry.local.launch_spec import Prepare
from kiln_registry.local.process_groups import manager_from_config
from kiln_registry.model.tokenizer import student_shape
from kiln_registry.observability.logs import LOG_LEVELS, configure_logging
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers.local_relaunch import reconcile_at_startup

log = logging.getLogger("kiln_registry.serve.startup")
# uvicorn.run's exit status when the server never started (a bind failure, a bad app).
STARTUP_FAILURE = 3

MAX_OVERRIDE_ERRORS = 10


def build_context(
    config: KilnConfig, *, local_prepare: Prepare | None = None, upgrade: bool = False
) -> RegistryContext:
    """Load the student, open the database, mark local aliases unavailable.

    A new database is created at head; one behind head is upgraded only
    with ``upgrade`` (``kiln serve --upgrade``), otherwise refused
    (``db.opening.ensure_schema``).

    The context owns the local-teacher manager (``local_prepare`` replaces the
    launcher library, for tests); ``ctx.close()`` drains it.  Nothing is bound yet.
    """
    vocab_sha256, width, tokenizer_size = student_shape(config.student.model_path)
    engine = open_database(config.server)
    try:
        revision = ensure_schema(engine, upgrade=upgrade)
        import_configured_legacy_registry(config, session_factory(engine))
    except BaseException:
        engine.dispose()
        raise
    ctx = RegistryContext(
        config=config,
        engine=engine,
        sessions=session_factory(engine),
        student=StudentView(
            tokenizer_vocab_sha256=vocab_sha256, model_width=width, tokenizer_size=tokenizer_size
        ),
        database_revision=revision,
        local_teachers=manager_from_config(config, os.environ, local_prepare),
    )
    try:
        for alias in reconcile_at_startup(ctx):
            log.info("local teacher %s is unavailable until relaunched", alias)
    except BaseException:
        ctx.close()
        raise
    return ctx


def _override_line(error: ErrorItem) -> str:
    return f"{error_location(error['loc'], empty='(top level)')}: {error_message(error)}"


def _override_error(config_path: Path, exc: ValidationError) -> ConfigError:
    errors = exc.errors(include_url=False, include_input=False)
    parts = render_errors(errors, MAX_OVERRIDE_ERRORS, _override_line)
    return ConfigError(
        f"{config_path} with --host/--port: " + "; ".join(parts),
        rule="config.override",
        hint="pick another --host/--port, or change kiln.toml",
    )


def with_overrides(
    config: KilnConfig, config_path: Path, *, host: str | None, port: int | None
) -> KilnConfig:
    """``config`` with ``[server] host``/``port`` replaced, validated again as a whole."""
    updates: dict[str, Any] = {}
    if host is not None:
        updates["host"] = host
    if port is not None:
        updates["port"] = port
    if not updates:
        return config
    data = config.model_dump()
    data["server"] = {**data["server"], **updates}
    try:
        return KilnConfig.model_validate(data)
    except ValidationError as exc:
        raise _override_error(config_path, exc) from None


def prepare(config_path: Path, *, host: str | None, port: int | None) -> KilnConfig:
    """The validated configuration, or a ``ConfigError``; checks every secret variable."""
    config = with_overrides(load_config(config_path), config_path, host=host, port=port)
    check_startup_environment(config, os.environ)
    return config


def run_server(
    config_path: Path,
    *,
    host: str | None = None,
    port: int | None = None,
    local_prepare: Prepare | None = None,
    insecure_no_auth: bool = False,
    upgrade: bool = False,
) -> None:
    """``kiln serve``: blocks until SIGINT/SIGTERM, then drains the local teachers."""
    from kiln_registry.api.app import create_app
    from kiln_registry.serve.guard import uvicorn_limits

    config = prepare(config_path, host=host, port=port)
    server = config.server
    check_access(server, insecure_no_auth=insecure_no_auth)
    tls_options = uvicorn_tls_options(server)
    configure_logging(server.log_format, config.secret_env_names(), server.log_level)
    install_token_redaction()
    ctx = build_context(config, local_prepare=local_prepare, upgrade=upgrade)
    warn_without_auth(server)
    log.info(
        "kiln-registry serving on %s:%d (database %s at revision %s, student width %d)",
        server.host,
        server.port,
        database_label(ctx.engine),
        ctx.database_revision,
        ctx.student.model_width,
    )
    with ExitSignals() as signals:
        try:
            _run_uvicorn(
                signals,
                create_app(ctx),
                host=server.host,
                port=server.port,
                log_config=None,
                log_level=LOG_LEVELS[server.log_level],
                server_header=False,
                access_log=False,  # observability.access writes the access log (with fields)
                timeout_graceful_shutdown=10,
                **uvicorn_limits(server),  # header deadline, per-client cap, keep-alive, sizes
                **tls_options,
            )
        except ExitSignal:
            pass
        finally:
            signals.record_only()
            ctx.close()
    signals.resend()


def _run_uvicorn(signals: ExitSignals, app: Any, **options: Any) -> None:
    """``uvicorn.run`` for one app, with every exit signal also recorded in ``signals``.

    uvicorn re-raises the signal it shut down on once it has restored the
    previous handlers, and ``ExitSignals`` normally sees it then; recording it
    in ``handle_exit`` as well means a re-raise that never reaches that
    handler (seen once under load: the process then exited 0 after a SIGINT)
    still ends in the conventional exit status.  Like ``uvicorn.run``, a
    ``KeyboardInterrupt`` ends serving quietly and a failed start exits 3.
    """
    import uvicorn

    class RecordingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            signals.received.append(sig)
            super().handle_exit(sig, frame)

    runner = RecordingServer(uvicorn.Config(app, **options))
    with contextlib.suppress(KeyboardInterrupt):
        runner.run()
    if not runner.started and not signals.received:
        sys.exit(STARTUP_FAILURE)


class ExitSignal(BaseException):
    """SIGINT/SIGTERM arrived outside uvicorn's own handling (see ``ExitSignals``)."""


class ExitSignals:
    """Make SIGINT/SIGTERM unwind ``run_server`` through ``ctx.close()``, then die of them.

    uvicorn handles both signals while it serves, then restores the previous
    handlers and raises the signal again; with the default handlers a SIGTERM
    would kill the process before the local teachers are drained.  While
    installed (main thread only), the first signal raises ``ExitSignal``;
    during the drain (``record_only``) signals are only recorded; ``resend``
    restores the old handlers and raises the first signal, so the exit status
    stays the conventional one.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._raise = True
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> ExitSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._raise:
            self._raise = False
            raise ExitSignal(signum)

    def record_only(self) -> None:
        self._raise = False

    def resend(self) -> None:
        """Die of the first signal received, whatever handler a library left installed.

        The drain is over, so the signal's default action (terminate) is
        installed first: the exit status is then -SIGINT/-SIGTERM even when
        the handler restored by ``__exit__`` would not end the process.
        """
        if not self.received:
            return
        sig = self.received[0]
        logging.shutdown()  # flush every log handler before the process ends
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)
