"""The one probing seam: resolve -> probe -> verify -> metrics -> scrubbed receipt.

Every caller that contacts a teacher to prove its identity (registration,
re-probe, local launch and relaunch, a job's start) goes through
``run_probes``:

* ``resolve_endpoint`` turns a URL and credential id into the completions
  URL and the secret handle (registrations and re-probes first check
  ``[server] teacher_hosts``); ``loopback_endpoint`` is a local teacher's.
* ``run_probes`` runs ``probe.client.probe_teacher`` under the caller's
  limiter and timeout (transport failures, an untrusted certificate among
  them, are mapped once, in ``probe.transport``), counts the outcome for
  ``/metrics``, decodes the identity once and checks it against the pinned
  one (``identity.document.same_identity``).
* SSRF read-back (issue 27): a probe that failed on the teacher's HTTP answer
  tells its caller only the rule, the probe and the HTTP status
  (``withhold_teacher_text``); whatever the answer said stays in the report,
  so in the receipt, and in the registry's log (secrets redacted).
* Receipts: ``receipt_of`` / ``failure_receipt`` scrub the report of the
  current value of every configured secret variable (the probe never puts a
  secret in a report; this is the second line, for a teacher that reflects
  what it was sent); ``Receipt.store`` writes one inside the caller's
  transaction.

The differences between the registry's and the job queue's probes are the
fields of ``ProbeSetup``.  Imports the credential, identity, probe and
database layers; never the API layer, the job queue or FastAPI.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy.orm import Session

from kiln_registry.config.settings import KilnConfig
from kiln_registry.credentials.origin import parse_teacher_url
from kiln_registry.credentials.redaction import redact_text
from kiln_registry.credentials.resolve import ResolvedTeacher, resolve_teacher_endpoint
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import IdentityMismatch, KilnError, ProbeBusy, ProbeFailed
from kiln_registry.identity.diff import mismatch_detail
from kiln_registry.identity.document import TeacherIdentity, same_identity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.probe.client import ProbeLimiter, probe_teacher
from kiln_registry.probe.report import ProbeReport, attached_report
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.host_rules import check_teacher_host, teacher_host_patterns

ProbeCounter = Callable[[str, float, str | None], None]
log = logging.getLogger("kiln_registry.probe")
# Messages the registry builds from nothing the teacher sent but a verified identity.
_FIXED_MESSAGE_RULES = frozenset(
    {"probe.timeout", "probe.unreachable", "probe.fingerprint_pinned", "probe.cap_not_enforced"}
)
WITHHELD_DETAIL = (
    "what it said is not shown to the caller; an admin finds it in the probe receipt "
    "or the registry's log"
)


@dataclass(frozen=True)
class ProbeSetup:
    """How one caller probes: client, student, limiter, timeout, metrics, receipt scrubbing.

    ``count_busy``: a full limiter is counted as a probe outcome (the registry;
    the job queue waits and retries instead).  ``mismatch_rule``: the rule of a
    probed identity that is not the pinned one.
    """

    http: httpx.AsyncClient = field(repr=False)
    student: StudentView | None
    limiter: ProbeLimiter
    timeout_s: float
    secret_names: frozenset[str] = field(repr=False)
    count: ProbeCounter | None = None
    count_busy: bool = True
    mismatch_rule: str = "probe.pinned_identity"


@dataclass(frozen=True)
class Receipt:
    """A probe report's stored form: passed or not, and the scrubbed report body."""

    passed: bool
    body: dict[str, Any]

    def store(self, session: Session, alias: str, identity_digest: str | None) -> None:
        """Add the receipt to ``alias`` inside the caller's transaction."""
        outcome = "passed" if self.passed else "failed"
        TeacherRepository(session).add_receipt(alias, outcome, identity_digest, self.body)


@dataclass(frozen=True)
class ProbeOutcome:
    """A passed probe: the report, the identity it proved, and its scrubbed receipt."""

    report: ProbeReport
    identity: TeacherIdentity
    receipt: Receipt


def resolve_endpoint(
    config: KilnConfig, url: str, credential_id: str | None, *, guard_hosts: bool = True
) -> ResolvedTeacher:
    """The endpoint and secret handle of a teacher URL (``teacher_hosts`` first, if guarded)."""
    if guard_hosts:
        origins = (credential.origin for credential in config.teachers.credentials.values())
        patterns = teacher_host_patterns(config.server.teacher_hosts, origins)
        check_teacher_host(url, patterns)  # before any probe (issue 15; default: issue 27)
    return resolve_teacher_endpoint(
        url,
        credential_id,
        credentials=config.teachers.credentials,
        server_host=config.server.host,
    )


def loopback_endpoint(url: str) -> ResolvedTeacher:
    """A local teacher's endpoint: the registry launched it, no credential."""
    return ResolvedTeacher(endpoint=parse_teacher_url(url), secret=None)


def _scrub(value: Any, names: frozenset[str]) -> Any:
    if isinstance(value, str):
        return redact_text(value, names)
    if isinstance(value, dict):
        return {key: _scrub(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrub(item, names) for item in value]
    return value


def scrubbed_report(report: ProbeReport, secret_names: frozenset[str]) -> dict[str, Any]:
    """The report's receipt form with every current secret value redacted."""
    scrubbed: dict[str, Any] = _scrub(report.to_dict(), secret_names)
    return scrubbed


def receipt_of(report: ProbeReport, secret_names: frozenset[str], **extra: Any) -> Receipt:
    """The scrubbed receipt of ``report``, with ``extra`` keys (a job's id) added."""
    body = scrubbed_report(report, secret_names)
    return Receipt(passed=report.passed, body={**body, **extra} if extra else body)


def failure_receipt(
    exc: BaseException, secret_names: frozenset[str], **extra: Any
) -> Receipt | None:
    """The scrubbed receipt of the report a failed probe attached, if any."""
    report = attached_report(exc)
    return None if report is None else receipt_of(report, secret_names, **extra)


def withhold_teacher_text(exc: KilnError, secret_names: frozenset[str]) -> None:
    """Replace a failed probe's message with its rule and status when the teacher answered.

    The teacher may be any service a caller named: its error text, or what a 200
    failed on, would read that service back to the caller.  The report attached
    to ``exc`` (and so the receipt) keeps the full message; the log gets it too.
    """
    report = attached_report(exc)
    answered = [a for a in report.attempts if a.status_code is not None] if report else []
    fixed = exc.rule in _FIXED_MESSAGE_RULES
    if report is None or not answered or not isinstance(exc, ProbeFailed) or fixed:
        return
    last = answered[-1]
    log.warning("teacher probe of %s failed: %s", report.url, redact_text(str(exc), secret_names))
    exc.message = (
        f"{last.purpose} probe (K={last.k}): the teacher answered HTTP {last.status_code}; "
        f"{WITHHELD_DETAIL}"
    )
    exc.args = (exc.message,)


def _count(setup: ProbeSetup, outcome: str, started: float, rule: str | None = None) -> None:
    if setup.count is not None:
        setup.count(outcome, time.monotonic() - started, rule)


def _proved_identity(
    setup: ProbeSetup, report: ProbeReport, pinned: TeacherIdentity | None
) -> TeacherIdentity:
    if not report.passed or report.fingerprint is None:
        raise ProbeFailed("the probe passed without an identity", rule="probe.internal")
    found = verify_fingerprint(report.fingerprint)
    if pinned is not None and not same_identity(found, pinned):
        raise IdentityMismatch(
            f"the probed identity {found.revision()} is not the pinned {pinned.revision()};"
            f" {mismatch_detail(pinned, found)}",
            rule=setup.mismatch_rule,
        )
    return found


async def run_probes(
    setup: ProbeSetup,
    resolved: ResolvedTeacher,
    model_id: str,
    pinned: TeacherIdentity | None,
    **receipt_extra: Any,
) -> ProbeOutcome:
    """Both probes and the cap probe; the proved identity and the scrubbed receipt.

    Failures raise the probe's ``KilnError`` (its report attached; see
    ``failure_receipt``); a full limiter raises ``ProbeBusy``.
    """
    started = time.monotonic()
    try:
        report = await probe_teacher(
            setup.http,
            completions_url=resolved.endpoint.completions_url,
            model_id=model_id,
            student=setup.student,
            pinned=pinned,
            secret=resolved.secret,
            timeout_s=setup.timeout_s,
            limiter=setup.limiter,
        )
    except ProbeBusy as exc:
        if setup.count_busy:
            _count(setup, exc.code, started, exc.rule)
        raise
    except KilnError as exc:
        _count(setup, exc.code, started, exc.rule)
        withhold_teacher_text(exc, setup.secret_names)
        raise
    _count(setup, "passed", started)
    identity = _proved_identity(setup, report, pinned)
    return ProbeOutcome(report, identity, receipt_of(report, setup.secret_names, **receipt_extra))


def registry_setup(ctx: TeacherServices) -> ProbeSetup:
    """The registry's probes (registration, re-probe, local launch): its limiter and metrics."""
    return ProbeSetup(
        http=ctx.client(),
        student=ctx.student,
        limiter=ctx.probe_limiter,
        timeout_s=ctx.config.server.probe_timeout_s,
        secret_names=ctx.config.secret_env_names(),
        count=ctx.metrics.count_probe,
    )
