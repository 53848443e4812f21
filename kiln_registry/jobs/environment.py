"""What job workers run on, built the same way for ``kiln serve`` and ``kiln worker``.

``outbound_client`` is the one configuration of the registry's outbound HTTP
client (the API's probes and the workers' scoring share it in ``kiln
serve``): no redirects, no proxy variables from the environment, TLS verified
against ``[server] teacher_ca_file`` or the system store.  ``student_view``
reads the student's vocabulary view (``tokenizers`` only, no torch).
``JOB_PROBES`` is the workers' own probe capacity.

``run_workers`` is the body of ``kiln worker``: the environment without the
API (TLS trust, outbound client, probe limiter, student), ``JobWorkers``
started on it, and on ``stop`` a clean stop (a job in progress goes back to
``queued``).  The caller opened the database (never upgraded here).

Imports: standard library, httpx, SQLAlchemy, ``kiln_registry.config``/
``model``/``probe`` and ``jobs``; never the API.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Final

import httpx
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.settings import KilnConfig
from kiln_registry.jobs.core.state import JobEnvironment
from kiln_registry.jobs.worker import JobWorkers
from kiln_registry.model.tokenizer import student_shape
from kiln_registry.probe.client import ProbeLimiter
from kiln_registry.probe.transport import teacher_tls_context
from kiln_registry.probe.verify import StudentView

log = logging.getLogger("kiln_registry.jobs")

JOB_PROBES: Final = 2


def outbound_client(
    tls: ssl.SSLContext, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        verify=tls,
        transport=transport,
        timeout=httpx.Timeout(10.0),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
    )


def student_view(model_path: Path) -> StudentView:
    """The student's vocabulary digest, model width and tokenizer size."""
    vocab_sha256, width, tokenizer_size = student_shape(model_path)
    return StudentView(
        tokenizer_vocab_sha256=vocab_sha256, model_width=width, tokenizer_size=tokenizer_size
    )


async def run_workers(
    config: KilnConfig,
    sessions: sessionmaker[Session],
    student: StudentView,
    stop: asyncio.Event,
) -> None:
    """``kiln worker``: run ``[jobs] workers`` claim loops until ``stop`` is set."""
    tls = teacher_tls_context(config.server.teacher_ca_file)
    async with outbound_client(tls) as http:
        env = JobEnvironment(
            config=config,
            sessions=sessions,
            http=http,
            teacher_tls=tls,
            student=student,
            probe_limiter=ProbeLimiter(JOB_PROBES),
        )
        workers = JobWorkers(env)
        await workers.start()
        try:
            await stop.wait()
        finally:
            log.info("job worker %s stopping", workers.worker_id)
            await workers.stop()
