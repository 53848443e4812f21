"""``kiln jobs ...`` and ``kiln cache ...`` (``kiln corpus verify`` is ``cli.corpus_cmds``).

``jobs submit|list|show|cancel|delete|result`` (``submit``: ``cli.jobs_submit``) talk to
the registry (``--server URL``,
else ``$KILN_SERVER``, else ``http://127.0.0.1:8420``) through
``RegistryClient``; ``show --follow`` waits with ``wait_job`` and draws a
progress bar (``observability.progress``) while stderr is a terminal, nothing
otherwise; the job is printed when it ends.
``result`` downloads the corpus with ``download_result``: verified against
the registry's signing key, then renamed into ``--output`` (its parent
directories created) or copied to stdout.  ``cache stats`` and
``cache prune --identity`` open the registry database named by ``--config``
(it must already be at the current schema revision; ``kiln serve`` migrates).

Failures are ``KilnError``s: ``kiln`` prints one line and exits 2.  Imports:
standard library, ``kiln_registry.client.sync``/``config``/``db``/``domain``,
``cli.server_options``, ``wire.jobs`` and ``jobs``; never FastAPI or torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from kiln_registry.cli.jobs_submit import register_submit
from kiln_registry.cli.server_options import (
    MAX_TIMEOUT_SECONDS,
    number,
    registry_client,
    server_options,
)
from kiln_registry.cli.teachers_cmds import printable, table
from kiln_registry.client.sync import RegistryClient
from kiln_registry.domain.vocabulary import JobStatus
from kiln_registry.observability.progress import ProgressBar
from kiln_registry.wire.jobs import JobPublic, JobsListResponse

SubParsers = Any  # argparse's _SubParsersAction is private


# The registry client covers the job routes (kept under this name for older imports).
JobsClient = RegistryClient


def _emit(job: JobPublic, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(job.model_dump_json(indent=2) + "\n")
    else:
        print(render_job(job))


def render_job(job: JobPublic) -> str:
    p, t = job.progress, job.timestamps
    pairs: list[tuple[str, object]] = [
        ("id", job.id), ("kind", job.kind), ("status", job.status), ("teacher", job.teacher),
        ("identity", job.identity_revision), ("top_k", job.top_k),
        *_generation_pairs(job),
        ("source", job.source.path or job.source.kind), ("device", job.device),
        ("progress", f"{p.done}/{p.total} ({p.cache_hits} from the cache, {p.requests} requests,"
                     f" {p.retries} retries)"),
        ("created", t.created_at), ("spec checked", t.spec_checked_at), ("probed", t.probed_at),
        ("leased", t.leased_at), ("scoring", t.scoring_started_at), ("finished", t.finished_at),
    ]  # fmt: skip
    if job.error is not None:
        pairs.append(("error", f"{job.error.code} {job.error.rule or ''} {job.error.message}"))
    if job.result is not None:
        pairs.append(("result", f"{job.result.bytes} bytes, sha256 {job.result.sha256}"))
    if job.waiting is not None:  # queued and no live job worker (issue 30, item 6)
        pairs.append(("waiting", job.waiting))
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {printable(v)}" for k, v in pairs)


def _generation_pairs(job: JobPublic) -> list[tuple[str, object]]:
    g = job.generation
    if g is None:
        return []
    seed = "none" if g.seed is None else g.seed
    pairs: list[tuple[str, object]] = [
        ("settings", f"max_tokens {g.max_tokens}, temperature {g.temperature}, top_p {g.top_p},"
                     f" seed {seed}"),
    ]  # fmt: skip
    if g.kiln_note is not None:
        pairs.append(("kiln note", g.kiln_note))
    return pairs


def _list(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        jobs = client.list_jobs(status=args.status, limit=args.limit)
    if args.json:
        sys.stdout.write(JobsListResponse(jobs=jobs).model_dump_json(indent=2) + "\n")
        return 0
    rows = [(j.id, j.kind, j.status, j.teacher, j.top_k,
             f"{j.progress.done}/{j.progress.total}", j.timestamps.created_at)
            for j in jobs]  # fmt: skip
    header = ("id", "kind", "status", "teacher", "k", "progress", "created")
    print(table(header, rows) if rows else "no jobs")
    return 0


def _follow(client: RegistryClient, job_id: str, interval: float) -> JobPublic:
    with ProgressBar(f"job {job_id}", unit="seq") as bar:

        def show(job: JobPublic) -> None:
            status = f"{job.status}, {job.progress.cache_hits} cached"
            bar.update_to(job.progress.done, job.progress.total, status)

        return client.wait_job(job_id, interval=interval, on_progress=show)


def _show(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        job = _follow(client, args.job_id, args.interval) if args.follow else None
        job = job or client.get_job(args.job_id)
    _emit(job, args.json)
    return 1 if args.follow and job.status != JobStatus.succeeded else 0


def _cancel(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        _emit(client.cancel_job(args.job_id), args.json)
    return 0


def _delete(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        done = client.delete_job(args.job_id)
    if args.json:
        sys.stdout.write(done.model_dump_json(indent=2) + "\n")
    else:
        print(f"deleted {done.id} (its sequences and result file)")
    return 0


def _result(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        if args.output is not None:
            done = client.download_result(args.job_id, args.output)
            print(f"wrote {done.path} ({done.bytes} bytes, verified)", file=sys.stderr)
            return 0
        # stdout: the corpus is verified in a private temporary file before any byte is written.
        with tempfile.TemporaryDirectory(prefix="kiln-result-") as tmp:
            done = client.download_result(args.job_id, Path(tmp) / "corpus.jsonl")
            with done.path.open("rb") as corpus:
                shutil.copyfileobj(corpus, sys.stdout.buffer, 1 << 20)
    sys.stdout.buffer.flush()
    return 0


def _open_database(config_path: Path) -> Any:
    from kiln_registry.config.loader import load_config
    from kiln_registry.db.opening import open_database, require_head

    engine = open_database(load_config(config_path).server, create=False)
    try:
        require_head(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _cache_stats(args: argparse.Namespace) -> int:
    from kiln_registry.db.engine import session_factory
    from kiln_registry.db.repository import unit_of_work
    from kiln_registry.jobs.scoring import cache

    engine = _open_database(args.config)
    try:
        with unit_of_work(session_factory(engine)) as session:
            stats = cache.stats(session)
    finally:
        engine.dispose()
    if args.json:
        doc = [{"identity_digest": s.identity_digest, "top_k": s.top_k, "rows": s.rows,
                "bytes": s.bytes} for s in stats]  # fmt: skip
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    rows = [(s.identity_digest, s.top_k, s.rows, s.bytes) for s in stats]
    total = f"total: {sum(s.rows for s in stats)} rows, {sum(s.bytes for s in stats)} bytes"
    print(table(("identity", "k", "rows", "bytes"), rows) + "\n" + total if rows else total)
    return 0


def _cache_prune(args: argparse.Namespace) -> int:
    from kiln_registry.db.engine import session_factory
    from kiln_registry.db.repository import unit_of_work
    from kiln_registry.jobs.scoring import cache

    digest = cache.check_identity_digest(args.identity)
    engine = _open_database(args.config)
    try:
        with unit_of_work(session_factory(engine)) as session:
            removed = cache.prune(session, digest)
    finally:
        engine.dispose()
    print(f"removed {removed} cached rows of identity sha256:{digest}")
    return 0


def _seconds(text: str) -> float:
    value = number(text)
    if not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 3600] seconds")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in 1..1000")
    return int(text)


def _common() -> argparse.ArgumentParser:
    return server_options(timeout_type=_seconds)


def _register_jobs(sub: SubParsers) -> None:
    group = sub.add_parser(
        "jobs", help="submit and follow teacher-scoring and generation jobs"
    ).add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")
    common = _common()
    register_submit(group, common)
    p = group.add_parser("list", help="list jobs, newest first", parents=[common])
    p.add_argument("--status", choices=[status.value for status in JobStatus])
    p.add_argument("--limit", type=_positive, default=50)
    p.set_defaults(func=_list)
    p = group.add_parser("show", help="show a job (--follow: until it ends)", parents=[common])
    p.add_argument("job_id")
    p.add_argument("--follow", action="store_true", help="poll with a progress bar until done")
    p.add_argument("--interval", type=_seconds, default=0.5, help="seconds between polls")
    p.set_defaults(func=_show)
    p = group.add_parser("cancel", help="cancel a queued or running job", parents=[common])
    p.add_argument("job_id")
    p.set_defaults(func=_cancel)
    p = group.add_parser(
        "delete", help="delete a finished job and its result (cancel it first)", parents=[common]
    )
    p.add_argument("job_id")
    p.set_defaults(func=_delete)
    p = group.add_parser("result", help="download a job's corpus", parents=[common])
    p.add_argument("job_id")
    p.add_argument(
        "--output", "-o", type=Path, help="write here, verified, atomically (default: stdout)"
    )
    p.set_defaults(func=_result)


def register(sub: SubParsers) -> None:
    _register_jobs(sub)
    group = sub.add_parser("cache", help="the teacher score cache").add_subparsers(
        dest="cache_command", required=True, metavar="COMMAND"
    )
    p = group.add_parser("stats", help="rows and bytes per identity and K")
    p.add_argument("--config", type=Path, required=True, help="path to kiln.toml")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cache_stats)
    p = group.add_parser("prune", help="delete every cached score of one identity")
    p.add_argument("--config", type=Path, required=True, help="path to kiln.toml")
    p.add_argument("--identity", required=True, help="identity digest or sha256:<digest>")
    p.set_defaults(func=_cache_prune)
