"""``kiln worker``: the job workers as their own process, without the API.

Several ``kiln worker`` processes (and ``kiln serve`` with its embedded
workers) may share one database: a claim is a lease renewed by a heartbeat,
and a job whose holder stopped renewing is taken over by another worker
(``jobs.worker``).  The order is the fail-closed order of ``kiln serve``:
the configuration and every secret variable are checked first, logging is
configured with redaction, the student is read, then the database is opened
and must be exactly at this release's schema revision (this process never
migrates: ``kiln db upgrade`` or ``kiln serve --upgrade`` does).  SIGINT or
SIGTERM stops it cleanly: a job in progress goes back to ``queued``.

Heavy imports happen inside the command.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from kiln_registry.config.settings import KilnConfig
    from kiln_registry.probe.verify import StudentView

log = logging.getLogger("kiln_registry.cli.worker")


def _worker(args: argparse.Namespace) -> int:
    import os

    from kiln_registry.auth.serving import install_token_redaction
    from kiln_registry.config.loader import check_startup_environment, load_config
    from kiln_registry.db.engine import database_label, session_factory
    from kiln_registry.db.opening import open_database, require_head
    from kiln_registry.jobs.environment import student_view
    from kiln_registry.observability.logs import configure_logging

    config = load_config(args.config)
    check_startup_environment(config, os.environ)
    server = config.server
    configure_logging(server.log_format, config.secret_env_names(), server.log_level)
    install_token_redaction()
    student = student_view(config.student.model_path)
    engine = open_database(server, create=False)
    try:
        revision = require_head(engine)
        log.info("kiln worker on database %s at revision %s (%d worker(s), devices %s)",
                 database_label(engine), revision, config.jobs.workers,
                 ", ".join(config.jobs.devices))  # fmt: skip
        asyncio.run(_run(config, session_factory(engine), student))
    finally:
        engine.dispose()
    log.info("kiln worker stopped")
    return 0


async def _run(config: KilnConfig, sessions: sessionmaker[Session], student: StudentView) -> None:
    from kiln_registry.jobs.environment import run_workers

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await run_workers(config, sessions, student, stop)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = sub.add_parser(
        "worker",
        help="run the job workers without the API (several may share one database)",
        description="Claim and run queued jobs until SIGINT/SIGTERM. The database must be at"
        " this release's schema (run `kiln db upgrade --config kiln.toml` first).",
    )
    worker.add_argument("--config", type=Path, required=True, help="path to kiln.toml")
    worker.set_defaults(func=_worker)
