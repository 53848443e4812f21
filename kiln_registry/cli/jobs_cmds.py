"""``kiln jobs ...`` and ``kiln cache ...`` (``kiln corpus verify`` is ``cli.corpus_cmds``).

``jobs submit|list|show|cancel|result`` talk to the registry (``--server URL``,
else ``$KILN_SERVER``, else ``http://127.0.0.1:8420``) through
``JobsClient``; ``show --follow`` redraws a progress bar while stdout is a
terminal and prints one line per change otherwise.  ``result`` streams the
corpus to stdout or, atomically, to ``--output``.  ``cache stats`` and
``cache prune --identity`` open the registry database named by ``--config``
(it must already be at the current schema revision; ``kiln serve`` migrates).

Failures are ``KilnError``s: ``kiln`` prints one line and exits 2.  Imports:
standard library, httpx, ``kiln_registry.client``/``config``/``db``/``errors``,
``api.jobs_schemas`` and ``jobs``; never FastAPI or torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import httpx

from kiln_registry.api.jobs_schemas import JOB_ID_PATTERN, JobPublic, JobsListResponse
from kiln_registry.cli.server_options import add_access_options, client_access
from kiln_registry.cli.teachers_cmds import printable, table
from kiln_registry.client import DEFAULT_SERVER, RegistryClient
from kiln_registry.errors import ConfigError, InputError

if TYPE_CHECKING:
    from kiln_registry.jobs.signing import PublicKey

SubParsers = Any  # argparse's _SubParsersAction is private
SERVER_ENV = "KILN_SERVER"
TERMINAL = ("succeeded", "failed", "cancelled")
BAR_WIDTH = 30
MAX_SEQUENCES_FILE = 64 << 20


class JobsClient(RegistryClient):
    """``RegistryClient`` plus the ``/v1/jobs`` operations."""

    def __enter__(self) -> JobsClient:
        return self

    def submit(self, body: dict[str, object]) -> JobPublic:
        return self._call("POST", "/v1/jobs", JobPublic, body=body)

    def list_jobs(self, *, status: str | None, limit: int) -> list[JobPublic]:
        query = f"?limit={limit}" + (f"&status={status}" if status else "")
        return self._call("GET", "/v1/jobs" + query, JobsListResponse).jobs

    def get_job(self, job_id: str) -> JobPublic:
        return self._call("GET", f"/v1/jobs/{_job_id(job_id)}", JobPublic)

    def cancel_job(self, job_id: str) -> JobPublic:
        return self._call("POST", f"/v1/jobs/{_job_id(job_id)}/cancel", JobPublic)

    def signing_keys(self) -> dict[str, PublicKey]:
        """The registry's corpus-signing public keys (``GET /v1/keys``), strictly parsed."""
        from kiln_registry.jobs.signing import parse_keys

        return parse_keys(self._request("GET", "/v1/keys", None), f"{self.base_url}/v1/keys")

    def download(self, job_id: str, sink: BinaryIO) -> int:
        """Stream the job's corpus into ``sink``; the bytes written."""
        path = f"/v1/jobs/{_job_id(job_id)}/result"
        written = 0
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code != 200:
                    raw = self._read(response)
                    raise self._refusal(response.status_code, raw, None)
                for chunk in response.iter_raw():
                    sink.write(chunk)
                    written += len(chunk)
        except httpx.HTTPError as exc:
            raise self._unreachable(f"failed ({type(exc).__name__})") from exc
        return written


def _job_id(value: str) -> str:
    if not re.fullmatch(JOB_ID_PATTERN, value):
        raise InputError(f"{value[:40]!r} is not a job id (job-<24 hex>)", rule="client.job_id")
    return value


def _client(args: argparse.Namespace) -> JobsClient:
    server = args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    return JobsClient(server, timeout=args.timeout, **client_access(args))


def _emit(job: JobPublic, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(job.model_dump_json(indent=2) + "\n")
    else:
        print(render_job(job))


def render_job(job: JobPublic) -> str:
    p, t = job.progress, job.timestamps
    pairs: list[tuple[str, object]] = [
        ("id", job.id), ("status", job.status), ("teacher", job.teacher),
        ("identity", job.identity_revision), ("top_k", job.top_k),
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
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {printable(v)}" for k, v in pairs)


def progress_line(job: JobPublic) -> str:
    total, done = job.progress.total, job.progress.done
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    return f"[{bar}] {done}/{total} {job.status} ({job.progress.cache_hits} cached)"


def _sequences_file(path: Path) -> list[object]:
    if not path.is_file() or path.stat().st_size > MAX_SEQUENCES_FILE:
        raise InputError(f"{path}: not a readable file of at most 64 MiB", rule="client.sequences")
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not JSON ({exc})", rule="client.sequences") from None
    if not isinstance(value, list):
        raise InputError(f"{path}: must hold a JSON array of arrays", rule="client.sequences")
    return value


def _submit(args: argparse.Namespace) -> int:
    body: dict[str, object] = {"kind": "teacher_scoring", "teacher": args.teacher,
                               "top_k": args.top_k}  # fmt: skip
    if args.corpus is not None:
        body["corpus"] = {"path": args.corpus}
    else:
        body["sequences"] = _sequences_file(args.sequences)
    with _client(args) as client:
        job = client.submit(body)
    if args.json:
        _emit(job, True)
    else:
        print(job.id)
    return 0


def _list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.list_jobs(status=args.status, limit=args.limit)
    if args.json:
        sys.stdout.write(JobsListResponse(jobs=jobs).model_dump_json(indent=2) + "\n")
        return 0
    rows = [(j.id, j.status, j.teacher, j.top_k, f"{j.progress.done}/{j.progress.total}",
             j.timestamps.created_at) for j in jobs]  # fmt: skip
    print(
        table(("id", "status", "teacher", "k", "progress", "created"), rows) if rows else "no jobs"
    )
    return 0


def _follow(client: JobsClient, job_id: str, interval: float) -> JobPublic:
    tty = sys.stdout.isatty()
    last = ""
    while True:
        job = client.get_job(job_id)
        line = progress_line(job)
        if tty:
            sys.stdout.write("\r" + line)
        elif line != last:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        last = line
        if job.status in TERMINAL:
            if tty:
                sys.stdout.write("\n")
            return job
        time.sleep(interval)


def _show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _follow(client, args.job_id, args.interval) if args.follow else None
        job = job or client.get_job(args.job_id)
    _emit(job, args.json)
    return 1 if args.follow and job.status != "succeeded" else 0


def _cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _emit(client.cancel_job(args.job_id), args.json)
    return 0


def _result(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.output is None:
            client.download(args.job_id, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return 0
        out: Path = args.output
        partial = out.with_name(f".{out.name}.partial")
        try:
            with partial.open("wb") as sink:
                size = client.download(args.job_id, sink)
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
    print(f"wrote {out} ({size} bytes)", file=sys.stderr)
    return 0


def _open_database(config_path: Path) -> Any:
    from kiln_registry.config import load_config
    from kiln_registry.db.engine import current_revision, head_revision, open_engine

    config = load_config(config_path)
    if not config.server.database.is_file():
        raise ConfigError(f"database {config.server.database} does not exist", rule="db.path")
    engine = open_engine(config.server.database)
    if current_revision(engine) != head_revision():
        engine.dispose()
        raise ConfigError(
            f"database {config.server.database} is not at the current schema revision",
            rule="db.revision",
            hint="start `kiln serve` once to migrate it",
        )
    return engine


def _cache_stats(args: argparse.Namespace) -> int:
    from kiln_registry.db.engine import session_factory
    from kiln_registry.db.repository import unit_of_work
    from kiln_registry.jobs import cache

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
    from kiln_registry.jobs import cache

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
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 3600] seconds")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in 1..1000")
    return int(text)


def _common() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--server",
        metavar="URL",
        help=f"registry URL (default: ${SERVER_ENV}, else {DEFAULT_SERVER})",
    )
    add_access_options(parent)
    parent.add_argument("--json", action="store_true", help="print one JSON document")
    parent.add_argument("--timeout", type=_seconds, default=60.0, help="seconds per request")
    return parent


def _register_jobs(sub: SubParsers) -> None:
    group = sub.add_parser("jobs", help="submit and follow teacher-scoring jobs").add_subparsers(
        dest="jobs_command", required=True, metavar="COMMAND"
    )
    common = _common()
    p = group.add_parser("submit", help="queue a teacher-scoring job", parents=[common])
    p.add_argument("--teacher", required=True, help="registered teacher alias")
    p.add_argument("--top-k", required=True, type=_positive, metavar="K")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", metavar="PATH", help="JSONL under the server's corpus_root")
    source.add_argument("--sequences", type=Path, metavar="FILE", help="JSON [[ids], ...]")
    p.set_defaults(func=_submit)
    p = group.add_parser("list", help="list jobs, newest first", parents=[common])
    p.add_argument("--status", choices=("queued", "probing", "running", *TERMINAL))
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
    p = group.add_parser("result", help="download a job's corpus", parents=[common])
    p.add_argument("job_id")
    p.add_argument("--output", type=Path, help="write here atomically (default: stdout)")
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
