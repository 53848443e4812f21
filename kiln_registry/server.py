"""Start-up of ``kiln serve``: configuration, logging, student, database, uvicorn.

The order is the fail-closed order: the configuration and every secret
variable are checked before anything is opened; the student is loaded with
the ``tokenizers`` library (no torch); the database is upgraded to head in
one transaction; only then does the server bind its port.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from kiln_registry.api.context import RegistryContext
from kiln_registry.config import KilnConfig, check_startup_environment, load_config
from kiln_registry.credentials.redaction import install_redaction
from kiln_registry.db.engine import open_engine, session_factory, upgrade_to_head
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.probe.verify import StudentView

log = logging.getLogger("kiln_registry.server")


class JsonFormatter(logging.Formatter):
    """One JSON object per log line (``[server] log_format = "json"``)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(log_format: str, secret_env_names: frozenset[str], level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    install_redaction(secret_env_names)


def _database_path(path: Path) -> Path:
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    return path


def build_context(config: KilnConfig) -> RegistryContext:
    vocab_sha256, width = student_vocab(config.student.model_path)
    engine = open_engine(_database_path(config.server.database))
    revision = upgrade_to_head(engine)
    return RegistryContext(
        config=config,
        engine=engine,
        sessions=session_factory(engine),
        student=StudentView(tokenizer_vocab_sha256=vocab_sha256, model_width=width),
        database_revision=revision,
    )


def prepare(config_path: Path, *, host: str | None, port: int | None) -> KilnConfig:
    config = load_config(config_path)
    updates: dict[str, object] = {}
    if host is not None:
        updates["host"] = host
    if port is not None:
        updates["port"] = port
    if updates:
        server = type(config.server).model_validate({**config.server.model_dump(), **updates})
        config = config.model_copy(update={"server": server})
    check_startup_environment(config, os.environ)
    return config


def run_server(config_path: Path, *, host: str | None = None, port: int | None = None) -> None:
    import uvicorn

    from kiln_registry.api.app import create_app

    config = prepare(config_path, host=host, port=port)
    level = logging.DEBUG if os.environ.get("KILN_LOG_LEVEL") == "debug" else logging.INFO
    configure_logging(config.server.log_format, config.secret_env_names(), level)
    ctx = build_context(config)
    log.info(
        "kiln-registry serving on http://%s:%d (database %s at %s, student width %d)",
        config.server.host,
        config.server.port,
        config.server.database,
        ctx.database_revision,
        ctx.student.model_width,
    )
    uvicorn.run(
        create_app(ctx),
        host=config.server.host,
        port=config.server.port,
        log_config=None,
        timeout_graceful_shutdown=10,
    )
